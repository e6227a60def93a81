"""The ``[speculative]`` options: defaults, parsing from strings and validation that names the option."""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Callable
from dataclasses import MISSING, asdict, dataclass, field, fields, replace
from typing import Any, TypeVar

from airflow_provider_speculative.core.contract import FAULTS_ENV
from airflow_provider_speculative.core.paths import redact_url, url_scheme
from airflow_provider_speculative.exceptions import ConfigError

SECTION = "speculative"


@dataclass(frozen=True)
class Target:
    """Where attempts are submitted: a ``spark`` connection, extra conf, a slot count and a node label.

    ``slots`` is shared by every stage and run using the target (claimed in the store). With
    ``auto_slots`` (``"slots": "auto"``) it is re-read from the standalone master at ``master_ui``
    every check interval instead (reactive mode); ``slots`` is then unused.
    """

    name: str
    conn_id: str = "spark_default"
    slots: int = 2
    node: str | None = None
    conf: dict[str, str] = field(default_factory=dict)
    auto_slots: bool = False
    master_ui: str | None = None

    @property
    def node_label(self) -> str:
        """The node attempts on this target are expected to run on (the target name if unset)."""
        return self.node or self.name


# Many local drivers on one host would exhaust Spark UI ports (4040 + 16 retries); local attempts
# run without the UI. Configure targets explicitly to keep it, e.g. on a cluster.
LOCAL_CONF = {"spark.ui.enabled": "false"}
# The api-server connection a stage ending in the triggerer records its asset event through, if it is defined.
DEFAULT_ASSET_EVENTS_CONN_ID = "speculative_api"
# slot_priority's values (core/priority.py): the chain after a stage first, or first come, first served.
CRITICAL_PATH = "critical_path"
FIFO = "fifo"
SLOT_PRIORITIES = (CRITICAL_PATH, FIFO)
# exchange_layout's values (docs/store.md, "Exchange layouts"): one file per task and subpartition, or one file
# per task sorted by subpartition; auto is the measured better one, packed on every store today.
AUTO = "auto"
PARTITIONED = "partitioned"
PACKED = "packed"
EXCHANGE_LAYOUTS = (AUTO, PARTITIONED, PACKED)
# exchange_commit's values (docs/store.md, "Exchange commit"): the provider's direct commit protocol where the
# target's Spark has its jar (auto), or Hadoop's file output committer always.
HADOOP = "hadoop"
EXCHANGE_COMMITS = (AUTO, HADOOP)
DEFAULT_TARGETS: tuple[Target, ...] = (
    Target(name="local-a", conn_id="spark_default", slots=2, conf=LOCAL_CONF),
    Target(name="local-b", conn_id="spark_default", slots=2, conf=LOCAL_CONF),
)


def host_default_targets(cores: int) -> tuple[Target, ...]:
    """The two local targets sized for a host with ``cores`` CPUs: one slot per core between them.

    Each local attempt is a ``local[1]`` driver JVM of its own; more of them than cores only makes every
    attempt slower (bench/README.md, "Summary of earlier measurements"), and a slow attempt looks like a slow node. A
    target keeps at least one slot.
    """
    slots = max(1, cores // 2)
    return tuple(Target(name=t.name, conn_id=t.conn_id, slots=slots, conf=dict(t.conf)) for t in DEFAULT_TARGETS)


_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|sec|secs|seconds?|m|min|mins|minutes?|h|hours?|d|days?)?\s*$")
_UNIT = {"ms": 0.001, "s": 1, "sec": 1, "secs": 1, "second": 1, "seconds": 1, "m": 60, "min": 60,
         "mins": 60, "minute": 60, "minutes": 60, "h": 3600, "hour": 3600, "hours": 3600,
         "d": 86400, "day": 86400, "days": 86400}


def _bad(name: str, value: Any, where: str, why: str) -> ConfigError:
    try:
        shown = repr(value)
    except ValueError:  # an int beyond Python's digit limit for str()
        shown = f"<an integer of {value.bit_length()} bits>"
    if len(shown) > 60:  # a 400-digit number is cut, not printed whole
        shown = f"{shown[:24]}...{shown[-8:]} ({len(shown)} characters)"
    return ConfigError(f"[{SECTION}] {name} = {shown} ({where}): {why}")


# A hundred years: longer means "never" to every caller, and larger values overflow date arithmetic
# (datetime, plan.json's JSON, the controller's deadlines) far from where they were given.
MAX_DURATION = 100 * 365 * 86400.0


