"""A setting the attempt needs for one write is put back as it was: an application's own value survives."""

from __future__ import annotations

import pytest

from airflow_provider_speculative.runtime.session import direct_commit, session_setting
from airflow_provider_speculative.store.manifest import DIRECT_COMMIT_CLASS

KEY = "spark.sql.sources.commitProtocolClass"


class RuntimeConf:
    """The three calls of ``spark.conf`` that ``session_setting`` makes, over a dict (as a session keeps them)."""

    def __init__(self, values: dict[str, str]) -> None:
        self.values = dict(values)

    def get(self, key: str, default: str | None = None) -> str | None:
        """The value, or ``default``."""
        return self.values.get(key, default)

    def set(self, key: str, value: str) -> None:
        """Set the value."""
        self.values[key] = value

    def unset(self, key: str) -> None:
        """Drop the value."""
        self.values.pop(key, None)


@pytest.mark.parametrize("before", [{}, {KEY: "com.example.TheirProtocol"}])
def test_the_value_before_the_write_is_back_after_it(before: dict[str, str]) -> None:
    conf = RuntimeConf({**before, "other": "x"})
    with session_setting(conf, KEY, "speculative.commit.DirectCommitProtocol"):
        assert conf.get(KEY) == "speculative.commit.DirectCommitProtocol"
    assert conf.values == {**before, "other": "x"}


def test_a_failed_write_puts_it_back_too() -> None:
    conf = RuntimeConf({KEY: "com.example.TheirProtocol"})
    with pytest.raises(RuntimeError, match="write failed"), session_setting(conf, KEY, "ours"):
        raise RuntimeError("write failed")
    assert conf.values == {KEY: "com.example.TheirProtocol"}


@pytest.mark.parametrize("jars", ["/opt/jars/speculative-commit-4.0.1-abc.jar",
                                  "/opt/a.jar, /cache/speculative-commit-x.jar"])
def test_a_session_with_the_commit_jar_writes_through_the_protocol_and_puts_the_setting_back(jars: str) -> None:
    conf = RuntimeConf({"spark.jars": jars})
    with direct_commit(conf):
        assert conf.get(KEY) == DIRECT_COMMIT_CLASS
    assert KEY not in conf.values


@pytest.mark.parametrize("jars", [None, "", "/opt/jars/hadoop-aws.jar", "/opt/speculative-commit-dir/other.jar"])
def test_a_session_without_the_jar_keeps_hadoops_committer(jars: str | None) -> None:
    conf = RuntimeConf({} if jars is None else {"spark.jars": jars})
    with direct_commit(conf):
        assert conf.get(KEY) is None
