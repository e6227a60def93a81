"""Benchmark: does speculative execution win back the makespan a slow node costs?

Runs the example pipeline (dags/tpch_q1.py: stage 'scan' x8, stage 'aggregate' x2) three ways, one
after the other, each with ``airflow dags test`` in its own fresh AIRFLOW_HOME (SQLite) and store:

  a  no slow node, speculation off            (the reference)
  b  one target 4x slow, speculation off      (what the slow node costs)
  c  the same slow target, speculation on     (what speculation wins back)

Every scenario uses the same targets and Spark settings; only fault injection and ``enabled``
change. Makespan is read from the store: earliest attempt DEPLOYING to latest attempt end, across
both stages. Each scenario's committed output must equal scenario a's (and an independent pyarrow
computation of Q1), otherwise the numbers are meaningless and the run fails.

    .venv/bin/python bench/speculation.py [--repeat N] [--scenarios a,b,c] [--connect]

With ``--connect`` the targets are Spark Connect servers instead of one spark-submit per attempt: a
pool of one warm ``local[1]`` server per target (devtools/localcluster.py, started before the first
scenario and not timed), the same names, slots, nodes and fault injection.

Results go to bench/results/<timestamp>/ (results.json, one directory per scenario run).
See bench/README.md for the configuration and measured numbers.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path
from typing import Any

import psutil

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
DAG_ID = "tpch_q1"
STAGES = ("scan", "aggregate")

# ---- the configuration shared by every scenario ---------------------------------------------------
# Four targets ("nodes"), one slot each: at most 4 concurrent driver JVMs on this 2-core machine, and
# blocking the slow target keeps 3/4 of the capacity. See bench/README.md for why not 3 targets x 2 slots
# (6 JVMs on 2 cores inflate the first wave, hence the baseline, and c/a lands at ~1.3).
TARGETS = 4
SLOTS = 1
SLOW_TARGET = "local-b"
SLOW_FACTOR = 4.0
# Every attempt is its own local[1] Spark driver JVM and the machine may have only 2 cores: keep each
# JVM as light as possible so that concurrency distorts attempt times as little as it can.
SPARK_CONF = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.driver.memory": "512m",
    "spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC",
}
SPECULATIVE_OPTIONS = {
    "baseline_ratio": "0.5",  # 4 of 8 scan subtasks (1 of 2 aggregate subtasks) finished -> baseline
    "baseline_multiplier": "1.5",
    "baseline_lower_bound": "5s",  # attempts take ~10-30 s here; the 60 s default would never fire
    "block_slow_node_duration": "600s",  # covers the whole run: a node blocked in 'scan' stays blocked
    "max_concurrent_executions": "2",
    "check_interval": "1s",
}
SCENARIOS: dict[str, dict[str, Any]] = {
    "a": {"slow": False, "speculation": False, "what": "no slow node, speculation off"},
    "b": {"slow": True, "speculation": False, "what": f"{SLOW_TARGET} {SLOW_FACTOR:g}x slow, speculation off"},
    "c": {"slow": True, "speculation": True, "what": f"{SLOW_TARGET} {SLOW_FACTOR:g}x slow, speculation on"},
}
GOAL_C_OVER_A = 1.3
GOAL_B_OVER_A = 2.0


def target_names(count: int) -> list[str]:
    """local-a, local-b, ... (``SLOW_TARGET`` must be among them)."""
    return [f"local-{chr(ord('a') + i)}" for i in range(count)]


def targets_config(count: int, slots: int, connect: bool = False) -> list[dict[str, Any]]:
    """The targets JSON (identical for every scenario); ``connect``: the pool's servers, one per target."""
    if connect:
        # SPARK_CONF tunes per-attempt driver JVMs; a Connect server's JVM is the pool's own.
        return [{"name": name, "conn_id": connect_conn_id(name), "slots": slots, "node": name}
                for name in target_names(count)]
    return [{"name": name, "conn_id": "spark_default", "slots": slots, "node": name, "conf": dict(SPARK_CONF)}
            for name in target_names(count)]


def connect_conn_id(target: str) -> str:
    """The Airflow connection of the pool server behind ``target`` (local-b -> spark_connect_local_b)."""
    return "spark_connect_" + target.replace("-", "_")


