"""Stage order for readers: producers first, iteratively (no recursion limit), cycles named."""

from __future__ import annotations

import pytest

from airflow_provider_speculative.core.graph import producers_first
from airflow_provider_speculative.exceptions import PipelineError


def test_a_chain_of_thousands_of_stages_orders_without_recursion() -> None:
    names = [f"s{i}" for i in range(5000)]
    order = producers_first(list(reversed(names)), lambda s: [f"s{int(s[1:]) - 1}"] if s != "s0" else [], "w")
    assert order == names


def test_order_keeps_the_given_order_between_independent_stages_and_names_a_cycle() -> None:
    graph = {"c": ["a", "b"], "b": ["a"], "a": [], "x": []}
    assert producers_first(["x", "c", "b", "a"], lambda s: graph[s], "w") == ["x", "a", "b", "c"]
    with pytest.raises(PipelineError, match=r"w: cyclic stage graph: a -> b -> a"):
        producers_first(["a", "b"], lambda s: {"a": ["b"], "b": ["a"]}[s], "w")
