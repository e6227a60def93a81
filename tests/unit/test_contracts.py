"""The package spells store file names only in store/ and journal event names only in core/events.py."""

from __future__ import annotations

import ast
from pathlib import Path

from airflow_provider_speculative.core.events import Event

PACKAGE = Path(__file__).resolve().parents[2] / "airflow_provider_speculative"
EVENT_NAMES = {e.value for e in Event}

# (file, name) pairs allowed to spell a store file or journal event name by hand; empty: every module uses
# StageLayout and core/events.py.
FILE_NAME_EXCEPTIONS: set[tuple[str, str]] = set()
EVENT_EXCEPTIONS: set[tuple[str, str]] = set()
# The local Spark Connect pool's own registry files, outside any store.
NOT_STORE_FILES = {"devtools/localcluster.py"}


def _modules() -> list[tuple[str, ast.Module]]:
    return [(path.relative_to(PACKAGE).as_posix(), ast.parse(path.read_text()))
            for path in sorted(PACKAGE.rglob("*.py"))]


def _docstrings(tree: ast.Module) -> set[int]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def test_store_file_names_are_spelled_only_in_store() -> None:
    found = set()
    for name, tree in _modules():
        if name.startswith("store/") or name in NOT_STORE_FILES:
            continue
        docs = _docstrings(tree)
        for node in ast.walk(tree):
            if (isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs
                    and node.value.endswith((".json", ".jsonl")) and "/" not in node.value
                    and " " not in node.value):
                found.add((name, node.value))
    assert not found - FILE_NAME_EXCEPTIONS, "store file names spelled outside store/"


def _reads_event(node: ast.AST) -> bool:
    """``x.get("event")``, ``x["event"]`` or a variable named ``event``."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get":
        return bool(node.args) and isinstance(node.args[0], ast.Constant) and node.args[0].value == "event"
    if isinstance(node, ast.Subscript):
        return isinstance(node.slice, ast.Constant) and node.slice.value == "event"
    return isinstance(node, ast.Name) and node.id == "event"


def _event_literals(node: ast.AST) -> list[str]:
    items = node.elts if isinstance(node, ast.Tuple | ast.List | ast.Set) else [node]
    return [i.value for i in items if isinstance(i, ast.Constant) and i.value in EVENT_NAMES]


def test_journal_event_names_are_spelled_only_in_core_events() -> None:
    found = set()
    for name, tree in _modules():
        if name == "core/events.py":
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Compare) and any(_reads_event(s) for s in [node.left, *node.comparators]):
                found.update((name, v) for s in [node.left, *node.comparators] for v in _event_literals(s))
            elif isinstance(node, ast.Call):
                func = node.func
                called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
                if called in ("journal", "_journal", "record", "append", "frozenset"):
                    found.update((name, v) for arg in node.args[:3] for v in _event_literals(arg))
    assert not found - EVENT_EXCEPTIONS, "journal event names spelled outside core/events.py"
