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
       "AIRFLOW__SPECULATIVE__STORE_PATH": "/d/store", "AIRFLOW__SPECULATIVE__BASELINE_RATIO": "50%",
       "SPECULATIVE_FAULT_INJECTION": '{"targets": {"local-b": {"factor": 4}}}',
       "AIRFLOW_CONN_SPARK_DEFAULT": '{"conn_type": "spark", "host": "local[1]"}',
       "SPECULATIVE_EXAMPLE_DATA": "/data dir/lineitem", "HOME": "/root", "AIRFLOW__BROKEN": "x"}


def test_options_come_from_airflow_section_key_variables_only() -> None:
    assert demo_env.config_options(ENV) == {
        "core": {"dags_folder": "/repo/dags"},
        "speculative": {"baseline_ratio": "50%", "store_path": "/d/store"}}


def test_config_merges_and_escapes_percent_signs(tmp_path: Path) -> None:
    (tmp_path / "airflow.cfg").write_text("[core]\nparallelism = 4\ndags_folder = /old\n")
    path = demo_env.write_config(tmp_path, demo_env.config_options(ENV))
    parser = configparser.ConfigParser()  # %-interpolation, as Airflow reads it
    parser.read(path)
    assert parser.get("core", "parallelism") == "4" and parser.get("core", "dags_folder") == "/repo/dags"
    assert parser.get("speculative", "baseline_ratio") == "50%"


def test_env_file_exports_what_a_config_file_cannot_hold(tmp_path: Path) -> None:
    text = demo_env.env_script(ENV, Path("/venv/bin"))
    (tmp_path / "env.sh").write_text(text)
    echo = 'echo "$AIRFLOW_HOME|$SPECULATIVE_EXAMPLE_DATA|$AIRFLOW_CONN_SPARK_DEFAULT|${PATH%%:*}"'
    shown = subprocess.run(["bash", "-c", f"source {tmp_path / 'env.sh'}; {echo}"], capture_output=True, text=True,
                           check=True)
    assert shown.stdout.strip() == '/d/airflow|/data dir/lineitem|{"conn_type": "spark", "host": "local[1]"}|/venv/bin'
    # The demo's fault injection is no option: the shell gets it as the variable every stage process reads.
    faults = subprocess.run(["bash", "-c", f"source {tmp_path / 'env.sh'}; echo $SPECULATIVE_FAULT_INJECTION"],
                            capture_output=True, text=True, check=True)
    assert faults.stdout.strip() == '{"targets": {"local-b": {"factor": 4}}}'
    assert "STORE_PATH" not in text and "HOME=/root" not in text.replace("AIRFLOW_HOME", "")


def test_the_demo_slows_local_b_through_the_fault_variable_not_an_option() -> None:
    import re
    import shlex

    from airflow_provider_speculative.core.faults import FaultSpec, parse_faults

    makefile = (REPO / "Makefile").read_text()
    assert "AIRFLOW__SPECULATIVE__FAULT_INJECTION" not in makefile  # airflow.cfg would refuse it
    (value,) = re.findall(r"^\tSPECULATIVE_FAULT_INJECTION=(.*?)(?: \\)?$", makefile, re.MULTILINE)
    faults = parse_faults(shlex.split(value)[0]).of_stage("tpch_q1", "scan")
    assert faults.targets == {"local-b": FaultSpec(factor=4.0)} and faults.for_attempt("local-a", 0, 0) == FaultSpec()
