"""The only reasons a test may skip under CI=true: limits of the host that the suite cannot change.

Everything else a test needs (PostgreSQL, Redis, Chromium, TPC-H data, network namespaces as root) the
suite or `make test` provides, so a skip for it fails under CI=true (tests/conftest.py). Each entry is a
substring of the skip message and why the host, not the suite, decides it; docs/getting-started.md
repeats the list.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

ALLOWED: dict[str, str] = {
    # tests/unit/test_slownode.py runs each throttle method where the kernel offers it: a host has
    # cgroup v1 or v2 (or neither), never both, so one of the two cgroup cases always skips.
    "is not writable here": "a cgroup version this host's kernel does not mount (v1 or v2)",
    # tests/unit/runtime/test_store_failures.py fills a small tmpfs; containers may forbid mounts
    # even to root, and the regular-file test covers the same error path.
    "cannot mount a tmpfs here": "a container that forbids mount(2), even to root",
}


def skip_reason(longrepr: Any) -> str:
    """The message of a skip report (pytest keeps it as (file, line, 'Skipped: message'))."""
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(longrepr)


def allowed(reason: str) -> bool:
    """True if ``reason`` is one of the host limits in :data:`ALLOWED`."""
    return any(key in reason for key in ALLOWED)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """Under CI=true a skip fails unless its reason is one of :data:`ALLOWED`.

    The suite starts or installs every prerequisite it needs; a skip for anything else hides a test that
    did not run (a missing server, data or package) behind a green summary.
    """
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    if not report.skipped or hasattr(report, "wasxfail") or os.environ.get("CI") != "true":
        return
    reason = skip_reason(report.longrepr)
    if not allowed(reason):
        report.outcome = "failed"
        report.longrepr = (f"skipped under CI=true, where every prerequisite must be there: {reason}\n"
                           "(tests/skips.py lists the host limits that may skip; the suite provides the rest)")
