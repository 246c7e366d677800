"""How many clients the aggregates over clients cover, when some clients' metric is undefined (NaN)."""

from __future__ import annotations

import math

import pytest

from fedlit.engine.records.history import EvaluationHistory, markdown_table


def test_the_aggregates_say_over_how_many_clients_when_a_value_is_undefined():
    # b's C-index is undefined (no comparable pair in its test split): mean (0.8 + 0.6) / 2 = 0.7 over 2 of 3
    # clients; every client has a loss: no note for it
    per_client = {
        "a": {"c_index": 0.8, "loss": 1.0},
        "b": {"c_index": math.nan, "loss": 2.0},
        "c": {"c_index": 0.6, "loss": 3.0},
    }
    history = EvaluationHistory("c_index", {"c_index": True, "loss": False})
    history.add(1, "test", per_client)
    last = history.results("test", {"a": 10, "b": 10, "c": 30})["last"]
    assert last["summary"]["c_index_mean"] == pytest.approx(0.7)
    assert last["summary"]["c_index_wmean"] == pytest.approx((0.8 * 10 + 0.6 * 30) / 40)
    assert last["summary_clients"] == {"c_index": 2, "loss": 3}
    table = markdown_table("Test", last, ["c_index", "loss"])
    assert "| b | — | 2.0000 |" in table
    assert table.endswith(
        "_Undefined values (—) are left out of mean, wmean and worst: c_index over 2 of 3 clients._\n"
    )
    # every value defined: no note
    history.add(2, "test", {c: {"c_index": 0.5, "loss": 1.0} for c in "abc"})
    complete = history.results("test", {"a": 1, "b": 1, "c": 1})["last"]
    assert complete["summary_clients"] == {"c_index": 3, "loss": 3}
    assert "left out" not in markdown_table("Test", complete, ["c_index", "loss"])
