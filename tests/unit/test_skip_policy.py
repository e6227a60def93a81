"""Under CI=true a skip fails unless it is a documented host limit (tests/skips.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.skips import ALLOWED, allowed, skip_reason

REPO = Path(__file__).resolve().parents[2]

SAMPLE = '''
import pytest

def test_missing_server():
    pytest.skip("the metadata database server is missing")

def test_host_limit():
    pytest.skip("cgroup-v1 is not writable here (available: cgroup-v2)")

@pytest.mark.skipif(True, reason="TPC-H data missing")
def test_marked():
    pass
'''


def _run(tmp_path: Path, ci: str | None) -> subprocess.CompletedProcess[str]:
    (tmp_path / "test_sample.py").write_text(SAMPLE)
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    if ci is not None:
        env["CI"] = ci
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "tests.skips", "-q", "-rs", "-p", "no:cacheprovider",
                           "--rootdir", str(tmp_path), "-c", os.devnull, str(tmp_path)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=120)


def test_under_ci_a_skip_for_a_missing_prerequisite_fails_and_a_host_limit_does_not(tmp_path: Path) -> None:
    done = _run(tmp_path, "true")
    assert "1 failed, 1 skipped, 1 error" in done.stdout, done.stdout  # a skipif fails at setup: an error
    assert ("skipped under CI=true, where every prerequisite must be there: the metadata database server is missing"
            in done.stdout)
    assert "skipped under CI=true, where every prerequisite must be there: TPC-H data missing" in done.stdout


def test_outside_ci_skips_stay_skips_and_are_listed_with_their_reasons(tmp_path: Path) -> None:
    done = _run(tmp_path, None)
    assert "3 skipped" in done.stdout, done.stdout
    assert "SKIPPED [1]" in done.stdout and "the metadata database server is missing" in done.stdout


def test_the_allowed_reasons_are_few_and_each_documented() -> None:
    assert len(ALLOWED) <= 3
    guide = (REPO / "docs" / "getting-started.md").read_text()
    for key in ALLOWED:
        assert f"`{key}`" in guide, f"docs/getting-started.md does not list the allowed skip {key!r}"
    assert allowed("cgroup-v2 is not writable here (available: sigstop)")
    assert not allowed("no Redis on 127.0.0.1:6379 to reach")
    assert skip_reason(("f.py", 3, "Skipped: why")) == "why"
