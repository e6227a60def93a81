"""The ``[speculative]`` options: defaults, parsing from strings and validation that names the option."""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from airflow_provider_speculative.exceptions import ConfigError

SECTION = "speculative"


@dataclass(frozen=True)
class Target:
    """Where attempts are submitted: a ``spark`` connection, extra conf, a slot count and a node label."""

    name: str
    conn_id: str = "spark_default"
    slots: int = 2
    node: str | None = None
    conf: dict[str, str] = field(default_factory=dict)

    @property
    def node_label(self) -> str:
        """The node attempts on this target are expected to run on (the target name if unset)."""
        return self.node or self.name


# Many local drivers on one host would exhaust Spark UI ports (4040 + 16 retries); local attempts
# run without the UI. Configure targets explicitly to keep it, e.g. on a cluster.
LOCAL_CONF = {"spark.ui.enabled": "false"}
DEFAULT_TARGETS: tuple[Target, ...] = (
    Target(name="local-a", conn_id="spark_default", slots=2, conf=LOCAL_CONF),
    Target(name="local-b", conn_id="spark_default", slots=2, conf=LOCAL_CONF),
)


@dataclass(frozen=True)
class FaultSpec:
    """An injected slowdown: the attempt takes ``factor`` times as long plus ``delay`` seconds, or fails."""

    factor: float = 1.0
    delay: float = 0.0
    fail: bool = False

    @property
    def active(self) -> bool:
        """True if this spec changes anything."""
        return self.factor != 1.0 or self.delay != 0.0 or self.fail


@dataclass(frozen=True)
class FaultInjection:
    """Test and demo fault injection: slow targets and chosen attempts. Empty means off."""

    targets: dict[str, FaultSpec] = field(default_factory=dict)
    attempts: dict[tuple[int, int], FaultSpec] = field(default_factory=dict)
    # Subtasks treated as slow from the start, so concurrent attempts exist deterministically.
    force_speculation: frozenset[int] = frozenset()
    # Attempts hold their manifest until <stage dir>/barrier.release.<subtask> exists: finishes land together.
    barrier: bool = False

    def for_attempt(self, target: str, subtask: int, attempt: int) -> FaultSpec:
        """Return the fault applied to one attempt; a per-attempt rule wins over a target rule."""
        return self.attempts.get((subtask, attempt)) or self.targets.get(target) or FaultSpec()

    def to_json(self) -> dict[str, Any]:
        """Serialise to the documented JSON form."""
        return {
            "targets": {name: asdict(spec) for name, spec in self.targets.items()},
            "attempts": [
                {"subtask": s, "attempt": a, **asdict(spec)} for (s, a), spec in self.attempts.items()
            ],
            "force_speculation": sorted(self.force_speculation),
            "barrier": self.barrier,
        }


