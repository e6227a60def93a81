"""``[speculative] store_path = s3://...`` is accepted only with ``experimental_s3_store = true`` (core/config.py)."""

from __future__ import annotations

import pytest

from airflow_provider_speculative import settings
from airflow_provider_speculative.core.config import SpeculativeConfig
from airflow_provider_speculative.exceptions import ConfigError
from airflow_provider_speculative.store import roots
from tests.unit.store.memory import MemoryBackend

S3_ROOT = "s3://lake/speculative"


def test_an_s3_store_is_refused_without_the_opt_in_naming_it() -> None:
    for off in ({}, {"experimental_s3_store": "false"}):
        with pytest.raises(ConfigError, match=r"store scheme 's3' is not supported .*experimental_s3_store = true"):
            SpeculativeConfig().with_overrides({"store_path": S3_ROOT, **off}, "airflow configuration")
    with pytest.raises(ConfigError, match="store scheme 's3a' is not supported"):
        SpeculativeConfig().with_overrides({"store_path": "s3a://lake/x"}, "test")
    # Other schemes stay refused, opt-in or not.
    for url in ("hdfs://nn/store", "gs://b/store", "file://otherhost/store"):
        with pytest.raises(ConfigError, match="store_path"):
            SpeculativeConfig().with_overrides({"store_path": url, "experimental_s3_store": True}, "test")


def test_with_the_opt_in_an_s3_store_is_accepted_and_survives_a_plan() -> None:
    config = SpeculativeConfig().with_overrides({"store_path": S3_ROOT + "/", "experimental_s3_store": "true"}, "test")
    assert config.store_path == S3_ROOT and config.experimental_s3_store is True
    # The attempt rebuilds the config from its plan: the opt-in travels with it.
    assert SpeculativeConfig.from_json(config.to_json()) == config
    # A plan written before the option existed (no key, a POSIX store) still loads.
    old = {k: v for k, v in SpeculativeConfig().with_overrides({"store_path": "/shared/store"}, "t").to_json().items()
           if k != "experimental_s3_store"}
    assert SpeculativeConfig.from_json(old).store_path == "/shared/store"


@pytest.mark.parametrize(("url", "why"), [
    ("s3://AKIAEXAMPLE:wJalrXUtnFEMI-secret@lake/store", "carries credentials"),
    ("s3://lake/store?versionId=1", "query or fragment"),
    ("s3://Lake_Bucket/store", "is not an S3 bucket name"),
    ("s3://lake/a/../b", r"'\.' or '\.\.' segments"),
    ("s3://lake/a//b", "empty"),
])
def test_a_bad_s3_store_url_is_refused_at_parse_without_echoing_a_secret(url: str, why: str) -> None:
    with pytest.raises(ConfigError, match=why) as refused:
        SpeculativeConfig().with_overrides({"store_path": url, "experimental_s3_store": True}, "test")
    assert "wJalrXUtnFEMI-secret" not in str(refused.value) and "AKIAEXAMPLE" not in str(refused.value)


def test_airflow_cfg_opts_in_through_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    roots.forget_stores()
    memory = MemoryBackend(S3_ROOT)
    roots.install_store(memory)
    monkeypatch.setenv("AIRFLOW__SPECULATIVE__STORE_PATH", S3_ROOT)
    with pytest.raises(ConfigError, match="experimental_s3_store"):
        settings.airflow_config()
    monkeypatch.setenv("AIRFLOW__SPECULATIVE__EXPERIMENTAL_S3_STORE", "true")
    try:
        config = settings.airflow_config()
        assert config.store_path == S3_ROOT and settings.configured_store(config) is memory
    finally:
        roots.forget_stores()
