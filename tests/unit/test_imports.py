"""Parsing a DAG must stay cheap: the authoring API, core/ and runtime/ load neither FastAPI nor the UI plugin,
and core/ and runtime/ load no Airflow at all."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

PROBE = """
import json, sys
for name in {modules!r}:
    __import__(name)
print(json.dumps(sorted(sys.modules)))
"""


def _loaded(*modules: str) -> set[str]:
    out = subprocess.run([sys.executable, "-c", PROBE.format(modules=list(modules))], capture_output=True,
                         text=True, check=True, timeout=120)
    return set(json.loads(out.stdout.strip().splitlines()[-1]))


def test_authoring_api_and_operator_load_no_ui() -> None:
    loaded = _loaded("airflow_provider_speculative", "airflow_provider_speculative.operators.stage",
                     "airflow_provider_speculative.pipeline")
    assert "airflow_provider_speculative.operators.stage" in loaded
    assert not {m for m in loaded if m == "fastapi" or m.startswith("fastapi.")}
    assert not {m for m in loaded if m.startswith("airflow_provider_speculative.plugin")}


@pytest.mark.parametrize("package", ["core", "runtime"])
def test_core_and_runtime_load_no_airflow(package: str) -> None:
    import pkgutil

    import airflow_provider_speculative

    base = f"airflow_provider_speculative.{package}"
    path = [f"{airflow_provider_speculative.__path__[0]}/{package}"]
    modules = [base] + [f"{base}.{m.name}" for m in pkgutil.iter_modules(path)]
    loaded = _loaded(*modules)
    assert not {m for m in loaded if m == "airflow" or m.startswith("airflow.")}, f"{package}/ imports Airflow"
    assert not {m for m in loaded if m.startswith("airflow_provider_speculative.plugin")}
    assert "fastapi" not in loaded


def _import_graph() -> dict[str, set[str]]:
    """Module -> package modules it imports (at module level or inside functions: a lazy import is still an edge)."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[2] / "airflow_provider_speculative"
    modules = {}
    for path in root.rglob("*.py"):
        name = ".".join(path.relative_to(root.parent).with_suffix("").parts).removesuffix(".__init__")
        modules[name] = path
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module in modules:
                # "from package import module" imports the module; "from module import name" the module.
                for alias in node.names:
                    graph[name].add(f"{node.module}.{alias.name}" if f"{node.module}.{alias.name}" in modules
                                    else node.module)
            elif isinstance(node, ast.Import):
                graph[name] |= {alias.name for alias in node.names if alias.name in modules}
    return {name: {t for t in targets if t in modules and t != name} for name, targets in graph.items()}


def test_no_import_circle_in_the_package() -> None:
    graph = _import_graph()
    assert graph["airflow_provider_speculative.backends.base"] == {
        "airflow_provider_speculative.core.states", "airflow_provider_speculative.store.layout"}
    # Depth-first search for a back edge; the path of the first one found names the circle.
    state: dict[str, int] = {}

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for target in sorted(graph[module]):
            if state.get(target) == 1:
                raise AssertionError("import circle: " + " -> ".join([*path[path.index(target):], target]))
            if target not in state:
                visit(target, [*path, target])
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])


def test_a_dag_file_loads_no_control_plane() -> None:
    """A dag-processor parses every DAG file in a process of its own: the pipeline and its operator load only
    what a parse needs, not planning, the controller, commits or the trigger (operators/stage.py)."""
    loaded = _loaded("airflow_provider_speculative.pipeline", "airflow_provider_speculative.operators.stage",
                     "airflow_provider_speculative.sensors")
    heavy = {m for m in loaded if m.startswith(("airflow_provider_speculative.control",
                                                "airflow_provider_speculative.triggers",
                                                "airflow_provider_speculative.backends",
                                                "airflow_provider_speculative.hooks.asset_events",
                                                "pyspark", "pyarrow", "boto3"))}
    assert not heavy, f"a DAG parse imports {sorted(heavy)}"


def test_the_start_trigger_path_names_the_trigger_class() -> None:
    from airflow_provider_speculative.operators.stage import START_TRIGGER
    from airflow_provider_speculative.triggers.stage import StageStartTrigger

    assert START_TRIGGER == f"{StageStartTrigger.__module__}.{StageStartTrigger.__qualname__}"
