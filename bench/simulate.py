"""Benchmark (issue 43): speculation policies compared on simulated traces, around the real scheduler core.

Every decision comes from ``StageScheduler`` (airflow_provider_speculative/devtools/simulator.py); this
script only builds the traces, runs each policy on the same trace, and prints markdown tables:

- **policies**: makespan / no-slow-node ideal (the same trace with every node at full speed and no
  speculation), extra attempt-seconds against no speculation on the same trace, wasted attempt-seconds
  (attempts not kept) in % of no speculation's attempt-seconds, copies launched (won);
- **calibration**: the slow-node benchmark's setups (bench/slow_node.py: 2 Connect servers of one core
  and 2 slots, one at 1/4 or 1/8 core) against the medians measured there (bench/README.md), each server
  with a core of its own and both on one shared 2-core host;
- **pool**: the real 2-server pool's regression of the earlier tail-copy rule mirrored, and a sweep of
  two-server pools, each with and without last-wave planning (``plan_last_wave``);
- **scale**: how far a 1,000-node x 10,000-subtask stage (``--scale-sizes``) gets in ``--scale-budget`` wall
  seconds per policy.

    .venv/bin/python bench/simulate.py                       # everything (about 3 minutes on a quiet core)
    .venv/bin/python bench/simulate.py --only policies --scenarios slow10-q
    .venv/bin/python bench/simulate.py --only calibration
    .venv/bin/python bench/simulate.py --only pool          # the 2-server regression, planned or not
    .venv/bin/python bench/simulate.py --only scale --scale-budget 60
    .venv/bin/python bench/simulate.py --only scale --scale-sizes 100x1000,1000x10000
    .venv/bin/python bench/simulate.py --set plan_last_wave=false   # every policy without last-wave planning
"""

from __future__ import annotations

import argparse
import math
import random
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from airflow_provider_speculative.devtools.simulator import (
    POLICIES,
    HostSpec,
    NodeLoss,
    NodeSpec,
    RunResult,
    Scenario,
    Simulator,
    StageSpec,
    check_overrides,
    cluster,
    lognormal_work,
    pareto_work,
    simulate,
    skewed,
    slow_spells,
)

NODES = 100
SLOTS = 2
SUBTASKS = 400
WORK = 30.0
STARTUP = 1.0
# ``--set name=value``: [speculative] options applied to every policy's runs (after the policy's own options).
OVERRIDES: dict[str, object] = {}


def run(scenario: Scenario, policy: str) -> RunResult:
    """``simulate`` with the ``--set`` options."""
    return simulate(scenario, policy, overrides=OVERRIDES or None)


def _base(rng: random.Random, nodes: int = NODES, subtasks: int = SUBTASKS) -> tuple[tuple[NodeSpec, ...], StageSpec]:
    all_nodes = cluster(nodes, slots=SLOTS)
    work = skewed(lognormal_work(subtasks, rng, WORK, 0.3), rng, share=0.05, factor=2.0)
    return all_nodes, StageSpec("stage", work)


