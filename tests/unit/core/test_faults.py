"""The fault-injection hook: its JSON form, rules per stage, the environment that fills it in, what it answers."""

from __future__ import annotations

import json

import pytest

from airflow_provider_speculative.core import faults as faults_module
from airflow_provider_speculative.core.faults import (
    NO_FAULTS,
    FaultInjection,
    Faults,
    FaultSpec,
    current,
    faults_from_environ,
    parse_fault_injection,
    parse_faults,
)
from airflow_provider_speculative.devtools.faults import fault_env, injected
from airflow_provider_speculative.exceptions import ConfigError, PlanError

ENV = "SPECULATIVE_FAULT_INJECTION"


def test_an_attempt_rule_wins_over_a_target_rule() -> None:
    faults = parse_fault_injection(ENV, {"targets": {"a": {"factor": 2}},
                                         "attempts": [{"subtask": 1, "attempt": 0, "fail": True}]}, "test")
    assert faults.for_attempt("a", 1, 0) == FaultSpec(fail=True)
    assert faults.for_attempt("a", 1, 1) == FaultSpec(factor=2.0)
    assert not faults.for_attempt("b", 0, 0).active


def test_the_json_form_round_trips() -> None:
    faults = FaultInjection(targets={"a": FaultSpec(factor=3.0)}, attempts={(2, 0): FaultSpec(delay=4.0, fail=True)},
                            force_speculation=frozenset({0, 2}), barrier=True, hold_end=True, hold_commit=True)
    assert parse_fault_injection(ENV, json.loads(json.dumps(faults.to_json())), "test") == faults


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("{not json", r"SPECULATIVE_FAULT_INJECTION = '\{not json' \(env\): invalid JSON"),
        ('{"targets": {"a": {"factor": 0.5}}}', r"SPECULATIVE_FAULT_INJECTION.targets.a.factor = 0.5 \(env\): "
                                                r"must be >= 1"),
        ('{"targets": {"a": {"delay": "soon"}}}', r"SPECULATIVE_FAULT_INJECTION.targets.a.delay = 'soon' \(env\): "
                                                  r"expected a duration"),
        ('{"targets": ["a"]}', r"SPECULATIVE_FAULT_INJECTION.targets = \['a'\] \(env\): expected an object"),
        ('{"nodes": {}}', r"SPECULATIVE_FAULT_INJECTION = \{'nodes': \{\}\} \(env\): expected \{targets"),
        ('{"attempts": [{"attempt": 1}]}', r"SPECULATIVE_FAULT_INJECTION.attempts = .*needs 'subtask'"),
        ('{"stages": {"spec_q1": {}}}', r"SPECULATIVE_FAULT_INJECTION.stages = 'spec_q1' \(env\): keys are "
                                        r"'<dag_id>/<stage>'"),
        ('{"stages": {"d/s": {}}, "barrier": true}', r"expected \{\"stages\""),
        ('{"stages": {"d/s": {"hold_end": "maybe"}}}', r"SPECULATIVE_FAULT_INJECTION.stages.d/s.hold_end = 'maybe' "
                                                       r"\(env\): expected true or false"),
    ],
)
def test_bad_values_raise_config_error_naming_the_variable_not_an_option(value: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as info:
        parse_faults(value, "env")
    assert "[speculative]" not in str(info.value)


def test_rules_are_per_stage_by_pattern_first_match_wins_and_unkeyed_faults_apply_everywhere() -> None:
    hook = parse_faults({"stages": {"e2e_q1_barrier/scan": {"barrier": True}, "e2e_q1_*/*": {"hold_commit": True}}})
    assert hook.of_stage("e2e_q1_barrier", "scan") == FaultInjection(barrier=True)
    assert hook.of_stage("e2e_q1_barrier", "aggregate") == FaultInjection(hold_commit=True)
    assert hook.of_stage("e2e_q1", "scan") is NO_FAULTS  # "e2e_q1_*" needs the underscore
    everywhere = parse_faults('{"targets": {"local-b": {"factor": 4}}}')
    assert everywhere.of_stage("any_dag", "p.any_stage").targets == {"local-b": FaultSpec(factor=4.0)}
    assert parse_faults("") == parse_faults("{}") == Faults()


def test_no_faults_answer_nothing() -> None:
    assert not NO_FAULTS.active and Faults().of_stage("d", "s") is NO_FAULTS
    assert NO_FAULTS.attempt_env("/store/d/r/s/barrier.release.0") == {}
    assert NO_FAULTS.force_speculation == frozenset() and not NO_FAULTS.hold_commit
    NO_FAULTS.check_targets(["local-a"], "pipeline 'p', stage 's'")


def test_an_attempt_gets_its_stages_faults_and_the_release_of_its_held_end() -> None:
    faults = FaultInjection(force_speculation=frozenset({0}), hold_end=True)
    env = faults.attempt_env("/s/barrier.release.0")
    assert env["SPECULATIVE_HOLD_END"] == "/s/barrier.release.0"
    # What the attempt's process makes of it: the same faults for its stage, whatever its DAG.
    hook = faults_from_environ(env)
    assert hook.of_stage("d", "s") == faults and hook.hold_end_release == "/s/barrier.release.0"
    assert "SPECULATIVE_HOLD_END" not in FaultInjection(barrier=True).attempt_env("/s/barrier.release.0")


def test_target_rules_must_name_targets_of_the_stage() -> None:
    faults = FaultInjection(targets={"local-x": FaultSpec(factor=4.0)})
    with pytest.raises(PlanError, match=r"pipeline 'p', stage 's': SPECULATIVE_FAULT_INJECTION names targets "
                                        r"\['local-x'\] that are not targets of this stage \(local-a, local-b\)"):
        faults.check_targets(["local-b", "local-a"], "pipeline 'p', stage 's'")
    FaultInjection(targets={"local-a": FaultSpec(factor=4.0)}).check_targets(["local-a"], "x")


def test_the_process_hook_follows_its_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV, raising=False)
    monkeypatch.delenv("SPECULATIVE_HOLD_END", raising=False)
    monkeypatch.setattr(faults_module, "_loaded", None)
    assert current() == Faults()
    with injected({"spec_q1/*": {"force_speculation": [1]}}) as hook:
        assert current() == hook and current().of_stage("spec_q1", "scan").force_speculation == {1}
    assert current() == Faults()
    # A forked supervisor gets its launch's environment after the fork server may have asked: it is read again.
    monkeypatch.setenv("SPECULATIVE_HOLD_END", "/s/barrier.release.1")
    assert current().hold_end_release == "/s/barrier.release.1"


def test_fault_env_is_checked_when_built() -> None:
    assert json.loads(fault_env({"d/s": {"barrier": True}})[ENV]) == {"stages": {"d/s": {"barrier": True}}}
    with pytest.raises(ConfigError, match=r"stages.d/s.targets.a.factor = 0.5"):
        fault_env({"d/s": {"targets": {"a": {"factor": 0.5}}}})