def _duration(name: str, value: Any, where: str) -> float:
    if isinstance(value, bool):
        raise _bad(name, value, where, "expected a duration such as 60, '60s' or '1 min'")
    try:
        if isinstance(value, int | float):
            seconds = float(value)
            if math.isnan(seconds):
                raise _bad(name, value, where, "must be a finite number of seconds")
        else:
            match = _DURATION.match(str(value))
            if not match:
                raise _bad(name, value, where, "expected a duration such as 60, '60s' or '1 min'")
            # 400 digits parse to inf rather than failing: caught by the bound below.
            seconds = float(match.group(1)) * _UNIT[match.group(2) or "s"]
    except OverflowError:  # float() of an int beyond the float range
        raise _bad(name, value, where, f"must be a finite number of seconds, at most {MAX_DURATION:.0f} "
                                               "(100 years)") from None
    if seconds < 0:
        raise _bad(name, value, where, "must not be negative")
    if not seconds <= MAX_DURATION:
        raise _bad(name, value, where, f"must be a finite number of seconds, at most {MAX_DURATION:.0f} "
                                               "(100 years)")
    return seconds



MAX_SIZE = 1024 ** 6  # 1 EiB: beyond any dataset, and far below where float and int disagree
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]i?b?|b)?\s*$", re.IGNORECASE)


def _size(name: str, value: Any, where: str) -> int:
    """Bytes from an integer or a size such as '64MB', '128 MiB', '1 GiB' (KB/MB/GB are 1024-based too)."""
    if isinstance(value, bool):
        raise _bad(name, value, where, "expected a size such as 134217728, '128MB' or '1 GiB'")
    try:
        if isinstance(value, int | float):
            number = float(value)
        else:
            match = _SIZE.match(str(value))
            if not match:
                raise _bad(name, value, where, "expected a size such as 134217728, '128MB' or '1 GiB'")
            unit = (match.group(2) or "b").lower()[0]
            number = float(match.group(1)) * 1024 ** "bkmgt".index(unit)
    except OverflowError:
        number = math.inf
    if math.isnan(number) or number < 1:
        raise _bad(name, value, where, "must be at least 1 byte")
    if number > MAX_SIZE:
        raise _bad(name, value, where, f"must be at most {MAX_SIZE} bytes (1 EiB)")
    return int(number)


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
        number = float(value)
    except OverflowError:  # an int such as 10**400: beyond the float range
        raise _bad(name, value, where, "expected a finite number") from None
    except (TypeError, ValueError):
        raise _bad(name, value, where, "expected a number") from None
    if not math.isfinite(number):
        # NaN compares false with every bound, so it would slip through each range check below.
        raise _bad(name, value, where, "expected a finite number")
    return number


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
        unknown = set(item) - {"name", "conn_id", "slots", "node", "conf", "auto_slots", "master_ui"}
        if unknown:
            raise _bad(name, item, where, f"unknown target keys {sorted(unknown)}")
        auto = item.get("slots") == "auto" or _bool(f"{name}[{item['name']}].auto_slots",
                                                     item.get("auto_slots", False), where)
        slots = 1 if auto else _int(f"{name}[{item['name']}].slots", item.get("slots", 2), where, 1)
        if not isinstance(item.get("conf") or {}, dict):
            raise _bad(f"{name}[{item['name']}].conf", item.get("conf"), where,
                       "expected an object of Spark settings, e.g. {\"spark.executor.cores\": \"2\"}")
        conf = {str(k): str(v) for k, v in (item.get("conf") or {}).items()}
        master_ui = _master_ui(f"{name}[{item['name']}].master_ui", item.get("master_ui"), where, auto)
        if master_ui and not auto:
            raise _bad(f"{name}[{item['name']}].master_ui", master_ui, where, "only used with 'slots': 'auto'")
        if auto and "spark.cores.max" not in conf:
            # Without it a standalone application takes every free core, and slots would mean nothing.
            conf["spark.cores.max"] = conf.get("spark.executor.cores", "1")
        targets.append(Target(name=str(item["name"]), conn_id=str(item.get("conn_id", "spark_default")),
                              slots=slots, node=item.get("node"), conf=conf, auto_slots=auto, master_ui=master_ui))
    names = [t.name for t in targets]
    if len(set(names)) != len(names):
        raise _bad(name, names, where, "target names must be unique")
    return tuple(targets)


def _master_ui(name: str, value: Any, where: str, auto: bool) -> str | None:
    """A standalone master's web UI URL (its ``/json`` lists workers), validated without I/O."""
    from urllib.parse import urlparse

    if value in (None, ""):
        # May come from the connection's extra instead: checked when the stage is planned.
        return None
    url = urlparse(str(value))
    if url.scheme not in ("http", "https") or not url.netloc:
        raise _bad(name, value, where, "expected an http(s) URL of the master's web UI, e.g. 'http://master:8080'")
    return str(value).rstrip("/")


# Store roots given as a URL: file:// (a local path). s3:// and s3a:// are served too, but only with the
# experimental opt-in (experimental_s3_store): a healthy run costs more than the cost goal allows (docs/store.md).
STORE_SCHEMES = ("file",)
EXPERIMENTAL_STORE_SCHEMES = ("s3", "s3a")
_S3_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")