def scenarios(seed: int) -> dict[str, Callable[[], Scenario]]:
    """The named traces (each built from ``seed``, so every policy sees the same one)."""

    def slow(share: float, factor: float, start: float = 0.0, end: float = math.inf) -> Callable[[], Scenario]:
        def build() -> Scenario:
            rng = random.Random(seed)
            nodes, stage = _base(rng)
            spells = slow_spells(nodes, share, factor, rng, start, end)
            return Scenario(f"{NODES} nodes, {share:.0%} at 1/{round(1 / factor)}"
                            + (f" from {start:g} to {end:g} s" if start or end < math.inf else ""),
                            nodes, (stage,), startup=STARTUP, spells=spells)
        return build

    def heavy() -> Scenario:
        rng = random.Random(seed)
        nodes = cluster(NODES, slots=SLOTS)
        return Scenario(f"{NODES} nodes, heavy tail (Pareto 1.9 on 10 %), no slow node", nodes,
                        (StageSpec("stage", pareto_work(SUBTASKS, rng, WORK)),), startup=STARTUP)

    def loss() -> Scenario:
        rng = random.Random(seed)
        nodes, stage = _base(rng)
        lost = tuple(NodeLoss(n.name, 20.0) for n in rng.sample(list(nodes), 5))
        return Scenario(f"{NODES} nodes, 5 lost at 20 s", nodes, (stage,), startup=STARTUP, losses=lost)

    def late() -> Scenario:
        # LATE §5.1: hosts shared by 1-7 VMs, so a VM's speed varies; here speeds drawn from 1, 1/2, 1/3, 1/5.
        rng = random.Random(seed)
        nodes, stage = _base(rng)
        speeds = [1.0] * 50 + [0.5] * 25 + [1 / 3] * 15 + [0.2] * 10
        rng.shuffle(speeds)
        hetero = tuple(replace(n, speed=s) for n, s in zip(nodes, speeds, strict=True))
        return Scenario(f"{NODES} nodes, LATE-style heterogeneous speeds", hetero, (stage,), startup=STARTUP)

    def two_stages() -> Scenario:
        rng = random.Random(seed)
        nodes, stage = _base(rng)
        second = StageSpec("second", lognormal_work(100, rng, WORK, 0.3))
        spells = slow_spells(nodes, 0.1, 0.25, rng)
        return Scenario(f"{NODES} nodes, 10 % at 1/4, two stages (400 then 100)", nodes, (stage, second),
                        startup=STARTUP, spells=spells)

    return {
        "slow10-q": slow(0.10, 0.25),
        "slow5-h": slow(0.05, 0.5),
        "slow10-e": slow(0.10, 0.125),
        "slow20-q": slow(0.20, 0.25),
        "slow20-e": slow(0.20, 0.125),
        "spell": slow(0.10, 0.25, 15.0, 60.0),
        "heavy": heavy,
        "loss": loss,
        "late": late,
        "two-stages": two_stages,
    }


def policy_rows(names: list[str], seed: int, policies: list[str]) -> list[str]:
    """One row per scenario and policy."""
    rows = ["| scenario | policy | makespan / ideal | extra att-s vs none | wasted att-s | copies (won) |",
            "|---|---|---|---|---|---|"]
    builders = scenarios(seed)
    for name in names:
        scenario = builders[name]()
        ideal = run(scenario.healthy(), "none").makespan
        results: dict[str, RunResult] = {p: run(scenario, p) for p in policies}
        plain = results.get("none") or run(scenario, "none")
        for policy, result in results.items():
            extra = 100.0 * (result.attempt_seconds - plain.attempt_seconds) / plain.attempt_seconds
            wasted = 100.0 * result.wasted_seconds / plain.attempt_seconds
            rows.append(f"| {scenario.name} | {policy} | {result.makespan / ideal:.2f} | {extra:+.1f} % | "
                        f"{wasted:.1f} % | {result.copies} ({result.copies_won}) |"
                        + (f" FAILED: {result.failed} |" if result.failed else ""))
        print(f"  {name}: done", file=sys.stderr, flush=True)
    return rows


# -- calibration against bench/slow_node.py ---------------------------------------------------------

# Medians of the last full slow_node.py run in bench/README.md (2026-11-26, slow-node-20261126-151150).
MEASURED = {
    ("q1", None): 12.75, ("q1", 0.25): 14.35, ("q1", 0.125): 15.7,
    ("q3", None): 14.7, ("q3", 0.25): 19.75, ("q3", 0.125): 22.55,
}
MEASURED_B = {("q1", 0.25): 13.5, ("q1", 0.125): 25.05, ("q3", 0.25): 18.8, ("q3", 0.125): 22.4}
# Row a1 (one of the two servers only, speculation on) of the same run.
MEASURED_A1 = {"q1": 13.0, "q3": 16.2}
# Q1's scan attempt alone on a warm local[1] server: 1.45 s; start-up on a warm server 0.19-0.35 s.
SCAN_WORK = 1.45
# Q1's aggregate reads 8 small partial aggregates: assumed 0.5 s of work per subtask.
AGG_WORK = 0.5
CAL_STARTUP = 0.25
CHECK_WORK = 0.15
# Q3's stages, run one after the other here (the real run overlaps the three scans): subtasks, work in
# units of Q1's scan attempt (assumed).
Q3 = (("scan_customer", 2, 0.7), ("scan_orders", 4, 1.0), ("scan_lineitem", 8, 1.0),
      ("join_orders", 2, 1.0), ("join_lineitem", 4, 1.0), ("top", 1, 0.3))
