"""The commit protocol jar: found, built with the local JDK and cached; the Java and Python sides agree."""

from __future__ import annotations

import re
import zipfile
from pathlib import Path

import pytest

from airflow_provider_speculative.backends import commitjar
from airflow_provider_speculative.backends.commitjar import CommitJarError, find_commit_jar, with_commit_jar
from airflow_provider_speculative.store.manifest import COMMIT_JAR_PREFIX, COMMITTED_LIST, DIRECT_COMMIT_CLASS


def test_the_java_source_names_what_python_reads() -> None:
    source = commitjar.SOURCE.read_text()
    package = re.search(r"^package ([\w.]+);", source, re.M)
    assert package and f"{package.group(1)}.DirectCommitProtocol" == DIRECT_COMMIT_CLASS
    assert re.search(r"public class DirectCommitProtocol\b", source)
    assert f'COMMITTED_LIST = "{COMMITTED_LIST}"' in source


def test_a_jar_is_added_to_spark_jars_once() -> None:
    jar = Path("/c/speculative-commit-4.2.0-abc.jar")
    assert with_commit_jar({}, jar) == {"spark.jars": str(jar)}
    conf = with_commit_jar({"spark.jars": "/x/a.jar", "k": "v"}, jar)
    assert conf == {"spark.jars": f"/x/a.jar,{jar}", "k": "v"}
    assert with_commit_jar(conf, jar) == conf
    assert with_commit_jar({"k": "v"}, None) == {"k": "v"}


def test_a_configured_jar_must_exist_and_carry_the_name_attempts_recognise(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(commitjar.JAR_ENV, str(tmp_path / "speculative-commit-x.jar"))
    with pytest.raises(CommitJarError, match="does not exist"):
        find_commit_jar()
    other = tmp_path / "mine.jar"
    other.write_bytes(b"")
    monkeypatch.setenv(commitjar.JAR_ENV, str(other))
    with pytest.raises(CommitJarError, match=COMMIT_JAR_PREFIX):
        find_commit_jar()


def test_without_a_jdk_there_is_no_jar_and_no_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(commitjar.JAR_ENV, raising=False)
    monkeypatch.setenv(commitjar.CACHE_ENV, str(tmp_path))
    monkeypatch.setattr(commitjar.shutil, "which", lambda name: None)
    assert find_commit_jar() is None


def test_the_jar_is_built_once_and_holds_the_class(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(commitjar.JAR_ENV, raising=False)
    monkeypatch.setenv(commitjar.CACHE_ENV, str(tmp_path))
    built = find_commit_jar()
    assert built is not None and built.parent == tmp_path and built.name.startswith(COMMIT_JAR_PREFIX)
    with zipfile.ZipFile(built) as jar:
        assert DIRECT_COMMIT_CLASS.replace(".", "/") + ".class" in jar.namelist()
    # The second call finds the cached jar: no compiler is needed any more.
    monkeypatch.setattr(commitjar.shutil, "which", lambda name: None)
    assert find_commit_jar() == built
    assert [p.name for p in tmp_path.iterdir()] == [built.name]  # no build directory left behind


def test_the_jar_joins_a_spark_submit_command_once_wherever_its_jars_are() -> None:
    from airflow_provider_speculative.backends.spark_submit import with_jar

    jar = "/c/speculative-commit-4.2.0-abc.jar"
    plain = ["spark-submit", "--master", "local[1]", "--conf", "a=b", "app.py", "--arg", "x"]
    assert with_jar(plain, jar) == ["spark-submit", "--master", "local[1]", "--conf", "a=b", "--jars", jar,
                                    "app.py", "--arg", "x"]
    listed = ["spark-submit", "--jars", "/x/a.jar", "--conf", "spark.jars=/y/b.jar", "app.py"]
    assert with_jar(listed, jar) == ["spark-submit", "--jars", f"/x/a.jar,{jar}", "--conf", "spark.jars=/y/b.jar",
                                     "app.py"]
    conf = ["spark-submit", "--conf", "spark.jars=/y/b.jar", "app.py"]
    assert with_jar(conf, jar) == ["spark-submit", "--conf", f"spark.jars=/y/b.jar,{jar}", "app.py"]
    assert with_jar(with_jar(plain, jar), jar) == with_jar(plain, jar)
