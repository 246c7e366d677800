"""``SiteTable``'s bad files: no rows, a column named twice, repeated rows (``dedupe``), values float32 cannot hold,
and labels that look like mistakes (a class of one sample, a fractional number)."""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from fedlit.core.errors import DataError
from fedlit.data import SiteTable


def _table(tmp_path: Path, text: str, **kwargs) -> SiteTable:
    path = tmp_path / "cohort.csv"
    path.write_text(text)
    return SiteTable(path=path, **{"split_fractions": (0.5, 0.25, 0.25), **kwargs})


def _rows(n: int = 16) -> str:
    """``n`` distinct rows alternating sites a/b, labels 0/1 (each site gets both labels, 4+ of each)."""
    return "".join(f"{'ab'[i % 2]},{i},{(i // 2) % 2}\n" for i in range(n))


def _built(data: SiteTable) -> tuple[SiteTable, list[str]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        data.setup()
    return data, [str(w.message) for w in caught]


def test_a_header_only_csv_says_the_file_has_no_rows(tmp_path: Path) -> None:
    path = tmp_path / "cohort.csv"
    with pytest.raises(
        DataError, match=re.escape(f"{path} has no rows (only a header: columns ['site', 'x', 'label'])")
    ):
        _table(tmp_path, "site,x,label\n").setup()


def test_a_parquet_file_without_rows_says_so(tmp_path: Path) -> None:
    path = tmp_path / "cohort.parquet"
    pd.DataFrame({"site": pd.Series([], dtype=str), "x": pd.Series([], dtype=float)}).to_parquet(path)
    with pytest.raises(DataError, match=re.escape(f"{path} has no rows (only a schema")):
        SiteTable(path=path, target_column="x", task="regression").setup()


def test_a_column_named_twice_is_refused_naming_it(tmp_path: Path) -> None:
    # pandas would read the second one as "age.1"; a real "age.1" column beside "age" stays legal
    with pytest.raises(DataError, match=r"cohort\.csv: its header names column 'age' more than once"):
        _table(tmp_path, "site,age, age,label\na,1,2,0\n").setup()
    rows = "".join(f"{'ab'[i % 2]},{i},{-i},{(i // 2) % 2}\n" for i in range(16))
    data, _ = _built(_table(tmp_path, "site,age,age.1,label\n" + rows))
    assert data.data.details["feature_names"] == ["age", "age.1"]


def test_a_value_beyond_float32_is_named_not_reported_as_inf(tmp_path: Path) -> None:
    # 1e39 is a finite float64 but overflows float32 (largest 3.4028e38): line 5 holds it (header = line 1)
    text = "site,x,label\n" + _rows().replace("b,3,1\n", "b,1e39,1\n")
    with pytest.raises(DataError, match=r"line 5, column 'x': 1e\+39 is finite but beyond float32's range"):
        _table(tmp_path, text).setup()


def test_huge_finite_features_are_standardized_without_overflow(tmp_path: Path) -> None:
    # float32 would sum 3e38 + 2e38 to inf; float64 gives the train mean and (unbiased) std
    text = "site,x,split,label\na,3e38,train,0\na,2e38,train,1\na,1,train,0\na,2,train,1\na,5,test,0\na,6,test,1\n"
    data, _ = _built(_table(tmp_path, text, split_column="split", split_fractions=(0.6, 0.2, 0.2)))
    train = np.array([3e38, 2e38, 1.0, 2.0])
    expected = (np.array([3e38, 2e38, 1, 2, 5, 6]) - train.mean()) / train.std(ddof=1)
    np.testing.assert_allclose(data.data.inputs[:, 0].numpy(), expected, rtol=1e-6)


def test_repeated_rows_warn_with_their_count_and_dedupe_drops_them(tmp_path: Path) -> None:
    # lines 18 and 19 copy line 2 (a,0,0); line 20 repeats its site and features with another label
    text = "site,x,label\n" + _rows() + "a,0,0\na,0,0\na,0,1\n"
    data, messages = _built(_table(tmp_path, text))
    assert len(data.data.inputs) == 19
    shown = [m for m in messages if "repeating" in m]
    assert len(shown) == 1
    assert "rows repeating an earlier row of their site exactly: 2 (line 18 = line 2, line 19 = line 2)" in shown[0]
    assert "dedupe: true" in shown[0]
    assert "another target: 1 (line 20 = line 2), conflicting labels" in shown[0]
    deduped, messages = _built(_table(tmp_path, text, dedupe=True))
    assert len(deduped.data.inputs) == 17  # the two copies dropped, the conflicting row kept
    assert deduped.data.details["dropped_duplicates"] == ["line 18", "line 19"]
    assert deduped.data.details["rows"]["a"][-1] == 18  # line 20 is row 18 of the file (from 0)
    assert not any("exactly" in m for m in messages) and any("conflicting" in m for m in messages)
    assert deduped.manifest()["details"]["dedupe"] is True


def test_the_same_features_at_two_sites_are_no_duplicate(tmp_path: Path) -> None:
    data, messages = _built(_table(tmp_path, "site,x,label\n" + _rows() + "b,0,0\n"))  # line 2 is a,0,0
    assert not any("repeating" in m for m in messages)
    assert len(data.data.inputs) == 17


def test_a_rare_class_and_a_fractional_label_warn_naming_them(tmp_path: Path) -> None:
    # labels 0/1 and one 0.5 at line 18: pandas reads the column as floats ("0.0", "0.5", "1.0")
    data, messages = _built(_table(tmp_path, "site,x,label\n" + _rows() + "a,99,0.5\n"))
    assert data.num_classes == 3
    rare = [m for m in messages if "fewer than 5 samples" in m]
    assert len(rare) == 1 and "'0.5': 1 (first at line 18)" in rare[0]
    fractional = [m for m in messages if "not as integers" in m]
    assert len(fractional) == 1 and "['0.5']" in fractional[0] and "task: regression" in fractional[0]


def test_well_formed_labels_give_no_label_warning(tmp_path: Path) -> None:
    _, messages = _built(_table(tmp_path, "site,x,label\n" + _rows()))  # 8 of each class
    assert not [m for m in messages if "samples in the whole pool" in m or "integers" in m]