# The benchmark's host: both servers, their Connect clients, the controller and the runner on 2 cores.
HOST_CORES = 2.0


def pool(share: float | None, background: float | None = None, single: bool = False) -> tuple[NodeSpec, ...]:
    """Two one-core Connect servers with 2 slots each; ``local-b`` at ``share`` of its core.

    ``background`` (cores the host's other processes take) puts both on one host of :data:`HOST_CORES`
    cores; None gives each server a core of its own. ``single``: ``local-a`` alone (row a1).
    """
    host = None if background is None else "host"
    nodes = (NodeSpec("local-a", slots=2, cores=1.0, host=host),
             NodeSpec("local-b", slots=2, cores=1.0, speed=share if share is not None else 1.0, host=host))
    return nodes[:1] if single else nodes


def query(name: str, gap: float, share: float | None, background: float | None = None, scale: float = 1.0,
          single: bool = False) -> Scenario:
    """Q1 (scan 8 -> aggregate 2) or Q3 (six stages) on the pool, ``gap`` s between stages, work times ``scale``."""
    if name == "q1":
        stages: tuple[StageSpec, ...] = (StageSpec("scan", (SCAN_WORK * scale,) * 8),
                                         StageSpec("aggregate", (AGG_WORK * scale,) * 2))
    else:
        stages = tuple(StageSpec(s, (SCAN_WORK * w * scale,) * n) for s, n, w in Q3)
    hosts = () if background is None else (HostSpec("host", HOST_CORES, background),)
    return Scenario(f"{name} share {share}", pool(share, background, single), stages, startup=CAL_STARTUP,
                    speed_check=CHECK_WORK, stage_gap=gap, hosts=hosts)


def _bisect(makespan: Callable[[float], float], target: float, low: float, high: float) -> float:
    """The argument in [low, high] at which the increasing ``makespan`` reaches ``target``."""
    for _ in range(30):
        mid = (low + high) / 2
        if makespan(mid) < target:
            low = mid
        else:
            high = mid
    return (low + high) / 2


def fit(name: str) -> float:
    """Own cores: the gap between stages that makes the provider's row a (no slow node) equal its measured median."""
    return _bisect(lambda gap: run(query(name, gap, None), "provider").makespan, MEASURED[(name, None)],
                   0.0, 10.0)


def fit_scale(name: str, background: float) -> float:
    """Shared host: the work scale that makes row a equal its measured median (no gap between stages)."""
    return _bisect(lambda scale: run(query(name, 0.0, None, background, scale), "provider").makespan,
                   MEASURED[(name, None)], 0.02, 4.0)


def fit_host() -> tuple[float, dict[str, float]]:
    """The host's background cores (one for both queries) and each query's work scale, fitted on rows a and a1.

    For each background (0 to 1.5 cores in steps of 0.05) the work scale is fitted on row a; the background
    kept is the one whose row a1 (one server only) comes closest to its measured median in both queries.
    """
    best: tuple[float, float, dict[str, float]] | None = None
    for step in range(31):
        background = step * 0.05
        scales = {name: fit_scale(name, background) for name in ("q1", "q3")}
        miss = max(abs(run(query(name, 0.0, None, background, scales[name], single=True), "provider").makespan
                       / MEASURED_A1[name] - 1.0) for name in scales)
        if best is None or miss < best[0] - 1e-9:
            best = (miss, background, scales)
    assert best is not None
    return best[1], best[2]


