"""Fault injection for tests and demos: what to inject into which stage, and the hook production code asks.

Faults are not a ``[speculative]`` option and never part of a plan. Production code asks the hook
(:func:`current`) for a stage's faults (:meth:`Faults.of_stage`) and calls what it answers: the
scheduler's forced slow subtasks, the environment of an attempt, the trigger's hold after a commit,
the supervisor's held end, the attempt's slow-down, failure or barrier. Nothing fills the hook in
production, so every answer is "nothing".

A test fills it in through the environment variable ``SPECULATIVE_FAULT_INJECTION`` (:data:`FAULTS_ENV`),
read by every process that runs a stage (triggerer, worker, ``dag.test()``, the runner, supervisors and
attempts), or passes a :class:`Faults` to ``StageController`` directly. Its value is JSON: either one
stage's faults, for every stage, or ``{"stages": {"<dag_id>/<stage>": {...}, ...}}`` whose keys may use
shell wildcards (first match wins). A controller hands its stage's faults to each attempt's environment,
so a hook given to it in-process reaches the attempts too. ``devtools/faults.py`` builds the variable.
"""

from __future__ import annotations

import fnmatch
import json
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, TypeVar

from airflow_provider_speculative.core.config import SECTION, _bool, _duration, _float, _int
from airflow_provider_speculative.core.contract import FAULTS_ENV, HOLD_END_ENV
from airflow_provider_speculative.exceptions import ConfigError, PlanError

_T = TypeVar("_T")
STAGE_KEYS = ("targets", "attempts", "force_speculation", "barrier", "hold_end", "hold_commit")


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
    """One stage's faults: slow targets and chosen attempts, forced copies, holds. Empty means none."""

    targets: dict[str, FaultSpec] = field(default_factory=dict)
    attempts: dict[tuple[int, int], FaultSpec] = field(default_factory=dict)
    # Subtasks treated as slow from the start (when speculation is on), so concurrent attempts exist deterministically.
    force_speculation: frozenset[int] = frozenset()
    # Attempts hold their manifest until <stage dir>/barrier.release.<subtask> exists: finishes land together.
    barrier: bool = False
    # Supervisors of attempts that succeeded hold their FINISHED record until that same release file
    # exists: the controller, which wakes on each record, sees two attempts end together.
    hold_end: bool = False
    # A trigger that committed a stage holds its TaskSuccessEvent until <stage dir>/commit.release exists
    # (it writes commit.held first): a test can kill the triggerer between the commit and the event.
    hold_commit: bool = False

    @property
    def active(self) -> bool:
        """True if any fault is injected."""
        return self != FaultInjection()

    def for_attempt(self, target: str, subtask: int, attempt: int) -> FaultSpec:
        """Return the fault applied to one attempt; a per-attempt rule wins over a target rule."""
        return self.attempts.get((subtask, attempt)) or self.targets.get(target) or FaultSpec()

    def attempt_env(self, release: str) -> dict[str, str]:
        """What an attempt's environment carries of these faults (none: nothing); ``release``: its held end's file."""
        if not self.active:
            return {}
        env = {FAULTS_ENV: json.dumps(self.to_json())}
        if self.hold_end:
            env[HOLD_END_ENV] = release
        return env

    def check_targets(self, targets: Iterable[str], where: str) -> None:
        """Refuse target rules naming none of ``targets`` (a misspelt target would silently inject nothing)."""
        planned = sorted(targets)
        unknown = sorted(set(self.targets) - set(planned)) if planned else []
        if unknown:
            raise PlanError(f"{where}: {FAULTS_ENV} names targets {unknown} that are not targets of this stage "
                            f"({', '.join(planned)})")

    def to_json(self) -> dict[str, Any]:
        """Serialise to the documented JSON form."""
        return {
            "targets": {name: asdict(spec) for name, spec in self.targets.items()},
            "attempts": [
                {"subtask": s, "attempt": a, **asdict(spec)} for (s, a), spec in self.attempts.items()
            ],
            "force_speculation": sorted(self.force_speculation),
            "barrier": self.barrier,
            "hold_end": self.hold_end,
            "hold_commit": self.hold_commit,
        }


NO_FAULTS = FaultInjection()


@dataclass(frozen=True)
class Faults:
    """The fault-injection hook: each stage's faults by ``<dag_id>/<stage>`` pattern. ``Faults()`` injects nothing."""

    rules: tuple[tuple[str, FaultInjection], ...] = ()
    # The file a supervisor waits for before it records a successful end (hold_end), from its attempt's environment.
    hold_end_release: str | None = None

    def of_stage(self, dag_id: str, stage: str) -> FaultInjection:
        """The faults of one stage (its store key): the first rule whose pattern matches, else none."""
        key = f"{dag_id}/{stage}"
        return next((faults for pattern, faults in self.rules if fnmatch.fnmatchcase(key, pattern)), NO_FAULTS)


def _bad(name: str, value: Any, where: str, why: str) -> ConfigError:
    shown = repr(value)
    if len(shown) > 60:
        shown = f"{shown[:24]}...{shown[-8:]} ({len(shown)} characters)"
    return ConfigError(f"{name} = {shown} ({where}): {why}")


def _checked(parse: Callable[[str, Any, str], _T], name: str, value: Any, where: str) -> _T:
    """An option parser's answer, its error message naming the variable instead of the option section."""
    try:
        return parse(name, value, where)
    except ConfigError as exc:
        raise ConfigError(str(exc).removeprefix(f"[{SECTION}] ")) from None


