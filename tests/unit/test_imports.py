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