def calibration_rows() -> list[str]:
    """Rows a, a1, b, c simulated with own cores per server and on a shared host, against slow_node.py's medians."""
    rows = ["| query | share | row | measured median | own cores: sim | sim / measured | shared host: sim | "
            "sim / measured | copies (won), shared host |",
            "|---|---|---|---|---|---|---|---|---|"]
    background, scales = fit_host()
    for name in ("q1", "q3"):
        gap = fit(name)
        plan: list[tuple[str, float | None, str, float]] = [("a", None, "provider", MEASURED[(name, None)]),
                                                            ("a1", None, "provider", MEASURED_A1[name])]
        for slow in (0.25, 0.125):
            plan += [("b", slow, "none", MEASURED_B[(name, slow)]), ("c", slow, "provider", MEASURED[(name, slow)])]
        for row, share, policy, measured in plan:
            own = run(query(name, gap, share, single=row == "a1"), policy)
            shared = run(query(name, 0.0, share, background, scales[name], single=row == "a1"), policy)
            rows.append(f"| {name.upper()} | {'-' if share is None else f'1/{round(1 / share)}'} | {row} | "
                        f"{measured:.1f} | {own.makespan:.1f} | {own.makespan / measured:.2f} | "
                        f"{shared.makespan:.1f} | {shared.makespan / measured:.2f} | "
                        f"{shared.copies} ({shared.copies_won}) |")
        rows.append(f"| {name.upper()} | | fitted | | gap between stages {gap:.2f} s | | work x {scales[name]:.2f}, "
                    f"host background {background:.2f} of {HOST_CORES:g} cores | | |")
    return rows


# -- the real pool's regression, and two-server pools with and without last-wave planning --------------

OFF = {"plan_last_wave": False}


def mirror(slow_speed: float) -> Scenario:
    """The regression of the earlier tail-copy rule on the real pool (bench/README.md), in the simulator.

    Two servers of one core and 2 slots; the speed check calls the throttled one 2x slower, so it runs one scan
    original at a time, which becomes overdue early; one scan subtask 30 % shorter, so the fast server's slots
    free one at a time and the copy is wanted while one is free and two originals remain queued.
    """
    nodes = (NodeSpec("local-a", slots=2, cores=1.0), NodeSpec("local-b", slots=2, cores=1.0, speed=slow_speed))
    scan = StageSpec("scan", (1.0, 1.0, 1.0, 0.7, 1.0, 1.0, 1.0, 1.0))
    return Scenario(f"2 servers, one at {slow_speed:g}", nodes, (scan, StageSpec("aggregate", (0.4, 0.4))),
                    startup=0.25, speed_check=0.15)


def pool_rows() -> list[str]:
    """The mirror with and without last-wave planning, then a sweep of two-server pools: how many got slower."""
    rows = ["| scenario | scan makespan: planned | not planned | copies (won): planned | not planned |",
            "|---|---|---|---|---|"]
    for speed in (0.14, 0.16, 0.18, 0.125):
        on, off = simulate(mirror(speed), "provider"), simulate(mirror(speed), "provider", overrides=OFF)
        rows.append(f"| {on.scenario} | {on.stages[0].makespan:.2f} | {off.stages[0].makespan:.2f} | "
                    f"{on.copies} ({on.copies_won}) | {off.copies} ({off.copies_won}) |")
    counts = {"slower": 0, "faster": 0, "same": 0}
    worst = 0.0
    for background in (None, 0.95):
        for speed in (0.5, 0.33, 0.25, 0.18, 0.14, 0.125, 0.1):
            for count in (4, 6, 8, 12):
                for jitter in (0.0, 0.1, 0.3):
                    for seed in (1, 2, 3):
                        for check in (True, False):
                            rng = random.Random(seed * 1000 + count)
                            works = tuple(1.2 * (1 + jitter * (rng.random() * 2 - 1)) for _ in range(count))
                            host = None if background is None else "host"
                            nodes = (NodeSpec("local-a", slots=2, cores=1.0, host=host),
                                     NodeSpec("local-b", slots=2, cores=1.0, speed=speed, host=host))
                            scenario = Scenario("pool", nodes, (StageSpec("scan", works),
                                                                StageSpec("aggregate", (0.4, 0.4))),
                                                startup=0.25, speed_check=0.15 if check else None,
                                                hosts=() if background is None else
                                                (HostSpec("host", HOST_CORES, background),))
                            ratio = (simulate(scenario, "provider").makespan
                                     / simulate(scenario, "provider", overrides=OFF).makespan)
                            worst = max(worst, ratio)
                            counts["slower" if ratio > 1 + 1e-9 else "faster" if ratio < 1 - 1e-9 else "same"] += 1
    rows.append("")
    rows.append(f"Sweep of {sum(counts.values())} two-server pools (own cores or one 2-core host with 0.95 cores "
                f"busy; the slow server at 1/2 to 1/10; 4-12 scan subtasks of equal or jittered work; 3 seeds; "
                f"speed check or not), planned against not planned: {counts['slower']} slower, "
                f"{counts['faster']} faster, {counts['same']} the same; worst ratio {worst:.3f}.")
    return rows


