"""The test session turns Airflow's deprecations caused by this project into failures (tests/conftest.py)."""

from __future__ import annotations

import warnings

import pytest


def test_an_airflow_deprecation_caused_here_fails_the_test() -> None:
    from airflow.exceptions import AirflowProviderDeprecationWarning, RemovedInAirflow4Warning
    from airflow.utils.deprecation_tools import DeprecatedImportWarning

    for category in (RemovedInAirflow4Warning, AirflowProviderDeprecationWarning, DeprecatedImportWarning):
        with pytest.raises(category):
            warnings.warn("removed in the next Airflow", category, stacklevel=1)