def _s3_store_problem(text: str) -> str | None:
    """Why ``text`` (an ``s3://`` or ``s3a://`` URL) is not a usable store root; None if it is (no secret shown)."""
    rest = text.split("://", 1)[1]
    bucket, _, prefix = rest.partition("/")
    if "@" in bucket or ":" in bucket:
        return ("the URL carries credentials or a port in its authority: give s3://bucket/prefix, and the "
                "credentials through [speculative] s3_conn_id or the AWS environment")
    if "?" in rest or "#" in rest:
        return "the URL has a query or fragment: give s3://bucket/prefix"
    if not _S3_BUCKET.fullmatch(bucket) or ".." in bucket:
        return f"{bucket!r} is not an S3 bucket name (3-63 lower-case letters, digits, '.' and '-')"
    segments = prefix.strip("/").split("/") if prefix.strip("/") else []
    if any(s in ("", ".", "..") for s in segments):
        return "the prefix has empty, '.' or '..' segments, which S3 keeps as literal key names"
    if any(ord(c) < 0x20 or ord(c) == 0x7F or c == "\\" for c in prefix):
        return "the prefix has a control character or a backslash"
    return None


def s3_store_url_problem(text: str) -> str | None:
    """Why ``text`` (an ``s3://`` or ``s3a://`` URL) is not a usable store root, never echoing it; None if it is."""
    return _s3_store_problem(text)


def check_store_opt_in(config: SpeculativeConfig, where: str) -> None:
    """Refuse an ``s3://`` ``store_path`` unless ``experimental_s3_store`` is set in the same configuration."""
    scheme = url_scheme(config.store_path)
    if scheme in EXPERIMENTAL_STORE_SCHEMES and not config.experimental_s3_store:
        raise _bad("store_path", redact_url(config.store_path), where,
                   f"store scheme {scheme!r} is not supported (supported: a local path or file://; a shared POSIX "
                   "mount such as NFS works as file://); a store on S3 is experimental and needs "
                   "[speculative] experimental_s3_store = true (docs/store.md)")


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


def _auto_duration(name: str, value: Any, where: str) -> float | None:
    """None for 'auto' (derived from what the stage measures), else a duration in seconds."""
    if value is None or (isinstance(value, str) and value.strip().lower() == "auto"):
        return None
    return _duration(name, value, where)