@dataclass(frozen=True)
class SpeculativeConfig:
    """All options of the ``[speculative]`` section, after parsing and validation."""

    enabled: bool = False
    max_concurrent_executions: int = 2
    block_slow_node_duration: float = 60.0
    check_interval: float = 1.0
    baseline_lower_bound: float = 60.0
    baseline_ratio: float = 0.75
    baseline_multiplier: float = 1.5
    normalize_by_input_bytes: bool = True
    max_failures_per_subtask: int = 3
    max_failures_per_stage: int = 10
    retention: float = 86400.0
    failover_strategy: str = "region"
    executor_loss_timeout: float = 60.0
    store_path: str = ""
    spark_history_url: str = ""
    targets: tuple[Target, ...] = DEFAULT_TARGETS
    fault_injection: FaultInjection = field(default_factory=FaultInjection)

    def with_overrides(self, overrides: dict[str, Any] | None, where: str) -> SpeculativeConfig:
        """Return a copy with ``overrides`` applied; ``where`` names the source in error messages."""
        if not overrides:
            return self
        parsed = {name: parse_option(name, value, where) for name, value in overrides.items()}
        return replace(self, **parsed)

    def to_json(self) -> dict[str, Any]:
        """Serialise to plain JSON types (for plan.json and trigger kwargs)."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["targets"] = [asdict(t) for t in self.targets]
        out["fault_injection"] = self.fault_injection.to_json()
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SpeculativeConfig:
        """Inverse of :meth:`to_json`."""
        return cls().with_overrides(data, "plan")


OPTION_DOCS: dict[str, str] = {
    "enabled": "Launch speculative attempts for slow subtasks.",
    "max_concurrent_executions": "Live attempts per subtask, original included (>= 1).",
    "block_slow_node_duration": "Seconds a slow node stays blocked for new attempts (>= 0).",
    "check_interval": "Seconds between controller checks (> 0).",
    "baseline_lower_bound": "Lower bound of the slow-task baseline in seconds (>= 0).",
    "baseline_ratio": "Fraction of subtasks that must finish before a baseline exists (0 < r <= 1).",
    "baseline_multiplier": "Baseline = median execution time of the earliest finishers times this (>= 1).",
    "normalize_by_input_bytes": "Compare execution time per input byte when input sizes are known.",
    "max_failures_per_subtask": "Failed attempts a subtask may have before the stage fails (>= 0).",
    "max_failures_per_stage": "Failed attempts a stage run may have in all before it fails (>= 0).",
    "retention": "How long intermediate results stay after the run succeeded and their consumers committed.",
    "failover_strategy": "What reruns when an input partition is lost: 'region' (only the affected region) or 'all'.",
    "executor_loss_timeout": ("On a cluster master: an attempt whose executors are all gone (or never came) for this "
                              "long fails as 'node lost' and its node is blocked (0: never)."),
    "store_path": "Root of the result store: a local path or file:// URL; empty means $AIRFLOW_HOME/speculative-store.",
    "spark_history_url": "Spark history server URL for the UI's links to admitted attempts; empty: no link.",
    "targets": "JSON list of targets: name, conn_id, slots, node, conf.",
    "fault_injection": ("JSON: {targets: {name: {factor, delay, fail}}, attempts: [{subtask, attempt, ...}], "
                        "force_speculation: [subtask, ...], barrier: bool}. Tests and demos only; off when empty."),
}

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|sec|secs|seconds?|m|min|mins|minutes?|h|hours?|d|days?)?\s*$")
_UNIT = {"ms": 0.001, "s": 1, "sec": 1, "secs": 1, "second": 1, "seconds": 1, "m": 60, "min": 60,
         "mins": 60, "minute": 60, "minutes": 60, "h": 3600, "hour": 3600, "hours": 3600,
         "d": 86400, "day": 86400, "days": 86400}


def _bad(name: str, value: Any, where: str, why: str) -> ConfigError:
    return ConfigError(f"[{SECTION}] {name} = {value!r} ({where}): {why}")


def _duration(name: str, value: Any, where: str) -> float:
    if isinstance(value, bool):
        raise _bad(name, value, where, "expected a duration such as 60, '60s' or '1 min'")
    if isinstance(value, int | float):
        seconds = float(value)
    else:
        match = _DURATION.match(str(value))
        if not match:
            raise _bad(name, value, where, "expected a duration such as 60, '60s' or '1 min'")
        seconds = float(match.group(1)) * _UNIT[match.group(2) or "s"]
    if seconds < 0:
        raise _bad(name, value, where, "must not be negative")
    return seconds


def _bool(name: str, value: Any, where: str) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in {"true", "1", "yes", "on"}:
        return True
    if text in {"false", "0", "no", "off"}:
        return False
    raise _bad(name, value, where, "expected true or false")


def _int(name: str, value: Any, where: str, minimum: int) -> int:
    try:
        if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
            raise ValueError
        number = int(value)
    except (TypeError, ValueError):
        raise _bad(name, value, where, "expected an integer") from None
    if number < minimum:
        raise _bad(name, value, where, f"must be >= {minimum}")
    return number


def _float(name: str, value: Any, where: str) -> float:
    try:
        if isinstance(value, bool):
            raise ValueError
        return float(value)
    except (TypeError, ValueError):
        raise _bad(name, value, where, "expected a number") from None


def _json(name: str, value: Any, where: str) -> Any:
    if isinstance(value, str):
        if not value.strip():
            return None
        try:
            return json.loads(value)
        except json.JSONDecodeError as exc:
            raise _bad(name, value, where, f"invalid JSON: {exc}") from None
    return value


def _targets(name: str, value: Any, where: str) -> tuple[Target, ...]:
    raw = _json(name, value, where)
    if not raw or not isinstance(raw, list | tuple):
        raise _bad(name, value, where, "expected a non-empty list of targets")
    targets = []
    for item in raw:
        if isinstance(item, Target):
            targets.append(item)
            continue
        if not isinstance(item, dict) or not item.get("name"):
            raise _bad(name, item, where, "each target needs at least a 'name'")
        unknown = set(item) - {"name", "conn_id", "slots", "node", "conf"}
        if unknown:
            raise _bad(name, item, where, f"unknown target keys {sorted(unknown)}")
        slots = _int(f"{name}[{item['name']}].slots", item.get("slots", 2), where, 1)
        conf = {str(k): str(v) for k, v in (item.get("conf") or {}).items()}
        targets.append(Target(name=str(item["name"]), conn_id=str(item.get("conn_id", "spark_default")),
                              slots=slots, node=item.get("node"), conf=conf))
    names = [t.name for t in targets]
    if len(set(names)) != len(names):
        raise _bad(name, names, where, "target names must be unique")
    return tuple(targets)


def _fault_spec(name: str, raw: Any, where: str) -> FaultSpec:
    if not isinstance(raw, dict):
        raise _bad(name, raw, where, "expected an object with factor, delay or fail")
    unknown = set(raw) - {"factor", "delay", "fail", "subtask", "attempt"}
    if unknown:
        raise _bad(name, raw, where, f"unknown keys {sorted(unknown)}")
    factor = _float(f"{name}.factor", raw.get("factor", 1.0), where)
    if factor < 1.0:
        raise _bad(f"{name}.factor", factor, where, "must be >= 1")
    return FaultSpec(factor=factor, delay=_duration(f"{name}.delay", raw.get("delay", 0), where),
                     fail=_bool(f"{name}.fail", raw.get("fail", False), where))


def _faults(name: str, value: Any, where: str) -> FaultInjection:
    if isinstance(value, FaultInjection):
        return value
    raw = _json(name, value, where)
    if not raw:
        return FaultInjection()
    if not isinstance(raw, dict) or set(raw) - {"targets", "attempts", "force_speculation", "barrier"}:
        raise _bad(name, value, where, "expected {targets: {...}, attempts: [...], force_speculation: [...], "
                                       "barrier: bool}")
    targets = {str(t): _fault_spec(f"{name}.targets.{t}", spec, where)
               for t, spec in (raw.get("targets") or {}).items()}
    attempts = {}
    for item in raw.get("attempts") or []:
        if not isinstance(item, dict) or "subtask" not in item:
            raise _bad(name, item, where, "each attempts entry needs 'subtask' (and optionally 'attempt')")
        key = (_int(f"{name}.subtask", item["subtask"], where, 0),
               _int(f"{name}.attempt", item.get("attempt", 0), where, 0))
        attempts[key] = _fault_spec(f"{name}.attempts", item, where)
    forced = raw.get("force_speculation") or []
    if not isinstance(forced, list | tuple):
        raise _bad(f"{name}.force_speculation", forced, where, "expected a list of subtask indexes")
    return FaultInjection(targets=targets, attempts=attempts,
                          force_speculation=frozenset(_int(f"{name}.force_speculation", i, where, 0) for i in forced),
                          barrier=_bool(f"{name}.barrier", raw.get("barrier", False), where))


# Store roots other helpers may add later (hdfs://, s3://) need an object-store layer first: see docs/store.md.
STORE_SCHEMES = ("file",)


def store_root_path(value: str, where: str = "configuration") -> str:
    """The local path of a store root given as a path or a ``file://`` URL; other schemes are refused.

    ``file:///shared/store`` and ``/shared/store`` mean the same; a host part other than empty or
    ``localhost`` is refused too (the path must be mounted on every machine that runs attempts).
    """
    from urllib.parse import unquote, urlparse

    if "://" not in value:
        return value
    url = urlparse(value)
    if url.scheme.lower() not in STORE_SCHEMES:
        raise _bad("store_path", value, where,
                   f"store scheme {url.scheme!r} is not supported (supported: a local path or file://; "
                   "a shared POSIX mount such as NFS works as file://)")
    if url.netloc not in ("", "localhost"):
        raise _bad("store_path", value, where,
                   f"file:// URL with host {url.netloc!r}: use file:///path on a filesystem mounted on every host")
    if not url.path.startswith("/"):
        raise _bad("store_path", value, where, "file:// URL needs an absolute path (file:///path)")
    return unquote(url.path)


def parse_option(name: str, value: Any, where: str) -> Any:
    """Parse and validate one option value, raising :class:`ConfigError` naming it."""
    if name == "enabled" or name == "normalize_by_input_bytes":
        return _bool(name, value, where)
    if name == "max_concurrent_executions":
        return _int(name, value, where, 1)
    if name in {"max_failures_per_subtask", "max_failures_per_stage"}:
        return _int(name, value, where, 0)
    if name == "failover_strategy":
        if value not in ("region", "all"):
            raise _bad(name, value, where, "must be 'region' or 'all'")
        return str(value)
    if name in {"block_slow_node_duration", "baseline_lower_bound", "retention", "executor_loss_timeout"}:
        return _duration(name, value, where)
    if name == "check_interval":
        seconds = _duration(name, value, where)
        if seconds <= 0:
            raise _bad(name, value, where, "must be > 0")
        return seconds
    if name == "baseline_ratio":
        ratio = _float(name, value, where)
        if not 0 < ratio <= 1:
            raise _bad(name, value, where, "must be in (0, 1]")
        return ratio
    if name == "baseline_multiplier":
        multiplier = _float(name, value, where)
        if multiplier < 1:
            raise _bad(name, value, where, "must be >= 1")
        return multiplier
    if name == "store_path":
        text = str(value or "")
        store_root_path(text, where)  # fail when the DAG is parsed, not when an attempt starts
        return text
    if name == "spark_history_url":
        return str(value or "")
    if name == "targets":
        return _targets(name, value, where)
    if name == "fault_injection":
        return _faults(name, value, where)
    known = ", ".join(sorted(OPTION_DOCS))
    raise ConfigError(f"[{SECTION}] unknown option {name!r} ({where}); known options: {known}")


def default_strings() -> dict[str, str]:
    """The defaults as the strings Airflow's config declares (provider info)."""
    base = SpeculativeConfig()
    out: dict[str, str] = {}
    for f in fields(base):
        value = getattr(base, f.name)
        if f.name == "targets":
            out[f.name] = json.dumps([asdict(t) for t in value])
        elif f.name == "fault_injection":
            out[f.name] = ""
        elif isinstance(value, bool):
            out[f.name] = str(value)
        elif f.name in {"block_slow_node_duration", "baseline_lower_bound", "check_interval", "retention",
                        "executor_loss_timeout"}:
            out[f.name] = f"{value:g}"
        else:
            out[f.name] = str(value)
    return out
