"""Each [speculative] option is one SpeculativeConfig field whose metadata holds its parser and doc."""

from __future__ import annotations

from dataclasses import dataclass, field, fields

import pytest

from airflow_provider_speculative.core.config import (
    OPTION_SPEC,
    OPTIONS,
    OptionSpec,
    SpeculativeConfig,
    options_of,
)


def _parse(name: str, value: object, where: str) -> object:
    return value


def test_every_config_field_carries_a_parser_and_a_doc_and_the_options_are_derived_from_them() -> None:
    for f in fields(SpeculativeConfig):
        spec = f.metadata.get(OPTION_SPEC)
        assert isinstance(spec, OptionSpec), f.name
        assert callable(spec.parse) and spec.doc.strip(), f.name
    assert options_of(SpeculativeConfig) == OPTIONS
    assert [(o.name, o.default) for o in OPTIONS] == [
        (f.name, getattr(SpeculativeConfig(), f.name)) for f in fields(SpeculativeConfig)]
    by_name = {o.name: o for o in OPTIONS}
    assert "fault_injection" not in by_name  # a test facility (core/faults.py), not an option
    assert by_name["enabled"].type == "boolean" and by_name["enabled"].show_default() == "False"


def test_a_field_declared_without_its_parser_and_doc_is_refused() -> None:
    @dataclass(frozen=True)
    class Bare(SpeculativeConfig):
        misspelt_option: int = 3

    with pytest.raises(TypeError, match=r"Bare\.misspelt_option has no option spec \(parser and doc\)"):
        options_of(Bare)


def test_a_spec_without_a_doc_line_or_a_field_without_a_default_is_refused() -> None:
    @dataclass(frozen=True)
    class Undocumented:
        x: int = field(default=1, metadata={OPTION_SPEC: OptionSpec(_parse, "  ")})

    with pytest.raises(TypeError, match=r"Undocumented\.x: its option spec needs a parser and a doc line"):
        options_of(Undocumented)

    @dataclass(frozen=True)
    class NoDefault:
        x: int = field(metadata={OPTION_SPEC: OptionSpec(_parse, "An option.")})

    with pytest.raises(TypeError, match=r"NoDefault\.x has no default"):
        options_of(NoDefault)