def _choice(name: str, value: Any, where: str, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise _bad(name, value, where, "must be " + " or ".join(repr(c) for c in choices))
    return str(value)


def _store_path(name: str, value: Any, where: str) -> str:
    text = _text(name, value, where)
    if not text:
        return text  # the default, $AIRFLOW_HOME/speculative-store
    if url_scheme(text) in EXPERIMENTAL_STORE_SCHEMES:
        # Only the URL's text is judged here; whether S3 is allowed at all is the opt-in's (check_store_opt_in).
        problem = _s3_store_problem(text)
        if problem:
            raise _bad(name, redact_url(text), where, problem)
        return text.rstrip("/")
    # Fail when the DAG is parsed, not when an attempt starts; no I/O: only the path's text is judged.
    local = os.path.expanduser(store_root_path(text, where))
    if "\0" in local:
        raise _bad(name, value, where, "contains a NUL byte")
    if not os.path.isabs(local):
        raise _bad(name, value, where, "must be an absolute path or file:// URL (a relative one would be resolved "
                                       "against each process's own working directory)")
    normal = os.path.normpath(local)
    home = os.path.normpath(os.path.expanduser(os.environ.get("AIRFLOW_HOME") or "~/airflow"))
    if normal == "/" or normal == home:
        # gc removes DAG-run directories under the root: never the filesystem's or Airflow's own.
        which = "/" if normal == "/" else "AIRFLOW_HOME"
        raise _bad(name, value, where, f"must be a directory of its own, not {which} "
                                       f"(the default is {os.path.join(home, 'speculative-store')})")
    return text


def _history_url(name: str, value: Any, where: str) -> str:
    """An absolute http(s) URL with a host, or "" (no link): the UI renders it as an ``href``."""
    from airflow_provider_speculative.core.urls import http_url_problem

    text = _text(name, value, where).strip()
    if not text:
        return ""
    problem = http_url_problem(text)
    if problem:
        raise _bad(name, value, where, f"{problem}; expected an absolute http(s) URL such as "
                                       "'http://spark-history:18080'")
    return text


def _conn_id(name: str, value: Any, where: str) -> str:
    """An Airflow connection id, or "" (off): letters, digits, ``_``, ``.`` and ``-`` only."""
    text = _text(name, value, where).strip()
    if text and not re.fullmatch(r"[A-Za-z0-9_.\-]{1,250}", text):
        raise _bad(name, value, where, "expected an Airflow connection id (letters, digits, '_', '.', '-') or empty")
    return text


def _text(name: str, value: Any, where: str) -> str:
    if value is not None and not isinstance(value, str | os.PathLike):
        raise _bad(name, value, where, "expected a string")
    return os.fspath(value) if value else ""


# -- the options: each [speculative] option is one field of SpeculativeConfig ----------------------

Parser = Callable[[str, Any, str], Any]
_T = TypeVar("_T")


@dataclass(frozen=True)
class OptionSpec:
    """What a config field's metadata says of its option: parser, doc and how Airflow and the docs show it."""

    parse: Parser
    doc: str
    # Type in provider info (Airflow's config declares "string", "boolean", "integer" or "float").
    type: str = "string"
    # How airflow.cfg shows the default; None: str(default).
    default_string: str | None = None
    # What docs/configuration.md's option table shows as the default; None: the default string in backticks.
    readme_default: str | None = None
    # The meaning column of docs/configuration.md (Markdown, may link); None: ``doc`` in the table's style.
    manual: str | None = None


@dataclass(frozen=True)
class Option(OptionSpec):
    """One ``[speculative]`` option: its field's name and default with the spec from the field's metadata."""

    name: str = field(kw_only=True)
    default: Any = field(kw_only=True)

    def show_default(self) -> str:
        """The default as the string Airflow's config declares (parses back to ``default``)."""
        return str(self.default) if self.default_string is None else self.default_string

    def table_row(self) -> str:
        """This option's row of the option table in docs/configuration.md (generated: ``make docs``)."""
        meaning = self.manual if self.manual is not None else self.doc[0].lower() + self.doc[1:].rstrip(".")
        return f"| `{self.name}` | {self.readme_default or f'`{self.show_default()}`'} | {meaning} |"


# The metadata key under which a config field keeps its OptionSpec.
OPTION_SPEC = "speculative_option"


def _spec(parse: Parser, doc: str, type: str = "string", *, default_string: str | None = None,
          readme_default: str | None = None, manual: str | None = None) -> dict[str, OptionSpec]:
    return {OPTION_SPEC: OptionSpec(parse, doc, type, default_string, readme_default, manual)}


# field() is typed as returning its default, so these helpers keep each field's annotation checked
# against its default while the dataclass receives the Field that carries the spec.
def _option(default: _T, parse: Parser, doc: str, type: str = "string", *, default_string: str | None = None,
            readme_default: str | None = None, manual: str | None = None) -> _T:
    return field(default=default, metadata=_spec(parse, doc, type, default_string=default_string,
                                                  readme_default=readme_default, manual=manual))


def _bool_option(default: bool, doc: str, manual: str | None = None) -> bool:
    return _option(default, _bool, doc, "boolean", manual=manual)


def _int_option(default: int, doc: str, minimum: int, manual: str | None = None) -> int:
    return _option(default, lambda n, v, w: _int(n, v, w, minimum), doc, "integer", manual=manual)


def _duration_option(default: float, doc: str, *, positive: bool = False, readme_default: str | None = None,
                     minimum: float | None = None, manual: str | None = None) -> float:
    def parse(n: str, v: Any, w: str) -> float:
        seconds = _duration(n, v, w)
        if positive and seconds <= 0:
            raise _bad(n, v, w, "must be > 0")
        if minimum is not None and seconds < minimum:
            raise _bad(n, v, w, f"must be at least {minimum:g} s")
        return seconds

    return _option(default, parse, doc, default_string=f"{default:g}",
                   readme_default=readme_default or f"`{default:g}` s", manual=manual)


def _float_option(default: float, doc: str, check: Callable[[float], bool], why: str,
                  manual: str | None = None) -> float:
    def parse(n: str, v: Any, w: str) -> float:
        number = _float(n, v, w)
        if not check(number):
            raise _bad(n, v, w, why)
        return number

    return _option(default, parse, doc, "float", manual=manual)


@dataclass(frozen=True)
class SpeculativeConfig:
    """All options of the ``[speculative]`` section, after parsing and validation.

    Each field is the option's one declaration: its name, type and default, and in its metadata the
    parser and documentation (:class:`OptionSpec`); :data:`OPTIONS`, provider info and the docs' option
    table derive from these fields.
    """

    enabled: bool = _bool_option(False, "Launch speculative attempts for slow subtasks.")
    max_concurrent_executions: int = _int_option(2, "Live attempts per subtask, original included (>= 1).", 1)
    block_slow_node_duration: float = _duration_option(
        60.0, "Seconds a slow node stays blocked for new attempts (>= 0).",
        manual="how long a slow node is blocked for new attempts")
    # Below 10 ms a controller only spins in the triggerer every stage of the deployment shares.
    check_interval: float = _duration_option(
        1.0, "Seconds between controller checks (>= 0.01).", positive=True, minimum=0.01,
        manual="controller check interval (>= 0.01 s); an attempt that starts, gets its Spark session or ends wakes "
               "the controller sooner (see [What happens at run time](running.md#what-happens-at-run-time))")
    fork_server: bool = _bool_option(
        True, "Start attempts from a per-host fork server that has pyspark's Connect client imported "
              "(false: a fresh interpreter per attempt).",
        manual="start each attempt's supervisor, and a Spark Connect attempt's Python client, by forking a per-host, "
               "per-user fork server that has pyspark's Connect client, pandas, pyarrow and grpc imported, instead of "
               "two fresh interpreters; `False`: fresh interpreters. See [Warm attempt "
               "start](connect.md#warm-attempt-start) for what it saves")
    start_in_triggerer: bool = _bool_option(
        True, "Start stage tasks in the triggerer (start_from_trigger): plan, run and commit there, with no worker "
              "run per stage (false: plan on a worker, defer, finalize on a worker). Read when the DAG is parsed.",
        manual="stage tasks start in the triggerer (Airflow's `start_from_trigger`): when its upstreams succeed, the "
               "scheduler defers the task straight into the triggerer, which plans the stage, runs it and commits it "
               "(the sink too); no worker process, DAG parse or executor slot per stage. `False`: plan on a worker, "
               "defer, finalize on a worker (also what `commit_in_triggerer=False` on a stage does). Read when the DAG "
               "is parsed; `dag.test()` always plans on the worker. See [Where a stage "
               "runs](running.md#where-a-stage-runs)")
    fast_exit: bool = _bool_option(
        True, "At the end of an `airflow dags test` process that ran a stage, collect garbage once and leave the rest "
              "out of the interpreter's shutdown collection (false: Python's own exit).",
        manual="at the end of the `airflow dags test` command once a stage ran in it: collect the garbage present at "
               "exit once (its finalizers run), then freeze what is still alive so CPython's shutdown collection "
               "skips it, which otherwise costs seconds after the DAG run has ended. Never in a scheduler, "
               "triggerer, worker or a script or test calling `dag.test()`. "
               "`False`: Python's own exit. See [Airflow's exit](../bench/README.md#airflows-exit-2026-11-29-issue-39)")
    # None: 'auto', derived from start-up times (core/detector.py).
    baseline_lower_bound: float | None = _option(
        None, _auto_duration,
        "Lower bound of the slow-task baseline: 'auto' (twice the median start-up time of the stage's finished "
        "attempts, at least 1 s) or seconds (>= 0).",
        default_string="auto", readme_default="`auto`",
        manual="B, lower bound of the baseline: `auto` = twice the median start-up time (launch to a ready Spark "
               "session) of the stage's finished attempts, at least 1 s; or a duration (Flink's default was 60 s, "
               "which never calls a seconds-long attempt slow)")
    speed_check_age: float = _duration_option(
        3600.0, "Check the speed of Spark Connect targets when a stage starts if a target's speed record is missing, "
                "slow or older than this (0: never check).",
        readme_default="`3600` s (1 hour)",
        manual="before a stage's first wave, time one tiny query on every Spark Connect target at once when one of "
               "them has no speed record from this DAG run and its record is missing, slow or older than this; a "
               "server at least 2x slower than the fastest gets fewer originals from the start. `0`: never check "
               "(see [Speed-aware placement](running.md#speed-aware-placement))")
    baseline_ratio: float = _float_option(
        0.75, "Fraction of subtasks that must finish before a baseline exists (0 < r <= 1).",
        lambda r: 0 < r <= 1, "must be in (0, 1]",
        manual="R, fraction of subtasks that must finish before a baseline exists (0 < R <= 1)")
    baseline_multiplier: float = _float_option(
        1.5, "Baseline = median execution time of the earliest finishers times this (>= 1).",
        lambda m: m >= 1, "must be >= 1", manual="M (>= 1)")
    normalize_by_input_bytes: bool = _bool_option(
        True, "Compare execution time per input byte when input sizes are known (not on a target known to be "
              "slow).",
        manual="also compare execution time per input byte, so a larger split earns more time; not for an attempt "
               "on a target known to be slow, which is held to the plain baseline (see [Speculative "
               "execution](running.md#speculative-execution-flip-168))")
    plan_last_wave: bool = _bool_option(
        True, "In a stage's last wave, place first the speculative copy (or large original) expected to end last "
              "when the speed estimates say that ends it and the originals it overtakes sooner, and keep originals "
              "and copies off a slow target they would end on later than after waiting (false: originals first, as "
              "Spark places them).",
        manual="in a stage's last wave (the queued original attempts fit in the slots of targets that are not slow), "
               "placement models the rest of the wave from the scheduler's speed estimates: in a round that wants a "
               "copy, the launch expected to end last (a copy of a long-running original, or a large original queued "
               "behind small ones) takes a free slot of a target that is not slow first when that ends it, and every "
               "original it overtakes, sooner; an original is held off a slow target it would end on after the rest "
               "of the wave, and a copy off one it would end on later, when waiting for a faster target ends it 20 % "
               "sooner. `False`: originals first, as in Spark, and only the holds of [Speed-aware "
               "placement](running.md#speed-aware-placement) points 2-3")
    max_failures_per_subtask: int = _int_option(
        3, "Failed attempts a subtask may have before the stage fails (>= 0).", 0,
        manual="failed attempts a subtask may have before the stage fails with every attempt's cause (a lost input "
               "does not count: it is not the subtask's fault)")
    max_failures_per_stage: int = _int_option(
        10, "Failed attempts a stage run may have in all before it fails (>= 0).", 0,
        manual="failed attempts a stage run may have in all, whatever the cause, before it fails with every "
               "attempt's cause")
    retention: float = _duration_option(
        86400.0, "How long intermediate results stay after the run succeeded and their consumers committed.",
        readme_default="`86400` s (1 day)",
        manual="how long intermediate results stay after the run succeeded and their consumers committed (see "
               "[Partition life cycle and gc](operations.md#partition-life-cycle-and-gc))")
    data_volume_per_subtask: int = _option(
        128 * 1024 ** 2, _size, "Bytes one subtask should read when a stage has parallelism='auto' (e.g. '64MB', "
                                "'1 GiB').",
        default_string="134217728", readme_default="`134217728` (128 MiB)",
        manual='bytes one subtask should read when a stage has `parallelism="auto"`; a size such as `64MB` or `1 '
               "GiB` (binary units)")
    full_waves: bool = _bool_option(
        True, "Round a parallelism='auto' stage's subtask count to whole waves of the targets' slots.",
        manual='round a `parallelism="auto"` stage\'s subtask count to a multiple of its targets\' slots (the '
               "nearer one within the stage's bounds), so its last wave does not leave slots idle; off for "
               "targets with `slots: auto` (their capacity is not known when the stage is planned)")
    broadcast_max_bytes: int = _option(
        256 * 1024 ** 2, _size,
        "Largest input a broadcast(...) input may have when its consumer is planned: every consumer subtask reads "
        "all of it (e.g. '64MB', '1 GiB').",
        default_string="268435456", readme_default="`268435456` (256 MiB)",
        manual="largest input a `broadcast(...)` input may have, checked when its consumer is planned (every "
               "consumer subtask reads all of it); a size such as `64MB`")
    balanced_exchange_ranges: bool = _bool_option(
        True, "Give all_to_all consumers subpartition ranges of about equal bytes (false: equal counts).",
        manual="give `all_to_all` consumers contiguous subpartition ranges of about equal bytes (from the producers' "
               "committed sizes); `False`: equal counts `[i·P/M, (i+1)·P/M)`")
    exchange_layout: str = _option(
        AUTO, lambda n, v, w: _choice(n, v, w, EXCHANGE_LAYOUTS),
        "How a keyed exchange is written: 'partitioned' (one file per Spark task and subpartition), 'packed' (one "
        "file per Spark task, rows sorted by subpartition, read by Parquet statistics) or 'auto' (packed).",
        manual="how a keyed exchange is written: `partitioned` = one file per Spark task and subpartition "
               "(`_sp=N/`); `packed` = one file per Spark task with its rows sorted by subpartition and a "
               "subpartition index in the manifest, read through Parquet's statistics (fewer objects: fewer "
               "requests on an object store, fewer files and less CPU on a file system); `auto` = `packed` on every "
               "store. See [Exchange layouts](store.md#exchange-layouts)")
    exchange_commit: str = _option(
        AUTO, lambda n, v, w: _choice(n, v, w, EXCHANGE_COMMITS),
        "How an attempt's Spark job commits an exchange's files: 'auto' (the provider's direct commit protocol "
        "where the target's spark.jars holds its jar, else Hadoop's committer) or 'hadoop' (Hadoop's always).",
        manual="how an attempt's Spark job commits an exchange's files: `auto` = written straight to their final "
               "names, one per Spark task attempt, and named in a list at job commit, where the target's "
               "`spark.jars` holds the provider's commit protocol jar (`local-cluster` adds it), else Hadoop's "
               "file output committer; `hadoop` = Hadoop's committer always (files written under `_temporary/` "
               "and moved: on an object store a copy and a delete per file). See [Exchange "
               "commit](store.md#exchange-commit)")
    failover_strategy: str = _option(
        "region", lambda n, v, w: _choice(n, v, w, ("region", "all")),
        "What reruns when an input partition is lost: 'region' (only the affected region) or 'all'.",
        manual="what reruns when an input partition is lost: `region` (only the affected region, FLIP-1) or `all` "
               "(every subtask of the producer, for comparison)")
    slot_wait_timeout: float = _duration_option(
        600.0, "How long a stage waits for a live slot (every target lost or without capacity) before it fails "
               "(> 0).", positive=True,
        manual="how long a stage waits for a live slot (every target lost, or a reactive target without an alive "
               "worker) before it fails naming pipeline, stage and targets (> 0); see [Targets and "
               "slots](#targets-and-slots)")
    slot_priority: str = _option(
        FIFO, lambda n, v, w: _choice(n, v, w, SLOT_PRIORITIES),
        "Order of slot claims between stage runs of one DAG run sharing a target: 'critical_path' (a stage with a "
        "longer chain of stages after it claims free slots first) or 'fifo' (first come, first served).",
        manual="order of slot claims between the stage runs of one DAG run that share a target: `critical_path` = a "
               "stage whose chain of downstream stages is longer (estimated in waves of the targets' slots from the "
               "pipeline graph) claims free slots first, and a stage behind it leaves as many free slots as the stages "
               "ahead of it have originals waiting (never more, so nothing starves); `fifo` = first come, first "
               "served. See [Targets and slots](#targets-and-slots)")
    hybrid_min_admitted_share: float = _float_option(
        0.5, "A consumer of an all_to_all hybrid exchange starts once this share of its producers is admitted, and "
             "reads the rest as they are admitted (0 < s <= 1).",
        lambda s: 0 < s <= 1, "must be in (0, 1]",
        manual="a consumer of an `all_to_all` hybrid exchange starts once this share of its producers is admitted "
               "and reads the rest incrementally (0 < s <= 1); see [Hybrid "
               "exchanges](authoring.md#hybrid-exchanges-flip-235)")
    hybrid_input_timeout: float = _duration_option(
        3600.0, "How long a consumer of a hybrid exchange waits for its producer stage's plan, and an attempt's "
                "read for its producers' admissions, before failing (> 0).", positive=True,
        manual="how long a hybrid consumer waits for its producer stage's plan, and a read for its producers' "
               "admissions, before it fails naming pipeline, stage and input (> 0)")
    executor_loss_timeout: float = _duration_option(
        60.0, "On a cluster master: an attempt whose executors are all gone (or never came) for this long fails as "
              "'node lost' and its node is blocked (0: never).",
        manual='on a cluster master, an attempt whose executors are all gone (or never came) for this long fails as '
               '"node lost" and its node is blocked (`0`: never); see [docs/clusters.md](clusters.md)')
    driver_log_lines: int = _int_option(
        20, "Lines of each attempt's driver log the controller trigger copies into the task log per check (the "
            "latest ones; 0: none).", 0,
        manual="lines of each attempt's driver log the controller trigger copies into the Airflow task log per "
               "check while the stage runs (the latest ones, after a `... K lines skipped` marker), and its last "
               "lines when it ends; `0`: none. See [Driver logs in the task log](operations.md#driver-logs-in-the-"
               "task-log)")
    driver_log_bytes: int = _option(
        16 * 1024, _size, "Bytes of each attempt's driver log read per check for the task log (e.g. '16KB').",
        default_string="16384", readme_default="`16384` (16 KiB)",
        manual="bytes of each attempt's driver log read per check for the task log: a driver that wrote more "
               "since the last check gets its latest bytes shown and the rest skipped; a size such as `16KB`")
    store_path: str = _option(
        "", _store_path,
        "Root of the result store: a local path or file:// URL (s3:// only with experimental_s3_store); empty "
        "means $AIRFLOW_HOME/speculative-store.",
        readme_default="`$AIRFLOW_HOME/speculative-store`",
        manual="root of the result store: an absolute path or a `file://` URL, shared by every host that runs "
               "attempts, or `s3://bucket/prefix` with `experimental_s3_store` (other schemes are refused naming the "
               "scheme; see [docs/store.md](store.md)); neither `/` "
               "nor `$AIRFLOW_HOME` itself, and a directory the provider creates or finds empty (see [Partition "
               "life cycle and gc](operations.md#partition-life-cycle-and-gc))")
    experimental_s3_store: bool = _bool_option(
        False, "Accept an s3:// store_path (experimental: tested on S3-compatible endpoints, not on AWS S3).",
        manual="accept an `s3://bucket/prefix` (or `s3a://`) `store_path`: the store on S3, with the credentials of "
               "`s3_conn_id` or the AWS environment (the attempts get the connection's in their launch environment). "
               "Experimental: the fault tests pass on the suite's S3-compatible endpoint, not yet measured on AWS "
               "S3, and a run costs more than on a file system ([docs/status.md](status.md)); without it such a "
               "`store_path` is refused naming the scheme. See "
               "[The store on S3](store.md#the-store-on-s3-experimental)")
    spark_history_url: str = _option(
        "", _history_url, "Spark history server URL for the UI's links to admitted attempts; empty: no link.",
        readme_default="empty",
        manual="Spark history server URL, absolute `http://` or `https://` with a host (anything else is refused; "
               "see [SECURITY.md](../SECURITY.md)); the UI and the operator extra links then link admitted "
               "attempts to it")
    asset_events_conn_id: str = _option(
        DEFAULT_ASSET_EVENTS_CONN_ID, _conn_id,
        "HTTP connection to Airflow's api-server through which a stage that ends in the triggerer records its "
        "sink's asset event (no worker run); when the default connection is not defined, or the option is empty, "
        "the task resumes on a worker to record it.",
        manual="an `http` connection to Airflow's api-server (host = its base URL; login and password of a user who "
               "may create asset events, or extra `token`); a stage started in the triggerer then records its "
               "sink's asset event through the REST API and ends there, instead of resuming on a worker (saves a "
               "scheduler round trip and a worker start per run). If the default connection is not defined, or the "
               "option is empty, the worker records it; a connection named here that does not exist fails the "
               "stage at plan. See [Asset events without a worker](running.md#asset-events-without-a-worker)")
    s3_conn_id: str = _option(
        "", _conn_id,
        "Airflow aws connection for s3:// sources (login, password, extras endpoint_url and region_name); empty: "
        "the standard AWS environment variables.",
        readme_default="empty",
        manual="an `aws` connection for `s3://` sources, listed and checked at plan (login = access key id, "
               "password = secret key, extras `endpoint_url`, `region_name`, `aws_session_token`); empty: the "
               "standard AWS environment (`AWS_ACCESS_KEY_ID`, `AWS_ENDPOINT_URL_S3`, ...). When a stage's store or "
               "sources are on S3, its attempts get the connection as that environment (a Spark Connect server keeps "
               "its own); see [Sources on S3](store.md#sources-on-s3)")
    targets: tuple[Target, ...] = _option(
        DEFAULT_TARGETS, _targets,
        "JSON list of targets: name, conn_id, slots (a number, or 'auto' with master_ui), node, conf.",
        default_string=json.dumps([asdict(t) for t in DEFAULT_TARGETS]), readme_default="two local targets",
        manual='JSON list of `{name, conn_id, slots, node, conf}` (`slots` a number, or `"auto"` with `master_ui`); '
               "see below. Unset, Airflow gets two local targets `local-a`, `local-b` on `spark_default` with one "
               "slot per host core between them (`max(1, cores // 2)` each, the cores this process may run on)")

    def with_overrides(self, overrides: dict[str, Any] | None, where: str) -> SpeculativeConfig:
        """Return a copy with ``overrides`` applied; ``where`` names the source in error messages."""
        if not overrides:
            return self
        parsed = {name: parse_option(name, value, where) for name, value in overrides.items()}
        result = replace(self, **parsed)
        check_store_opt_in(result, where)
        return result

    def to_json(self) -> dict[str, Any]:
        """Serialise to plain JSON types (for plan.json and trigger kwargs)."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["targets"] = [asdict(t) for t in self.targets]
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SpeculativeConfig:
        """Inverse of ``to_json``; a name of :data:`NOT_OPTIONS` a plan carries is ignored (it configures nothing)."""
        return cls().with_overrides({k: v for k, v in data.items() if k not in NOT_OPTIONS}, "plan")


def options_of(config_class: type[Any]) -> tuple[Option, ...]:
    """The options a config dataclass declares, in field order; a field without its spec or default is refused."""
    options = []
    for f in fields(config_class):
        spec = f.metadata.get(OPTION_SPEC)
        where = f"{config_class.__name__}.{f.name}"
        if not isinstance(spec, OptionSpec):
            raise TypeError(f"{where} has no option spec (parser and doc): declare it with _option() or "
                            f"field(metadata=_spec(...))")
        if not callable(spec.parse) or not spec.doc.strip():
            raise TypeError(f"{where}: its option spec needs a parser and a doc line")
        if f.default is not MISSING:
            default = f.default
        elif f.default_factory is not MISSING:
            default = f.default_factory()
        else:
            raise TypeError(f"{where} has no default")
        options.append(Option(**{s.name: getattr(spec, s.name) for s in fields(spec)}, name=f.name, default=default))
    return tuple(options)


OPTIONS: tuple[Option, ...] = options_of(SpeculativeConfig)
OPTION_BY_NAME: dict[str, Option] = {o.name: o for o in OPTIONS}
OPTION_DOCS: dict[str, str] = {o.name: o.doc for o in OPTIONS}


# Names a DAG or airflow.cfg may set that are not options, and what to use instead: setting one is an error.
NOT_OPTIONS: dict[str, str] = {
    "fault_injection": f"fault injection is a test facility, not an option: set the environment variable "
                       f"{FAULTS_ENV} of the processes under test instead (CONTRIBUTING.md, \"Injecting faults\")",
}


def not_an_option_error(name: str, where: str) -> ConfigError:
    """The error for setting a name of :data:`NOT_OPTIONS`, naming it and saying what to use instead."""
    return ConfigError(f"[{SECTION}] {name} ({where}): {NOT_OPTIONS[name]}")


def parse_option(name: str, value: Any, where: str) -> Any:
    """Parse and validate one option value, raising :class:`ConfigError` naming it."""
    if name in NOT_OPTIONS:
        raise not_an_option_error(name, where)
    option = OPTION_BY_NAME.get(name)
    if option is None:
        raise ConfigError(f"[{SECTION}] unknown option {name!r} ({where}); known options: {', '.join(OPTION_BY_NAME)}")
    return option.parse(name, value, where)


def unknown_options(names: Any) -> list[str]:
    """The names in ``names`` that are neither options nor in :data:`NOT_OPTIONS` (misspellings), sorted."""
    return sorted(str(n) for n in names if str(n) not in OPTION_BY_NAME and str(n) not in NOT_OPTIONS)


def options_table() -> str:
    """The option table of docs/configuration.md, generated from :data:`OPTIONS` (``make docs`` writes it)."""
    return "\n".join(["| option | default | meaning |", "|---|---|---|", *(o.table_row() for o in OPTIONS)])


def default_strings() -> dict[str, str]:
    """The defaults as the strings Airflow's config declares (provider info)."""
    return {o.name: o.show_default() for o in OPTIONS}
