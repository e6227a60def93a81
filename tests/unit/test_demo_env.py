"""scripts/demo_env.py: the demo's environment becomes an airflow.cfg and an env file that Airflow reads back."""

from __future__ import annotations

import configparser
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO

sys.path.insert(0, str(REPO / "scripts"))
import demo_env

ENV = {"AIRFLOW_HOME": "/d/airflow", "AIRFLOW__CORE__DAGS_FOLDER": "/repo/dags",
       "AIRFLOW__SPECULATIVE__STORE_PATH": "/d/store", "AIRFLOW__SPECULATIVE__FAULT_INJECTION": '{"f": "50%"}',
       "AIRFLOW_CONN_SPARK_DEFAULT": '{"conn_type": "spark", "host": "local[1]"}',
       "SPECULATIVE_EXAMPLE_DATA": "/data dir/lineitem", "HOME": "/root", "AIRFLOW__BROKEN": "x"}


def test_options_come_from_airflow_section_key_variables_only() -> None:
    assert demo_env.config_options(ENV) == {
        "core": {"dags_folder": "/repo/dags"},
        "speculative": {"fault_injection": '{"f": "50%"}', "store_path": "/d/store"}}


def test_config_merges_and_escapes_percent_signs(tmp_path: Path) -> None:
    (tmp_path / "airflow.cfg").write_text("[core]\nparallelism = 4\ndags_folder = /old\n")
    path = demo_env.write_config(tmp_path, demo_env.config_options(ENV))
    parser = configparser.ConfigParser()  # %-interpolation, as Airflow reads it
    parser.read(path)
    assert parser.get("core", "parallelism") == "4" and parser.get("core", "dags_folder") == "/repo/dags"
    assert parser.get("speculative", "fault_injection") == '{"f": "50%"}'


def test_env_file_exports_what_a_config_file_cannot_hold(tmp_path: Path) -> None:
    text = demo_env.env_script(ENV, Path("/venv/bin"))
    (tmp_path / "env.sh").write_text(text)
    echo = 'echo "$AIRFLOW_HOME|$SPECULATIVE_EXAMPLE_DATA|$AIRFLOW_CONN_SPARK_DEFAULT|${PATH%%:*}"'
    shown = subprocess.run(["bash", "-c", f"source {tmp_path / 'env.sh'}; {echo}"], capture_output=True, text=True,
                           check=True)
    assert shown.stdout.strip() == '/d/airflow|/data dir/lineitem|{"conn_type": "spark", "host": "local[1]"}|/venv/bin'
    assert "STORE_PATH" not in text and "HOME=/root" not in text.replace("AIRFLOW_HOME", "")
