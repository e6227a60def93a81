"""The names stores, journals and trigger events already hold: the enums must keep every value as it is."""

from __future__ import annotations

import json

from airflow_provider_speculative.core.events import ADMISSION_EVENTS, ROUTINE_EVENTS, Event, is_routine
from airflow_provider_speculative.core.states import (
    FINISHED_RUN_STATES,
    LIVE,
    LIVE_PHASES,
    TERMINAL,
    HeartbeatPhase,
    TaskState,
)
from airflow_provider_speculative.core.trigger_events import DECIDED, TriggerStatus

# What journals in existing stores contain: a renamed value would make their lines unreadable.
JOURNAL_EVENTS = {
    "restored", "speed_check", "launch", "launch_failed", "slot_lost", "slot_reclaimed", "claim_lost", "admit",
    "admit_lost", "cancel", "discard", "block_node", "invalidate", "recover_partition", "input_restored",
    "stage_failed", "stage_complete", "killed_all", "sink_staging_removed", "sink_staging_cleanup_failed",
    "recovery_launch", "recovery_failed", "recovered", "plan_decided", "plan_warning", "inputs_committed",
    "finalize_started", "finalize_done", "asset_event_recorded", "connect_server_gone", "connect_unreachable",
    "connect_cancel_gave_up", "rerun_invalidated", "gc",
}
TRIGGER_STATUSES = {"success", "failed", "committed", "commit_failed", "plan_failed", "upstream_failed",
                    "upstream_skipped", "ready", "waiting", "timeout", "error", "timed_out"}
TASK_STATES = {"planning", "waiting", "deferred", "skipped", "failed", "killed", "committed"}


def test_journal_event_values_are_the_stored_names() -> None:
    assert {e.value for e in Event} == JOURNAL_EVENTS
    assert {e.value for e in ROUTINE_EVENTS} == {"launch", "admit"}
    assert {e.value for e in ADMISSION_EVENTS} == {"admit", "admit_lost", "invalidate", "recovered", "discard"}


def test_enum_members_serialize_as_their_plain_values() -> None:
    line = json.dumps({"event": Event.STAGE_FAILED, "status": TriggerStatus.COMMIT_FAILED,
                       "state": TaskState.COMMITTED})
    assert line == '{"event": "stage_failed", "status": "commit_failed", "state": "committed"}'
    # Readers get plain strings back from JSON and compare them with the members.
    assert json.loads(line)["event"] == Event.STAGE_FAILED


def test_is_routine_takes_any_json_value() -> None:
    assert is_routine("launch") and is_routine(Event.ADMIT)
    assert not is_routine("stage_failed")
    # A hostile journal line may hold a list or an object where the event name belongs.
    assert not is_routine(["launch"]) and not is_routine({"a": 1}) and not is_routine(None)


def test_trigger_statuses_and_task_states_are_the_stored_names() -> None:
    assert {s.value for s in TriggerStatus} == TRIGGER_STATUSES
    assert set(DECIDED) == {"success", "failed"}
    # A malformed event's status may be unhashable; checking it against DECIDED must not raise.
    assert ["success"] not in DECIDED
    assert {s.value for s in TaskState} == TASK_STATES


def test_state_sets_hold_the_plain_names_readers_compare() -> None:
    assert {"CREATED", "SCHEDULED", "DEPLOYING", "INITIALIZING", "RUNNING", "CANCELING"} == set(LIVE)
    assert {"FINISHED", "FAILED", "CANCELED"} == set(TERMINAL)
    assert "RUNNING" in LIVE and "FINISHED" in TERMINAL
    assert {"success", "failed"} == FINISHED_RUN_STATES


def test_heartbeat_phases_are_the_stored_names() -> None:
    # Supervisors of an older or newer provider read the same heartbeat.json: the stored names are a contract.
    assert {p.value for p in HeartbeatPhase} == {"RUNNING", "WAITING_FOR_INPUT", "BARRIER", "FINISHED", "FAILED"}
    assert {"RUNNING", "WAITING_FOR_INPUT", "BARRIER"} == set(LIVE_PHASES)
    assert json.loads(json.dumps({"phase": HeartbeatPhase.BARRIER})) == {"phase": "BARRIER"}
