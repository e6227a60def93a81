"""Make the demo's Airflow home usable by hand: ``airflow.cfg`` and ``env.sh`` from the demo's environment.

``make demo`` runs the example with its settings as environment variables. Called with that environment,
``write`` turns every ``AIRFLOW__SECTION__KEY`` into an ``airflow.cfg`` option of ``$AIRFLOW_HOME`` (so
``AIRFLOW_HOME=.demo/airflow airflow dags list`` sees the demo's DAGs folder, store and speculation
settings) and writes ``<demo>/env.sh`` with AIRFLOW_HOME, the venv on PATH, and the variables a config
file cannot hold (connections, the example DAG's data and output paths). ``hint`` prints how to use it.

    python scripts/demo_env.py write .demo      # before `airflow db migrate`
    python scripts/demo_env.py hint .demo       # the demo's last lines
"""

from __future__ import annotations

import argparse
import configparser
import json
import os
import shlex
import sys
from pathlib import Path

# Environment variables that configure the DAG file or the connections rather than airflow.cfg.
ENV_ONLY_PREFIXES = ("AIRFLOW_CONN_", "AIRFLOW_VAR_", "SPECULATIVE_")


def config_options(env: dict[str, str]) -> dict[str, dict[str, str]]:
    """``AIRFLOW__SECTION__KEY=value`` -> {section: {key: value}} (lower case, as airflow.cfg spells them)."""
    sections: dict[str, dict[str, str]] = {}
    for name, value in sorted(env.items()):
        parts = name.split("__")
        if len(parts) == 3 and parts[0] == "AIRFLOW" and parts[1] and parts[2]:
            sections.setdefault(parts[1].lower(), {})[parts[2].lower()] = value
    return sections


def write_config(home: Path, sections: dict[str, dict[str, str]]) -> Path:
    """Merge ``sections`` into ``home/airflow.cfg`` (created if missing); return its path."""
    path = home / "airflow.cfg"
    parser = configparser.ConfigParser(interpolation=None)
    if path.exists():
        parser.read(path)
    for section, options in sections.items():
        if not parser.has_section(section):
            parser.add_section(section)
        for key, value in options.items():
            # Airflow reads airflow.cfg with %-interpolation: a literal % must be doubled.
            parser.set(section, key, value.replace("%", "%%"))
    home.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".cfg.tmp")
    with open(tmp, "w") as f:
        f.write("# Written by scripts/demo_env.py from the settings `make demo` runs with.\n")
        parser.write(f)
    tmp.replace(path)
    return path


def env_script(env: dict[str, str], venv_bin: Path) -> str:
    """The shell lines of env.sh: AIRFLOW_HOME, the venv first on PATH, and the environment-only variables."""
    lines = ["# Source this file to use the demo's Airflow: source .demo/env.sh",
             f"export AIRFLOW_HOME={shlex.quote(env['AIRFLOW_HOME'])}",
             f'export PATH={shlex.quote(str(venv_bin))}:"$PATH"']
    lines += [f"export {name}={shlex.quote(value)}" for name, value in sorted(env.items())
              if name.startswith(ENV_ONLY_PREFIXES)]
    return "\n".join(lines) + "\n"


def write(demo: Path, env: dict[str, str]) -> None:
    """Write airflow.cfg into $AIRFLOW_HOME and env.sh into the demo directory."""
    if "AIRFLOW_HOME" not in env:
        sys.exit("error: AIRFLOW_HOME is not set (run this with the demo's environment, as `make demo` does)")
    home = Path(env["AIRFLOW_HOME"])
    cfg = write_config(home, config_options(env))
    demo.mkdir(parents=True, exist_ok=True)
    (demo / "env.sh").write_text(env_script(env, Path(sys.executable).parent))
    print(f"wrote {cfg} and {demo / 'env.sh'}")


def latest_run_id(store: Path, dag_id: str) -> str | None:
    """The run id of the newest recorded run of ``dag_id`` in the store (from its plans)."""
    plans = sorted((store / dag_id).glob("*/*/plan.json"), key=lambda p: p.stat().st_mtime)
    return json.loads(plans[-1].read_text())["run_id"] if plans else None


def hint(demo: Path, dag_id: str) -> None:
    """Print how to reach the demo's Airflow from a shell."""
    rel = os.path.relpath(demo)
    run_id = latest_run_id(demo / "store", dag_id) or "<run id>"
    run = shlex.quote(run_id)
    print(f"""
The demo's Airflow home is {rel}/airflow: its airflow.cfg names the DAGs folder, the store and the
speculation settings. To look at the run yourself:
  source {rel}/env.sh
  airflow dags list
  airflow speculative status --dag-id {dag_id} --run-id {run}
  airflow speculative rerun --dag-id {dag_id} --run-id {run} --stage scan --subtask 1 --dry-run
  airflow speculative gc --dry-run
  make ui      # Airflow (api-server, scheduler, dag-processor, triggerer) with the plugin; prints URL + login""")


def main(argv: list[str] | None = None) -> None:
    """Command line: ``write DEMO`` or ``hint DEMO``."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("action", choices=("write", "hint"))
    parser.add_argument("demo", type=Path, help="the demo directory (.demo)")
    parser.add_argument("--dag-id", default="tpch_q1")
    args = parser.parse_args(argv)
    if args.action == "write":
        write(args.demo.resolve(), dict(os.environ))
    else:
        hint(args.demo, args.dag_id)


if __name__ == "__main__":
    main()