# -- scale ----------------------------------------------------------------------------------------


class _Budget(Exception):
    pass


def scale_rows(budget: float, nodes: int = 1000, subtasks: int = 10_000) -> list[str]:
    """How far one ``nodes`` x ``subtasks`` stage gets in ``budget`` wall seconds (per policy none/provider)."""
    rows = ["| nodes x subtasks | policy | wall s | steps | simulated s | admitted | done |",
            "|---|---|---|---|---|---|---|"]
    for policy in ("provider", "none"):
        rng = random.Random(1)
        all_nodes = cluster(nodes, slots=SLOTS)
        scenario = Scenario(f"{nodes}x{subtasks}", all_nodes, (StageSpec("stage", lognormal_work(subtasks, rng)),),
                            startup=STARTUP, spells=slow_spells(all_nodes, 0.1, 0.25, rng))
        sim = Simulator(scenario, POLICIES[policy])
        started = time.perf_counter()

        def bounded(original: Callable[[], list] = sim.step, since: float = started) -> list:  # type: ignore[type-arg]
            if time.perf_counter() - since > budget:
                raise _Budget
            return original()

        sim.step = bounded  # type: ignore[method-assign]
        done = True
        try:
            sim.run()
        except _Budget:
            done = False
        wall = time.perf_counter() - started
        admitted = len(sim.sched.admitted) if sim.sched else 0
        rows.append(f"| {nodes} x {subtasks} | {policy} | {wall:.1f} | {sim.steps} | {sim.now:.1f} | {admitted} | "
                    f"{'yes' if done else 'no'} |")
    return rows


def main() -> None:
    """Parse arguments, run the chosen parts, print markdown tables."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", choices=("policies", "calibration", "pool", "scale"), action="append")
    parser.add_argument("--scenarios", default=",".join(scenarios(0)))
    parser.add_argument("--policies", default=",".join(POLICIES))
    parser.add_argument("--seed", type=int, default=43)
    parser.add_argument("--scale-budget", type=float, default=60.0)
    parser.add_argument("--scale-sizes", default="1000x10000", help="nodes x subtasks, comma-separated")
    parser.add_argument("--set", action="append", default=[], metavar="OPTION=VALUE",
                        help="a [speculative] option for every policy's runs, e.g. plan_last_wave=false")
    args = parser.parse_args()
    pairs = [item.split("=", 1) for item in args.set]
    if any(len(pair) != 2 for pair in pairs):
        parser.error("--set takes OPTION=VALUE")
    OVERRIDES.update(check_overrides(dict(pairs)))
    parts = args.only or ["policies", "calibration", "pool", "scale"]
    started = time.perf_counter()
    if "policies" in parts:
        print(f"### Policies ({NODES} nodes x {SLOTS} slots, {SUBTASKS} subtasks, lognormal work median {WORK:g} s "
              f"sigma 0.3, 5 % of subtasks 2x skewed, start-up {STARTUP:g} s, seed {args.seed})\n")
        print("\n".join(policy_rows(args.scenarios.split(","), args.seed, args.policies.split(","))) + "\n")
    if "calibration" in parts:
        print("### Calibration against bench/slow_node.py (medians of slow-node-20261126-151150)\n")
        print("\n".join(calibration_rows()) + "\n")
    if "pool" in parts:
        print("### Two-server pools: the real pool's regression mirrored, and a sweep (last-wave planning on/off)\n")
        print("\n".join(pool_rows()) + "\n")
    if "scale" in parts:
        print(f"### Scale (wall budget {args.scale_budget:g} s per policy)\n")
        rows: list[str] = []
        for size in args.scale_sizes.split(","):
            nodes, subtasks = (int(n) for n in size.lower().split("x"))
            rows += scale_rows(args.scale_budget, nodes, subtasks)[0 if not rows else 2:]
        print("\n".join(rows) + "\n")
    print(f"(total {time.perf_counter() - started:.0f} s wall)", file=sys.stderr)


if __name__ == "__main__":
    main()