def example_env(run_dir: Path, data: Path) -> dict[str, str]:
    """A fresh Airflow home, store and output for the example DAG; nothing AIRFLOW*/SPECULATIVE* inherited."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "SPECULATIVE_"))}
    env.update({
        "AIRFLOW_HOME": str(run_dir / "airflow"),
        "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW_CONN_SPARK_DEFAULT": json.dumps({"conn_type": "spark", "host": "local[1]"}),
        "SPECULATIVE_EXAMPLE_DATA": str(data),
        "SPECULATIVE_EXAMPLE_OUTPUT": str(run_dir / "output"),
        "AIRFLOW__SPECULATIVE__STORE_PATH": str(run_dir / "store"),
    })
    return env


def scenario_env(scenario: str, run_dir: Path, data: Path, count: int, slots: int,
                 connect_env: dict[str, str] | None = None) -> dict[str, str]:
    """Environment of one scenario's ``airflow`` commands; nothing AIRFLOW*/SPECULATIVE* is inherited.

    ``connect_env``: the Connect pool's ``AIRFLOW_CONN_*`` definitions (targets are then its servers).
    """
    spec = SCENARIOS[scenario]
    env = example_env(run_dir, data)
    env.update(connect_env or {})
    env.update({
        "AIRFLOW__SPECULATIVE__TARGETS": json.dumps(targets_config(count, slots, bool(connect_env))),
        "AIRFLOW__SPECULATIVE__ENABLED": "true" if spec["speculation"] else "false",
    })
    for name, value in SPECULATIVE_OPTIONS.items():
        env[f"AIRFLOW__SPECULATIVE__{name.upper()}"] = value
    if spec["slow"]:
        # Fault injection (CONTRIBUTING.md, "Injecting faults"): every stage's attempts on SLOW_TARGET.
        env["SPECULATIVE_FAULT_INJECTION"] = json.dumps({"targets": {SLOW_TARGET: {"factor": SLOW_FACTOR}}})
    return env


# ---- machine load: did other work share the CPUs while we measured? ----------------------------------


class ForeignCpu:
    """CPU seconds used by processes that are not ours (not this benchmark, its children, or an attempt of it).

    Ours: this process and its descendants (``airflow dags test``), plus every process whose command line
    mentions the results directory (the detached attempt supervisors, spark-submit JVMs, Python drivers).
    """

    def __init__(self, ours: str) -> None:
        self.ours = ours
        self.seen: dict[tuple[int, float], float] = {}
        self.at = time.time()

    def sample(self) -> dict[str, Any]:
        """Foreign CPU cores used since the previous sample, and the processes counted now."""
        mine = {os.getpid()}
        with contextlib.suppress(psutil.Error):
            mine |= {c.pid for c in psutil.Process().children(recursive=True)}
        now = time.time()
        seen: dict[tuple[int, float], float] = {}
        foreign_cpu = 0.0
        our_jvms = foreign_jvms = foreign_pytest = 0
        for proc in psutil.process_iter(["pid", "name", "cmdline", "cpu_times", "create_time"]):
            info = proc.info
            cmdline = info["cmdline"]
            if not cmdline or info["cpu_times"] is None:
                continue  # kernel threads, or gone / not ours to read
            is_java = info["name"] == "java"
            if info["pid"] in mine or any(self.ours in arg for arg in cmdline):
                our_jvms += is_java
                continue
            foreign_jvms += is_java
            foreign_pytest += any("pytest" in arg for arg in cmdline[:3])
            key = (info["pid"], info["create_time"] or 0.0)
            cpu = info["cpu_times"].user + info["cpu_times"].system
            seen[key] = cpu
            if key in self.seen:
                foreign_cpu += max(0.0, cpu - self.seen[key])
            elif (info["create_time"] or 0.0) >= self.at:
                foreign_cpu += cpu  # started since the previous sample
        elapsed = max(1e-3, now - self.at)
        self.seen, self.at = seen, now
        return {"at": now, "seconds": round(elapsed, 2), "foreign_cpu": round(foreign_cpu, 2),
                "foreign_cores": round(foreign_cpu / elapsed, 2), "load1": os.getloadavg()[0],
                "our_jvms": our_jvms, "foreign_jvms": foreign_jvms, "foreign_pytest": foreign_pytest}


# A run is "contended" if processes that are not ours used more than this many cores on average, or
# more than CONTENDED_PEAK cores in some sample: on a 2-core machine that visibly stretches attempts.
CONTENDED_MEAN = 0.1
CONTENDED_PEAK = 0.5


class LoadSampler:
    """Samples foreign CPU use, JVM counts and the load average every few seconds in a thread."""

    def __init__(self, ours: str, interval: float = 3.0) -> None:
        self.probe = ForeignCpu(ours)
        self.interval = interval
        self.samples: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="load-sampler", daemon=True)

    def __enter__(self) -> LoadSampler:
        self.probe.sample()  # baseline for the CPU deltas
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            with contextlib.suppress(Exception):
                self.samples.append(self.probe.sample())

    def summary(self) -> dict[str, Any]:
        """Foreign CPU (total, mean and peak cores), JVM counts, load; ``contended`` per the thresholds."""
        if not self.samples:
            return {"samples": 0, "contended": False}
        seconds = sum(s["seconds"] for s in self.samples)
        foreign = sum(s["foreign_cpu"] for s in self.samples)
        mean, peak = foreign / max(seconds, 1e-3), max(s["foreign_cores"] for s in self.samples)
        return {
            "samples": len(self.samples),
            "foreign_cpu_seconds": round(foreign, 1),
            "foreign_cores_mean": round(mean, 2),
            "foreign_cores_peak": round(peak, 2),
            "max_our_jvms": max(s["our_jvms"] for s in self.samples),
            "max_foreign_jvms": max(s["foreign_jvms"] for s in self.samples),
            "max_foreign_pytest": max(s["foreign_pytest"] for s in self.samples),
            "max_load1": round(max(s["load1"] for s in self.samples), 2),
            "contended": mean > CONTENDED_MEAN or peak > CONTENDED_PEAK,
        }


def wait_quiet(ours: str, limit: float, settle: float = 20.0) -> float:
    """Wait until others use < 0.1 core for ``settle`` seconds (at most ``limit``); return seconds waited."""
    start = time.time()
    probe = ForeignCpu(ours)
    quiet_since = None
    while time.time() - start < limit:
        time.sleep(2)
        if probe.sample()["foreign_cores"] < CONTENDED_MEAN:
            quiet_since = quiet_since or time.time()
            if time.time() - quiet_since >= settle:
                break
        else:
            quiet_since = None
    return round(time.time() - start, 1)


def leftovers(text: str) -> list[psutil.Process]:
    """Live processes whose command line mentions ``text`` (a scenario directory)."""
    found = []
    for proc in psutil.process_iter(["pid", "cmdline", "status"]):
        with contextlib.suppress(psutil.Error):
            if proc.pid != os.getpid() and proc.info["status"] != psutil.STATUS_ZOMBIE and any(
                    text in arg for arg in proc.info["cmdline"] or []):
                found.append(proc)
    return found


# ---- reading the store ---------------------------------------------------------------------------------


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    try:
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    except (OSError, ValueError):
        return []


def read_run(store: Path) -> dict[str, Any]:
    """Every attempt of both stages (from claim.json/status.json), admissions, summaries and journals."""
    runs = [p for p in (store / DAG_ID).iterdir() if p.is_dir()] if (store / DAG_ID).is_dir() else []
    if len(runs) != 1:
        raise RuntimeError(f"expected exactly one run of {DAG_ID} under {store}, found {len(runs)}")
    run_dir = runs[0]
    attempts: list[dict[str, Any]] = []
    stages: dict[str, Any] = {}
    for stage in STAGES:
        stage_dir = run_dir / stage
        plan = _read_json(stage_dir / "plan.json") or {}
        journal = _read_jsonl(stage_dir / "journal.jsonl")
        stages[stage] = {
            "parallelism": plan.get("parallelism"),
            "summary": _read_json(stage_dir / "summary.json") or {},
            "committed": (stage_dir / "committed.json").is_file(),
            "blocked": [{"node": e["node"], "at": e["at"], "reason": e.get("reason")}
                        for e in journal if e.get("event") == "block_node"],
        }
        for subtask_dir in sorted(stage_dir.glob("subtask=*"), key=lambda p: int(p.name.split("=")[1])):
            subtask = int(subtask_dir.name.split("=")[1])
            admitted = (_read_json(subtask_dir / "admitted.json") or {}).get("attempt")
            for attempt_dir in sorted(subtask_dir.glob("attempt=*"), key=lambda p: int(p.name.split("=")[1])):
                number = int(attempt_dir.name.split("=")[1])
                claim = _read_json(attempt_dir / "claim.json") or {}
                status = _read_json(attempt_dir / "status.json") or {}
                cancel = _read_json(attempt_dir / "cancel.json")
                end, end_source = status.get("end_at"), "status"
                if end is None and status.get("deploying_at") is not None:
                    # The supervisor was SIGKILLed with its group before it could record the end:
                    # the last write in the attempt directory is the best estimate.
                    end = max(p.stat().st_mtime for p in attempt_dir.rglob("*"))
                    end_source = "mtime"
                attempts.append({
                    "stage": stage, "subtask": subtask, "attempt": number, "target": claim.get("target"),
                    "speculative": bool(claim.get("speculative")), "reason": claim.get("reason"),
                    "state": status.get("state", "?"), "cancelled": cancel is not None,
                    "created": claim.get("created_at"), "start": status.get("deploying_at"), "end": end,
                    "end_source": end_source, "admitted": admitted == number,
                })
    return {"run_dir": str(run_dir), "run_id": (_read_json(run_dir / "scan" / "plan.json") or {}).get("run_id"),
            "blocklist": (_read_json(run_dir / "blocklist.json") or {}).get("until", {}),
            "stages": stages, "attempts": attempts}


def metrics(run: dict[str, Any]) -> dict[str, Any]:
    """Makespans, attempt-seconds and speculation counts of one scenario run."""
    attempts = run["attempts"]
    timed = [a for a in attempts if a["start"] is not None and a["end"] is not None]
    if not timed:
        raise RuntimeError("no attempt has start and end timestamps")
    t0 = min(a["start"] for a in timed)

    def span(items: list[dict[str, Any]]) -> float | None:
        items = [a for a in items if a["start"] is not None and a["end"] is not None]
        return round(max(a["end"] for a in items) - min(a["start"] for a in items), 2) if items else None

    blocked_nodes = sorted({b["node"] for s in run["stages"].values() for b in s["blocked"]})
    return {
        "makespan": span(attempts),
        "stage_makespan": {stage: span([a for a in attempts if a["stage"] == stage]) for stage in STAGES},
        "attempt_seconds": round(sum(max(0.0, a["end"] - a["start"]) for a in timed), 2),
        # c - a can be negative (the slow node idles while it sleeps), so also report what speculation itself ran
        # and how much finished work was thrown away (cancelled losers, failed or discarded attempts).
        "speculative_attempt_seconds": round(sum(a["end"] - a["start"] for a in timed if a["speculative"]), 2),
        "discarded_attempt_seconds": round(sum(a["end"] - a["start"] for a in timed if not a["admitted"]), 2),
        "attempts": len(attempts),
        "speculative_launched": sum(a["speculative"] for a in attempts),
        "speculative_admitted": sum(a["speculative"] and a["admitted"] for a in attempts),
        "speculative_launched_by_stage": {s: sum(a["speculative"] for a in attempts if a["stage"] == s)
                                          for s in STAGES},
        "speculative_admitted_by_stage": {s: sum(a["speculative"] and a["admitted"] for a in attempts
                                                 if a["stage"] == s) for s in STAGES},
        "cancelled": sum(a["state"] == "CANCELED" or (a["cancelled"] and not a["admitted"]) for a in attempts),
        "failed": sum(a["state"] == "FAILED" for a in attempts),
        "ends_estimated": sum(a["end_source"] != "status" for a in attempts),
        "blocked_nodes": blocked_nodes,
        "summary_effective_speculative": {s: run["stages"][s]["summary"].get("numEffectiveSpeculativeExecutions")
                                          for s in STAGES},
        "timeline": [{**a, "start": _rel(a["start"], t0), "end": _rel(a["end"], t0), "created": _rel(a["created"], t0)}
                     for a in attempts],
    }


def _rel(value: float | None, t0: float) -> float | None:
    return None if value is None else round(value - t0, 2)


def timeline_text(m: dict[str, Any], width: int = 64) -> str:
    """A small Gantt chart of the attempts: '=' running, '*' speculative, '!' ended cancelled/failed."""
    total = max((a["end"] or 0.0) for a in m["timeline"]) or 1.0
    lines = []
    for a in m["timeline"]:
        if a["start"] is None or a["end"] is None:
            continue
        lo, hi = round(a["start"] / total * width), max(round(a["end"] / total * width), round(a["start"] / total
                                                                                              * width) + 1)
        bar = ("*" if a["speculative"] else "=") * (hi - lo)
        if not a["admitted"]:
            bar = bar[:-1] + "!"
        lines.append(f"  {a['stage'][:4]:4} {a['subtask']}#{a['attempt']} {a['target']:8} |{' ' * lo}{bar}"
                     f"{' ' * (width - hi)}| {a['start']:6.1f}-{a['end']:6.1f}s {a['state'].lower()}")
    return "\n".join(lines)


# ---- checking the output --------------------------------------------------------------------------------


def read_output(run_dir: Path, date: str) -> list[dict[str, Any]]:
    """The committed sink output of one scenario, rows sorted by the group key."""
    import pyarrow.parquet as pq

    path = run_dir / "output" / DAG_ID / date
    if not path.is_dir():
        raise RuntimeError(f"no committed output at {path}")
    rows = pq.read_table(path).to_pylist()
    return sorted(rows, key=lambda r: (r["l_returnflag"], r["l_linestatus"]))


def reference_q1(data: Path) -> list[dict[str, Any]]:
    """TPC-H Q1 computed independently (pyarrow + exact integer arithmetic), shaped like the sink output."""
    import pyarrow.parquet as pq

    cols = ["l_quantity", "l_extendedprice", "l_discount", "l_tax", "l_returnflag", "l_linestatus", "l_shipdate"]
    cut = dt.date(1998, 12, 1) - dt.timedelta(days=90)
    acc: dict[tuple[str, str], list[int]] = {}
    for part in sorted(p for p in data.glob("*.parquet")):
        table = pq.read_table(part, columns=cols)
        for q, p, d, t, rf, ls, ship in zip(*(table[c].to_pylist() for c in cols), strict=True):
            if ship > cut:
                continue
            q, p, d, t = (int(x * 100) for x in (q, p, d, t))  # decimal(15, 2) as hundredths
            a = acc.setdefault((rf, ls), [0, 0, 0, 0, 0, 0])
            disc_price = p * (100 - d)  # scale 4
            a[0] += q
            a[1] += p
            a[2] += disc_price
            a[3] += disc_price * (100 + t)  # scale 6
            a[4] += d
            a[5] += 1
    six = Decimal("0.000001")
    rows = []
    for (rf, ls), (q, p, dp, ch, d, n) in sorted(acc.items()):
        rows.append({
            "l_returnflag": rf, "l_linestatus": ls, "sum_qty": Decimal(q).scaleb(-2),
            "sum_base_price": Decimal(p).scaleb(-2), "sum_disc_price": Decimal(dp).scaleb(-4),
            "sum_charge": Decimal(ch).scaleb(-6),
            "avg_qty": (Decimal(q).scaleb(-2) / n).quantize(six, ROUND_HALF_UP),
            "avg_price": (Decimal(p).scaleb(-2) / n).quantize(six, ROUND_HALF_UP),
            "avg_disc": (Decimal(d).scaleb(-2) / n).quantize(six, ROUND_HALF_UP),
            "count_order": n,
        })
    return rows


def same_rows(got: list[dict[str, Any]], want: list[dict[str, Any]]) -> str | None:
    """None if equal, else a one-line description of the first difference."""
    if len(got) != len(want):
        return f"{len(got)} rows, expected {len(want)}"
    for g, w in zip(got, want, strict=True):
        if set(g) != set(w):
            return f"columns {sorted(g)} != {sorted(w)}"
        for key in w:
            if g[key] != w[key]:
                return f"group ({w['l_returnflag']}, {w['l_linestatus']}) {key}: {g[key]} != {w[key]}"
    return None


# ---- running one scenario -------------------------------------------------------------------------------


def airflow_bin() -> str:
    """The ``airflow`` next to this interpreter (the project's venv), else the one on PATH."""
    local = Path(sys.executable).parent / "airflow"
    return str(local) if local.exists() else (shutil.which("airflow") or "airflow")


def run_scenario(scenario: str, run_dir: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Fresh AIRFLOW_HOME + store, ``airflow db migrate``, then the timed ``airflow dags test``."""
    run_dir.mkdir(parents=True)
    env = scenario_env(scenario, run_dir, args.data, args.targets, args.slots, args.connect_env)
    (run_dir / "env.json").write_text(json.dumps(
        {k: v for k, v in env.items() if k.startswith(("AIRFLOW", "SPECULATIVE_"))}, indent=1, sort_keys=True))
    migrate = subprocess.run([airflow_bin(), "db", "migrate"], env=env, cwd=REPO, capture_output=True, text=True)
    if migrate.returncode != 0:
        raise RuntimeError(f"airflow db migrate failed ({migrate.returncode}):\n{migrate.stderr[-3000:]}")
    log_path = run_dir / "dags-test.log"
    result: dict[str, Any] = {"scenario": scenario, "what": SCENARIOS[scenario]["what"], "dir": str(run_dir)}
    if args.wait_quiet > 0:
        result["waited_for_quiet"] = wait_quiet(str(args.out), args.wait_quiet)
    with LoadSampler(str(run_dir)) as sampler, open(log_path, "wb") as log:
        started = time.time()
        proc = subprocess.Popen([airflow_bin(), "dags", "test", DAG_ID, args.date], env=env, cwd=REPO,
                                stdout=log, stderr=subprocess.STDOUT)
        try:
            code = proc.wait(timeout=args.timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            code = proc.wait()
            result["error"] = f"airflow dags test timed out after {args.timeout}s"
        wall = time.time() - started
    result.update(exit_code=code, wall=round(wall, 2), started_at=started, load=sampler.summary())
    if code != 0 and "error" not in result:
        result["error"] = f"airflow dags test exited {code}; see {log_path}"
    # No attempt may outlive the run: wait briefly for stragglers, then stop them (they are ours).
    deadline = time.time() + 30
    while (left := leftovers(str(run_dir))) and time.time() < deadline:
        time.sleep(1)
    if left:
        result["leaked_processes"] = [" ".join(p.cmdline())[:200] for p in left if p.is_running()]
        for proc_left in left:
            with contextlib.suppress(psutil.Error):
                proc_left.kill()
    try:
        run = read_run(run_dir / "store")
        result.update(run_id=run["run_id"], blocklist=run["blocklist"], **metrics(run))
        committed = {s: run["stages"][s]["committed"] for s in STAGES}
        result["committed"] = committed
        if not all(committed.values()) and "error" not in result:
            result["error"] = f"not every stage committed: {committed}"
    except Exception as exc:  # a failed run is reported, not hidden
        result.setdefault("error", f"cannot read the store: {exc}")
    with contextlib.suppress(Exception):
        result["output"] = read_output(run_dir, args.date)
    (run_dir / "metrics.json").write_text(json.dumps(result, indent=1, default=str))
    return result


# ---- report ----------------------------------------------------------------------------------------------


def fmt(value: float | None, spec: str = "7.1f") -> str:
    return "-" if value is None else format(value, spec)


def ratio(num: float | None, den: float | None) -> float | None:
    return round(num / den, 3) if num is not None and den else None


def print_table(results: list[dict[str, Any]]) -> None:
    header = (f"{'run':5} {'scenario':38} {'makespan':>8} {'scan':>7} {'aggr':>7} {'wall':>7} {'att-s':>7} "
              f"{'att':>4} {'spec l/a':>8} {'canc':>4} {'blocked':10} {'output':8} {'contended':9}")
    print(header)
    print("-" * len(header))
    for r in results:
        stage = r.get("stage_makespan") or {}
        spec = f"{r.get('speculative_launched', '-')}/{r.get('speculative_admitted', '-')}"
        load = r.get("load") or {}
        print(f"{r['repeat']}-{r['scenario']:3} {r['what'][:38]:38} {fmt(r.get('makespan'), '8.1f')} "
              f"{fmt(stage.get('scan'))} {fmt(stage.get('aggregate'))} {fmt(r.get('wall'))} "
              f"{fmt(r.get('attempt_seconds'))} {r.get('attempts', '-'):>4} {spec:>8} {r.get('cancelled', '-'):>4} "
              f"{','.join(r.get('blocked_nodes') or []) or '-':10} {r.get('output_check', '-'):8} "
              f"{'yes' if load.get('contended') else 'no':9}")


def compare(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Ratios per repeat (b/a, c/a on the store makespan and on wall time) and their medians."""
    per_repeat = []
    for rep in sorted({r["repeat"] for r in results}):
        by = {r["scenario"]: r for r in results if r["repeat"] == rep and "error" not in r}
        a, b, c = by.get("a"), by.get("b"), by.get("c")
        row: dict[str, Any] = {"repeat": rep}
        if a:
            row["a"] = a["makespan"]
            if b:
                row.update(b=b["makespan"], b_over_a=ratio(b["makespan"], a["makespan"]),
                           b_over_a_wall=ratio(b["wall"], a["wall"]))
            if c:
                row.update(c=c["makespan"], c_over_a=ratio(c["makespan"], a["makespan"]),
                           c_over_a_wall=ratio(c["wall"], a["wall"]),
                           extra_attempt_seconds=round(c["attempt_seconds"] - a["attempt_seconds"], 2))
        if c:
            row.update(speculative_launched=c["speculative_launched"], speculative_admitted=c["speculative_admitted"],
                       speculative_attempt_seconds=c["speculative_attempt_seconds"],
                       discarded_attempt_seconds=c["discarded_attempt_seconds"])
        per_repeat.append(row)

    def med(key: str) -> float | None:
        values = [r[key] for r in per_repeat if r.get(key) is not None]
        return round(statistics.median(values), 3) if values else None

    keys = ("a", "b", "c", "b_over_a", "c_over_a", "b_over_a_wall", "c_over_a_wall", "extra_attempt_seconds",
            "speculative_launched", "speculative_admitted", "speculative_attempt_seconds", "discarded_attempt_seconds")
    medians = {k: med(k) for k in keys}
    goal = None
    if medians["b_over_a"] is not None and medians["c_over_a"] is not None:
        goal = {"b_over_a_at_least": GOAL_B_OVER_A, "c_over_a_at_most": GOAL_C_OVER_A,
                "met": medians["b_over_a"] >= GOAL_B_OVER_A and medians["c_over_a"] <= GOAL_C_OVER_A}
    return {"per_repeat": per_repeat, "median": medians, "goal": goal}


# ---- main ------------------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=1, help="run the scenarios N times, interleaved (default 1)")
    parser.add_argument("--scenarios", default="a,b,c", help="comma-separated subset of a,b,c (default a,b,c)")
    parser.add_argument("--data", type=Path, default=REPO / ".data" / "tpch" / "lineitem",
                        help="lineitem Parquet directory, one subtask per part (default .data/tpch/lineitem)")
    parser.add_argument("--targets", type=int, default=TARGETS,
                        help=f"number of targets local-a, local-b, ... (default {TARGETS}; {SLOW_TARGET} is slow)")
    parser.add_argument("--slots", type=int, default=SLOTS, help=f"slots per target (default {SLOTS})")
    parser.add_argument("--wait-quiet", type=float, default=0, metavar="SECONDS",
                        help="before each scenario, wait up to SECONDS until no other JVM or pytest runs (default 0)")
    parser.add_argument("--date", default="2026-01-01", help="logical date of the DAG run")
    parser.add_argument("--results", type=Path, default=HERE / "results", help="results root (default bench/results)")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds before a dags test is killed")
    parser.add_argument("--connect", action="store_true",
                        help="Spark Connect targets: one warm local[1] server per target (started first, not timed)")
    parser.add_argument("--base-port", type=int, default=15140, help="first gRPC port of the --connect pool")
    parser.add_argument("--ui-base-port", type=int, default=4140, help="first Spark UI port of the --connect pool")
    parser.add_argument("--no-reference", action="store_true",
                        help="skip the independent pyarrow computation of Q1 (outputs are still compared with a)")
    args = parser.parse_args(argv)
    args.scenarios = [s.strip() for s in args.scenarios.split(",") if s.strip()]
    unknown = [s for s in args.scenarios if s not in SCENARIOS]
    if unknown or not args.scenarios:
        parser.error(f"--scenarios: unknown {unknown}; choose from {','.join(SCENARIOS)}")
    if args.targets < 2 or SLOW_TARGET not in target_names(args.targets) or args.slots < 1:
        parser.error(f"need --targets >= 2 (so that {SLOW_TARGET} exists) and --slots >= 1")
    if args.repeat < 1:
        parser.error("--repeat must be >= 1")
    args.data = args.data.resolve()
    parts = sorted(args.data.glob("*.parquet"))
    if not parts:
        parser.error(f"--data: no Parquet files in {args.data} (run `make data`)")
    if len(parts) != 8:
        print(f"note: {len(parts)} Parquet parts in {args.data}; stage 'scan' has parallelism 8", file=sys.stderr)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    out = args.out = (args.results / stamp).resolve()
    out.mkdir(parents=True)
    args.connect_env = {}
    pool = None
    if args.connect:
        from airflow_provider_speculative.devtools.localcluster import LocalCluster, connection_definitions

        pool = LocalCluster(out / "local-cluster")
        started = time.time()
        servers, _ = pool.start(servers=args.targets, base_port=args.base_port, ui_base_port=args.ui_base_port,
                                cores=1)
        print(f"Connect pool: {len(servers)} servers ready in {time.time() - started:.1f}s (not timed)", flush=True)
        args.connect_env = connection_definitions(servers)
    try:
        return _run(args, out, stamp)
    finally:
        if pool is not None:
            pool.stop()


def _run(args: argparse.Namespace, out: Path, stamp: str) -> int:
    """The scenarios, the report and results.json (main() owns the optional Connect pool)."""
    config = {"targets": targets_config(args.targets, args.slots, args.connect), "slow_target": SLOW_TARGET,
              "slow_factor": SLOW_FACTOR,
              "speculative_options": SPECULATIVE_OPTIONS, "scenarios": SCENARIOS, "data": str(args.data),
              "parts": len(list(args.data.glob("*.parquet"))), "date": args.date,
              "machine": {"cpus": os.cpu_count(), "load_before": os.getloadavg()}}
    print(f"results: {out}")
    print(f"targets: {', '.join(target_names(args.targets))} x {args.slots} slots; "
          f"slow: {SLOW_TARGET} x{SLOW_FACTOR:g}; "
          f"options: {SPECULATIVE_OPTIONS}")
    reference = None if args.no_reference else reference_q1(args.data)
    results: list[dict[str, Any]] = []
    outputs_a: dict[int, list[dict[str, Any]]] = {}
    for rep in range(1, args.repeat + 1):
        for scenario in args.scenarios:
            print(f"[{dt.datetime.now():%H:%M:%S}] repeat {rep} scenario {scenario}: {SCENARIOS[scenario]['what']} ...",
                  flush=True)
            result = run_scenario(scenario, out / f"r{rep}-{scenario}", args)
            result["repeat"] = rep
            rows = result.pop("output", None)
            checks = []
            if rows is None:
                checks.append("no output")
            else:
                if scenario == "a":
                    outputs_a[rep] = rows
                want_a = outputs_a.get(rep) or next(iter(outputs_a.values()), None)
                if want_a is not None and (diff := same_rows(rows, want_a)):
                    checks.append(f"differs from a: {diff}")
                if reference is not None and (diff := same_rows(rows, reference)):
                    checks.append(f"differs from reference: {diff}")
                result["rows"] = len(rows)
            result["output_check"] = "FAILED" if checks else "ok"
            if checks:
                result["output_problems"] = checks
                result.setdefault("error", "; ".join(checks))
            results.append(result)
            if "timeline" in result:
                print(timeline_text(result))
            print(f"  makespan {fmt(result.get('makespan'), '.1f')} s, wall {fmt(result.get('wall'), '.1f')} s, "
                  f"attempt-seconds {fmt(result.get('attempt_seconds'), '.1f')}, speculative launched/admitted "
                  f"{result.get('speculative_launched')}/{result.get('speculative_admitted')}, output "
                  f"{result['output_check']}, load {result.get('load')}", flush=True)
            if "error" in result:
                print(f"  ERROR: {result['error']}", flush=True)
    comparison = compare(results)
    print()
    print_table(results)
    print()
    for row in comparison["per_repeat"]:
        print(f"repeat {row['repeat']}: " + ", ".join(f"{k} {v}" for k, v in row.items() if k != "repeat"))
    med = comparison["median"]
    print(f"\nmakespan a {med['a']} s, b {med['b']} s, c {med['c']} s | b/a {med['b_over_a']} "
          f"(wall {med['b_over_a_wall']}), c/a {med['c_over_a']} (wall {med['c_over_a_wall']}) | "
          f"extra attempt-seconds (c - a) {med['extra_attempt_seconds']} | speculative attempts in c: launched "
          f"{med['speculative_launched']}, admitted {med['speculative_admitted']}, ran "
          f"{med['speculative_attempt_seconds']} attempt-s; discarded attempt-s in c "
          f"{med['discarded_attempt_seconds']}")
    if comparison["goal"]:
        goal = comparison["goal"]
        print(f"goal b/a >= {GOAL_B_OVER_A} and c/a <= {GOAL_C_OVER_A}: {'met' if goal['met'] else 'NOT met'}")
    contended = [f"{r['repeat']}-{r['scenario']}" for r in results if (r.get("load") or {}).get("contended")]
    if contended:
        print(f"note: other JVMs or pytest ran during {', '.join(contended)}: those numbers are contended")
    errors = [f"{r['repeat']}-{r['scenario']}: {r['error']}" for r in results if "error" in r]
    for line in errors:
        print(f"ERROR {line}")
    (out / "results.json").write_text(json.dumps(
        {"started": stamp, "command": [sys.executable, *sys.argv], "config": config, "results": results,
         **comparison, "contended_runs": contended, "errors": errors}, indent=1, default=str))
    print(f"\nwritten {out / 'results.json'}")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
