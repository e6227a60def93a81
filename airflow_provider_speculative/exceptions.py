"""The provider's exceptions: one base class, one subclass per kind of failure a caller can act on.

Imports nothing, so the pure core, the store and the runtime (inside the Spark driver) all use it.
Subclasses also derive from the built-in a caller would have caught before (``ValueError``,
``RuntimeError``, ``LookupError``), so existing ``except`` clauses keep working.
"""

from __future__ import annotations


class SpeculativeError(Exception):
    """Base class of every error this provider raises on purpose."""


class ConfigError(SpeculativeError, ValueError):
    """An option has an invalid value; the message names the option and where it came from."""


class PipelineError(SpeculativeError, ValueError):
    """The stage graph is invalid; the message names the pipeline, stage and input at fault."""


class PlanError(SpeculativeError, ValueError):
    """A stage cannot be planned (missing application or source, bad split); raised before any launch."""


class TargetError(SpeculativeError, ValueError):
    """A target cannot be used: unknown connection, unsupported connection type, unreachable server."""


class StoreError(SpeculativeError, RuntimeError):
    """The store cannot be read or written; the message names the path."""


class UnsafeStorePathError(StoreError):
    """A store path reached through a symlink, or not a regular file of its own: refused, never read."""


class StoreFullError(StoreError):
    """The store has no space left."""


class StoreNotWritableError(StoreError):
    """The store is read-only or permissions forbid writing."""


class PartitionError(SpeculativeError, RuntimeError):
    """An input partition is missing or corrupt; names the stage, subtask, attempt and file."""

    def __init__(self, message: str, *, stage: str | None = None, subtask: int | None = None,
                 attempt: int | None = None) -> None:
        super().__init__(message)
        self.stage = stage
        self.subtask = subtask
        self.attempt = attempt


class StageFailedError(SpeculativeError, RuntimeError):
    """A stage run failed (too many failed attempts, a lost partition that could not be re-produced)."""


class UpstreamFailedError(StageFailedError):
    """A producer stage of a consumer already waiting for it failed: the consumer fails too, without retry."""


class UpstreamSkippedError(StageFailedError):
    """A producer stage of a consumer already waiting for it was skipped: the consumer is skipped too."""


class NotFoundError(SpeculativeError, LookupError):
    """A DAG run, stage or subtask asked for by name is not in the store."""

    def __str__(self) -> str:
        # LookupError's str() of a KeyError-like quotes the message; ours is a sentence.
        return str(self.args[0]) if self.args else ""
