"""The provider's Spark commit protocol as a jar, compiled from its source with the local JDK and cached.

``jvm/DirectCommitProtocol.java`` lets an attempt's exchange write put each Spark task's files straight in
their final place (no ``_temporary/`` and no move: on an object store a move copies every byte) and name the
committed tasks' files in a list the manifest is built from (``store/manifest.py``, ``COMMITTED_LIST``).
A Spark whose ``spark.jars`` holds this jar uses it for exchanges (``[speculative] exchange_commit``);
without it, Hadoop's file output committer writes. ``local-cluster`` adds the jar to its servers; for a
Spark of your own, build it and put it on ``spark.jars``:

    python -m airflow_provider_speculative.backends.commitjar [--output DIR]
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import importlib.metadata
import importlib.util
import os
import shutil
import subprocess
import tempfile
import zipfile
from pathlib import Path

from airflow_provider_speculative.store.manifest import COMMIT_JAR_PREFIX as JAR_PREFIX

SOURCE = Path(__file__).resolve().parent / "jvm" / "DirectCommitProtocol.java"
JAR_ENV = "SPECULATIVE_COMMIT_JAR"
CACHE_ENV = "SPECULATIVE_JAR_CACHE"


class CommitJarError(RuntimeError):
    """The commit protocol jar cannot be found or built."""


def spark_version() -> str:
    """The installed pyspark's version: the jar is compiled against its jars (read without importing pyspark)."""
    return importlib.metadata.version("pyspark")


def pyspark_jars() -> Path:
    """The installed pyspark's ``jars/`` directory (found without importing pyspark)."""
    spec = importlib.util.find_spec("pyspark")
    if spec is None or not spec.submodule_search_locations:
        raise CommitJarError("pyspark is not installed: the commit protocol is compiled against its jars")
    return Path(next(iter(spec.submodule_search_locations))) / "jars"


@functools.cache
def jar_name() -> str:
    """The jar's file name for this source and this Spark: a changed source or Spark gets a new jar."""
    digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:12]
    return f"{JAR_PREFIX}{spark_version()}-{digest}.jar"


def cache_dir() -> Path:
    """Where built jars are kept: ``$SPECULATIVE_JAR_CACHE``, else ``~/.cache/airflow-provider-speculative``."""
    configured = os.environ.get(CACHE_ENV)
    return Path(configured) if configured else Path.home() / ".cache" / "airflow-provider-speculative"


def find_commit_jar(build: bool = True) -> Path | None:
    """The commit protocol jar: ``$SPECULATIVE_COMMIT_JAR``, a cached build, or a new build (None: no JDK here).

    A ``$SPECULATIVE_COMMIT_JAR`` that does not exist, or whose name does not start with ``speculative-commit-``
    (attempts recognise the jar by it), is an error rather than a silent fallback.
    """
    configured = os.environ.get(JAR_ENV)
    if configured:
        path = Path(configured)
        if not path.is_file():
            raise CommitJarError(f"${JAR_ENV} names {path}, which does not exist")
        if not path.name.startswith(JAR_PREFIX):
            raise CommitJarError(f"${JAR_ENV}: the jar's file name must start with {JAR_PREFIX!r} ({path.name})")
        return path
    cached = cache_dir() / jar_name()
    if cached.is_file():
        return cached
    if not build or shutil.which("javac") is None:
        return None
    return build_commit_jar(cache_dir())


def build_commit_jar(output: Path) -> Path:
    """Compile the protocol against the installed pyspark's jars into ``output``/:func:`jar_name`; its path."""
    jars = pyspark_jars()
    javac = shutil.which("javac")
    if javac is None:
        raise CommitJarError("building the commit protocol jar needs a JDK (javac on PATH)")
    output.mkdir(parents=True, exist_ok=True)
    target = output / jar_name()
    # Built beside its target and renamed into place: several processes may build at once.
    with tempfile.TemporaryDirectory(prefix=".build-", dir=output) as tmp:
        classes = Path(tmp) / "classes"
        done = subprocess.run([javac, "--release", "17", "-nowarn", "-Xlint:none", "-cp", f"{jars}/*",
                               "-d", str(classes), str(SOURCE)], capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise CommitJarError(f"javac failed on {SOURCE}:\n{done.stderr.strip()[-2000:]}")
        staged = Path(tmp) / target.name
        with zipfile.ZipFile(staged, "w", zipfile.ZIP_DEFLATED) as jar:
            jar.writestr("META-INF/MANIFEST.MF",
                         "Manifest-Version: 1.0\r\nCreated-By: airflow-provider-speculative\r\n\r\n")
            for path in sorted(classes.rglob("*.class")):
                jar.write(path, path.relative_to(classes).as_posix())
        os.replace(staged, target)
    return target


def with_commit_jar(conf: dict[str, str], jar: Path | None) -> dict[str, str]:
    """``conf`` with ``jar`` added to ``spark.jars`` (unchanged if ``jar`` is None or already there)."""
    if jar is None:
        return conf
    jars = [j for j in conf.get("spark.jars", "").split(",") if j.strip()]
    if str(jar) in jars:
        return conf
    return {**conf, "spark.jars": ",".join([*jars, str(jar)])}


def main(argv: list[str] | None = None) -> None:
    """Build (or find) the jar and print its path."""
    parser = argparse.ArgumentParser(description="Build the provider's Spark commit protocol jar.")
    parser.add_argument("--output", type=Path, default=None, help="directory for the jar (default: the cache)")
    args = parser.parse_args(argv)
    path = build_commit_jar(args.output) if args.output else find_commit_jar(build=True)
    if path is None:
        raise SystemExit("error: no JDK (javac) here to build the commit protocol jar")
    print(path)


if __name__ == "__main__":
    main()
