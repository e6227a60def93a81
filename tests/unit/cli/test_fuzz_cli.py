"""Fuzzing the CLI: random arguments to status, logs, rerun and gc end in a clear message and exit code 0, 1 or 2
(argparse's), never a traceback. Hostile ids (``..``, NUL, very long, slashes) never reach outside the store."""

from __future__ import annotations

import argparse
import contextlib
import io
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from airflow_provider_speculative.cli.definition import get_cli_commands

HOSTILE = st.one_of(st.sampled_from(["dag", "run", "s", "..", "../..", "/etc", "a/b", "", " ", "x\x00y", "-1",
                                     "é" * 3, "a" * 300, "%2e%2e", "<script>"]), st.text(max_size=8))
NUMBERS = st.one_of(st.integers(min_value=-5, max_value=10 ** 12).map(str), st.sampled_from(["x", "1.5", "", "nan"]))


def _commands() -> dict[str, Any]:
    group = get_cli_commands()[0]
    return {c.name: c for c in group.subcommands if c.name in ("status", "logs", "rerun", "gc")}


def _parser(command: Any) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=f"airflow speculative {command.name}", exit_on_error=True)
    for arg in command.args:
        arg.add_to_parser(parser)
    return parser


@st.composite
def argv(draw: st.DrawFn) -> tuple[str, list[str]]:
    name = draw(st.sampled_from(["status", "logs", "rerun", "gc"]))
    out: list[str] = []
    options = {"status": ["--dag-id", "--run-id", "--stage", "--output"],
               "logs": ["--dag-id", "--run-id", "--stage", "--subtask", "--attempt", "--tail-bytes", "--output"],
               "rerun": ["--dag-id", "--run-id", "--stage", "--subtask", "--no-downstream", "--dry-run"],
               "gc": ["--dag-id", "--older-than", "--retention", "--dry-run", "--output"]}[name]
    for flag in draw(st.lists(st.sampled_from(options), max_size=6)):
        if flag in ("--no-downstream", "--dry-run"):
            out.append(flag)
        elif flag in ("--subtask", "--attempt", "--tail-bytes"):
            out += [flag, draw(NUMBERS)]
        elif flag in ("--older-than", "--retention"):
            out += [flag, draw(st.one_of(st.sampled_from(["30d", "1h", "0", "-1", "1e999", "soon"]), NUMBERS))]
        elif flag == "--output":
            out += [flag, draw(st.sampled_from(["table", "json", "yaml"]))]
        else:
            out += [flag, draw(HOSTILE)]
    if name == "gc" and "--dry-run" not in out:
        out.append("--dry-run")  # a fuzzer deletes nothing, even in its own temporary store
    return name, out


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("fuzz-store") / "store"
    root.mkdir()
    return root


@settings(max_examples=150, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(argv())
def test_random_cli_arguments_end_in_a_clear_message(store: Path, monkeypatch: pytest.MonkeyPatch,
                                                     drawn: tuple[str, list[str]]) -> None:
    from airflow_provider_speculative import settings as provider_settings
    from airflow_provider_speculative.core.config import SpeculativeConfig

    monkeypatch.setattr(provider_settings, "store_root", lambda config: store)
    monkeypatch.setattr(provider_settings, "airflow_config", SpeculativeConfig)
    name, args = drawn
    command = _commands()[name]
    err, out = io.StringIO(), io.StringIO()
    code = 0
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        try:
            parsed = _parser(command).parse_args(args)
            command.func(parsed)
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
    text = err.getvalue() + out.getvalue()
    assert code in (0, 1, 2), (args, code, text)
    assert "Traceback" not in text, (args, text)
    if code:
        assert text.strip(), f"{args}: exit {code} without a message"
    # Nothing was created outside the store, whatever the ids said.
    assert not any(p.name in ("etc", "<script>") for p in store.parent.iterdir())
