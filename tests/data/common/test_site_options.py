"""``warn_labels``: a class of fewer than 5 samples and a fractional numeric label are named in warnings."""

from __future__ import annotations

import warnings

from fedlit.data.common.site_options import warn_labels


def _messages(counts: dict[str, int], declared: bool = False) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warn_labels("Data (x.csv)", counts, {c: f"line {i + 2}" for i, c in enumerate(counts)}, declared)
    return [str(w.message) for w in caught]


def test_rare_classes_are_named_with_their_count_and_first_place() -> None:
    (message,) = _messages({"0": 40, "1": 4, "2": 5, "3": 0})  # 4 < 5 warns; 5 and an absent class do not
    assert message.startswith(
        "Data (x.csv): a class has fewer than 5 samples in the whole pool: '1': 4 (first at line 3)"
    )
    (message,) = _messages({"a": 1, "b": 2, "c": 9})
    assert "2 classes have fewer than 5" in message and "'a': 1 (first at line 2); 'b': 2 (first at line 3)" in message


def test_numbers_that_are_not_integers_warn_unless_declared() -> None:
    messages = _messages({"0": 9, "1": 9, "0.5": 9, "2.0": 9, "1e-3": 9, "nan": 9, "cat": 9})
    assert len(messages) == 1 and "labels ['0.5', '1e-3'] read as numbers but not as integers" in messages[0]
    assert "(first at line 4)" in messages[0]
    assert _messages({"0": 9, "0.5": 9}, declared=True) == []
