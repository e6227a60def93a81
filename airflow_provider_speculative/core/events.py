"""The journal's event names: one enum shared by every writer of ``journal.jsonl`` and every reader.

The values are what ``journal.jsonl`` holds in its ``event`` field; journals already in stores are
read with these names, so a value never changes (a new event gets a new member).
"""

from __future__ import annotations

from enum import StrEnum


class Event(StrEnum):
    """One kind of line in a stage run's ``journal.jsonl``."""

    # The controller: restart, speed check, the scheduler's actions and their outcomes.
    RESTORED = "restored"
    SPEED_CHECK = "speed_check"
    LAUNCH = "launch"
    LAUNCH_FAILED = "launch_failed"
    SLOT_LOST = "slot_lost"
    SLOT_RECLAIMED = "slot_reclaimed"
    CLAIM_LOST = "claim_lost"
    ADMIT = "admit"
    ADMIT_LOST = "admit_lost"
    CANCEL = "cancel"
    DISCARD = "discard"
    BLOCK_NODE = "block_node"
    INVALIDATE = "invalidate"
    RECOVER_PARTITION = "recover_partition"
    INPUT_RESTORED = "input_restored"
    STAGE_FAILED = "stage_failed"
    STAGE_COMPLETE = "stage_complete"
    KILLED_ALL = "killed_all"
    SINK_STAGING_REMOVED = "sink_staging_removed"
    SINK_STAGING_CLEANUP_FAILED = "sink_staging_cleanup_failed"
    # Partition recovery (FLIP-1) of a producer's subtask.
    RECOVERY_LAUNCH = "recovery_launch"
    RECOVERY_FAILED = "recovery_failed"
    RECOVERED = "recovered"
    # Planning and the start trigger.
    PLAN_DECIDED = "plan_decided"
    PLAN_WARNING = "plan_warning"
    INPUTS_COMMITTED = "inputs_committed"
    # Finalize-on-master and the asset events of a commit.
    FINALIZE_STARTED = "finalize_started"
    FINALIZE_DONE = "finalize_done"
    ASSET_EVENT_RECORDED = "asset_event_recorded"
    # Spark Connect cancels that could not reach their server.
    CONNECT_SERVER_GONE = "connect_server_gone"
    CONNECT_UNREACHABLE = "connect_unreachable"
    CONNECT_CANCEL_GAVE_UP = "connect_cancel_gave_up"
    # Reruns and gc.
    RERUN_INVALIDATED = "rerun_invalidated"
    GC = "gc"


# Events every healthy stage writes; the others are worth showing (blocks, cancels, restarts...).
ROUTINE_EVENTS: frozenset[Event] = frozenset({Event.LAUNCH, Event.ADMIT})

# Events of a producer that can change which of its attempts is admitted (hybrid consumers watch them).
ADMISSION_EVENTS: frozenset[Event] = frozenset(
    {Event.ADMIT, Event.ADMIT_LOST, Event.INVALIDATE, Event.RECOVERED, Event.DISCARD}
)


def is_routine(event: object) -> bool:
    """Whether a journal line's ``event`` value is a routine event (any value, as a hostile journal may hold)."""
    return isinstance(event, str) and event in ROUTINE_EVENTS