def _fault_spec(name: str, raw: Any, where: str) -> FaultSpec:
    if not isinstance(raw, dict):
        raise _bad(name, raw, where, "expected an object with factor, delay or fail")
    unknown = set(raw) - {"factor", "delay", "fail", "subtask", "attempt"}
    if unknown:
        raise _bad(name, raw, where, f"unknown keys {sorted(unknown)}")
    factor = _checked(_float, f"{name}.factor", raw.get("factor", 1.0), where)
    if factor < 1.0:
        raise _bad(f"{name}.factor", factor, where, "must be >= 1")
    return FaultSpec(factor=factor, delay=_checked(_duration, f"{name}.delay", raw.get("delay", 0), where),
                     fail=_checked(_bool, f"{name}.fail", raw.get("fail", False), where))


def parse_fault_injection(name: str, raw: Any, where: str) -> FaultInjection:
    """One stage's faults from their JSON object (or ``None``: none); ConfigError naming ``name`` otherwise."""
    if raw is None or isinstance(raw, FaultInjection):
        return raw or NO_FAULTS
    if not isinstance(raw, dict) or set(raw) - set(STAGE_KEYS):
        raise _bad(name, raw, where, "expected {targets: {...}, attempts: [...], force_speculation: [...], "
                                     "barrier: bool, hold_end: bool, hold_commit: bool}")
    if not isinstance(raw.get("targets") or {}, dict):
        raise _bad(f"{name}.targets", raw.get("targets"), where,
                   "expected an object {target name: {factor, delay, fail}}")
    if not isinstance(raw.get("attempts") or [], list | tuple):
        raise _bad(f"{name}.attempts", raw.get("attempts"), where, "expected a list of {subtask, attempt, ...}")
    targets = {str(t): _fault_spec(f"{name}.targets.{t}", spec, where)
               for t, spec in (raw.get("targets") or {}).items()}
    attempts = {}
    for item in raw.get("attempts") or []:
        if not isinstance(item, dict) or "subtask" not in item:
            raise _bad(f"{name}.attempts", item, where, "each entry needs 'subtask' (and optionally 'attempt')")
        key = (_checked(lambda n, v, w: _int(n, v, w, 0), f"{name}.attempts.subtask", item["subtask"], where),
               _checked(lambda n, v, w: _int(n, v, w, 0), f"{name}.attempts.attempt", item.get("attempt", 0), where))
        attempts[key] = _fault_spec(f"{name}.attempts", item, where)
    forced = raw.get("force_speculation") or []
    if not isinstance(forced, list | tuple):
        raise _bad(f"{name}.force_speculation", forced, where, "expected a list of subtask indexes")
    return FaultInjection(
        targets=targets, attempts=attempts,
        force_speculation=frozenset(_checked(lambda n, v, w: _int(n, v, w, 0), f"{name}.force_speculation", i, where)
                                    for i in forced),
        barrier=_checked(_bool, f"{name}.barrier", raw.get("barrier", False), where),
        hold_end=_checked(_bool, f"{name}.hold_end", raw.get("hold_end", False), where),
        hold_commit=_checked(_bool, f"{name}.hold_commit", raw.get("hold_commit", False), where))


def parse_faults(value: Any, where: str = "environment") -> Faults:
    """The hook's rules from ``SPECULATIVE_FAULT_INJECTION``'s value (JSON text or its parsed form)."""
    raw = value
    if isinstance(value, str):
        if not value.strip():
            return Faults()
        try:
            raw = json.loads(value)
        except json.JSONDecodeError as exc:
            raise _bad(FAULTS_ENV, value, where, f"invalid JSON: {exc}") from None
    if not raw:
        return Faults()
    if not isinstance(raw, dict):
        raise _bad(FAULTS_ENV, raw, where, 'expected an object: one stage\'s faults, or {"stages": {...}}')
    if "stages" not in raw:
        return Faults(rules=(("*", parse_fault_injection(FAULTS_ENV, raw, where)),))
    stages = raw["stages"]
    if set(raw) != {"stages"} or not isinstance(stages, dict):
        raise _bad(FAULTS_ENV, raw, where, 'expected {"stages": {"<dag_id>/<stage>": {...}}} with no other key '
                                           "(or one stage's faults for every stage)")
    rules = []
    for pattern, faults in stages.items():
        if not isinstance(pattern, str) or "/" not in pattern:
            raise _bad(f"{FAULTS_ENV}.stages", pattern, where, "keys are '<dag_id>/<stage>' (wildcards allowed)")
        rules.append((pattern, parse_fault_injection(f"{FAULTS_ENV}.stages.{pattern}", faults, where)))
    return Faults(rules=tuple(rules))


def faults_from_environ(environ: Mapping[str, str]) -> Faults:
    """The hook as a process's environment fills it in (``Faults()`` when it names no fault)."""
    faults = parse_faults(environ.get(FAULTS_ENV) or "", f"environment variable {FAULTS_ENV}")
    release = environ.get(HOLD_END_ENV) or None
    return Faults(faults.rules, release) if release else faults


_loaded: tuple[tuple[str | None, str | None], Faults] | None = None


def current() -> Faults:
    """This process's hook, from its environment; re-read when the variables change (a forked supervisor's do)."""
    global _loaded
    key = (os.environ.get(FAULTS_ENV), os.environ.get(HOLD_END_ENV))
    if _loaded is None or _loaded[0] != key:
        _loaded = (key, faults_from_environ(os.environ))
    return _loaded[1]
