"""summary.json of a stage run: what the UI, the CLI, metrics and the trigger event read of its controller.

Built from the scheduler's state, the targets' last observation and the hybrid inputs; O(subtasks),
so the controller rebuilds it only when something changed (``control/controller.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from airflow_provider_speculative.control.hybrid import HybridInputWatcher
from airflow_provider_speculative.core.scheduler import StageScheduler
from airflow_provider_speculative.core.slots import TargetView
from airflow_provider_speculative.core.states import Attempt, current_attempt
from airflow_provider_speculative.core.summary import StageSummary


def stage_summary(plan: Mapping[str, Any], sched: StageScheduler, views: Mapping[str, TargetView],
                  hybrid: HybridInputWatcher | None, now: float) -> StageSummary:
    """Metrics and speculation status of one stage run at ``now``."""
    baseline = sched.baseline
    summary: StageSummary = {
        "stage": plan["stage"], "parallelism": plan["parallelism"],
        "speculation": sched.speculation_status,
        "numSlowExecutionVertices": len(sched.slow_subtasks),
        "peakSlowExecutionVertices": sched.peak_slow,
        "numEffectiveSpeculativeExecutions": sched.effective_speculative_executions(),
        "baseline_seconds": baseline.seconds if baseline else None,
        "baseline_seconds_per_byte": baseline.per_byte if baseline else None,
        # Where the baseline came from (run: N·R finished; early: fewer) and its lower bound's origin.
        "baseline_source": baseline.source if baseline else None,
        "baseline_floor_seconds": baseline.floor if baseline else None,
        "baseline_floor_source": baseline.floor_source if baseline else None,
        "blocked_nodes": sched.blocklist.active(now),
        "admitted": {str(k): v for k, v in sorted(sched.admitted.items())},
        "reused": sorted(sched.reused),
        "attempts": len(sched.all_attempts()),
        "speculative_attempts": sum(a.speculative for a in sched.all_attempts()),
        "attempt_seconds": round(sum(attempt_seconds(a, now) for a in sched.all_attempts()), 3),
        "current": {str(s): (c.number if (c := current_attempt(list(sched.attempts[s].values()))) else None)
                    for s in range(plan["parallelism"])},
        "slots": {name: view.to_json() for name, view in sorted(views.items())},
        "slot_status": sched.slot_status(now),
        "lost_nodes": dict(sorted(sched.lost_nodes.items())),
        "target_lost_attempts": len(sched.target_lost),
        # Speed-aware placement (core/speed.py): each target's slowness and where it came from.
        "target_speeds": ({t: {"slowness": round(f, 2), "source": sched.speeds.source.get(t, "run")}
                           for t, f in sorted(sched.speeds.slowness.items())} if sched.speeds else {}),
        "held_subtasks": len(sched.held_back),
        "updated_at": now,
    }
    summary.update(hybrid_summary(sched, hybrid))
    return summary


def hybrid_summary(sched: StageScheduler, hybrid: HybridInputWatcher | None) -> StageSummary:
    """Hybrid inputs: admitted producer partitions per producer, and what waiting subtasks wait for."""
    if hybrid is None:
        return {}
    waiting = sorted(sched.input_blocked)
    return {"hybrid_inputs": {stage: {"admitted": len(p.admitted), "parallelism": p.parallelism,
                                      "committed": p.committed}
                              for stage, p in hybrid.producers.items()},
            "waiting_for_inputs": len(waiting),
            # The first few in words; the count says how many in all (summary stays small).
            "input_waits": {str(s): sched.input_wait(s) for s in waiting[:20]}}


def attempt_seconds(attempt: Attempt, now: float) -> float:
    """Seconds an attempt ran (from DEPLOYING to its end, or to ``now`` while it runs)."""
    if attempt.deploying_at is None:
        return 0.0
    end = attempt.end_at if attempt.end_at is not None else now
    return max(0.0, end - attempt.deploying_at)
