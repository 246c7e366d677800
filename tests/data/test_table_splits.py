"""``SiteTable``: splits from a column, survival targets (checked, split by event, warned about), Parquet types."""

from __future__ import annotations

import json
import re
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from fedlit.cli import run
from fedlit.core.errors import ConfigError, DataError
from fedlit.data import SiteTable

SPLIT_OF = ("train",) * 6 + ("val",) * 2 + ("test",) * 2  # 10 rows per site, in file order


def _cohort(seed: int = 0) -> pd.DataFrame:
    """Two sites of 10 patients, with a time, an event flag and a split column; rows interleaved by site."""
    rng = np.random.default_rng(seed)
    parts = []
    for k, site in enumerate(("b", "a")):
        parts.append(
            pd.DataFrame(
                {
                    "x1": rng.normal(5 * k, 1 + k, 10),
                    "x2": rng.normal(0, 1, 10),
                    "time": rng.exponential(1.0, 10).round(3),
                    "event": [1, 0] * 5,
                    "site": site,
                    "split": SPLIT_OF,
                }
            )
        )
    frame = pd.concat(parts, ignore_index=True)
    return frame.iloc[np.ravel(np.stack([np.arange(10), np.arange(10, 20)], axis=1))].reset_index(drop=True)


def _survival(path: Path, **kwargs) -> SiteTable:
    return SiteTable(path=path, task="survival", target_column=["time", "event"], **kwargs)


def test_split_column_gives_each_rows_split_and_is_no_feature(tmp_path: Path) -> None:
    frame = _cohort()
    frame.to_csv(tmp_path / "c.csv", index=False)
    data = _survival(tmp_path / "c.csv", split_column="split")
    details = data.manifest()["details"]
    assert details["feature_names"] == ["x1", "x2"] and details["split_column"] == "split"
    assert details["split_fractions"] is None and details["splits_from"] == "column 'split' of the file"
    assert data.num_classes == 0 and data.data.targets.shape == (20, 2)
    for site in ("a", "b"):
        start = details["pool"][site][0]
        rows = details["rows"][site]
        for split in ("train", "val", "test"):
            got = sorted(rows[i - start] for i in data.data.splits[site][split])
            assert got == frame.index[(frame["site"] == site) & (frame["split"] == split)].tolist()
        # standardized with the site's 6 train rows only, worked out from the file
        train = frame[(frame["site"] == site) & (frame["split"] == "train")][["x1", "x2"]].to_numpy()
        raw = frame.loc[rows, ["x1", "x2"]].to_numpy()
        expected = (raw - train.mean(axis=0)) / train.std(axis=0, ddof=1)
        end = details["pool"][site][1]
        assert np.allclose(data.data.inputs[start:end].numpy(), expected, atol=1e-5)
    # the seed draws nothing: the same splits
    other = _survival(tmp_path / "c.csv", split_column="split", seed=7)
    assert other.manifest()["clients"] == data.manifest()["clients"]


def test_a_site_without_val_rows_has_no_validation_split(tmp_path: Path) -> None:
    frame = _cohort()
    frame.loc[(frame["site"] == "a") & (frame["split"] == "val"), "split"] = "train"
    frame.to_csv(tmp_path / "c.csv", index=False)
    data = _survival(tmp_path / "c.csv", split_column="split")
    assert [data.num_examples("a", s) for s in ("train", "val", "test")] == [8, 0, 2]
    assert data.val_dataloader("a") is None and data.val_dataloader("b") is not None


def test_bad_split_values_and_sites_without_train_rows_are_refused(tmp_path: Path) -> None:
    frame = _cohort()
    frame.loc[3, "split"] = "Train"
    frame.loc[8, "split"] = "validation"
    frame.to_csv(tmp_path / "c.csv", index=False)
    with pytest.raises(DataError) as info:
        _survival(tmp_path / "c.csv", split_column="split").setup()
    assert str(info.value) == (
        f"{tmp_path / 'c.csv'}: line 5, column 'split': 'Train' is not a split; line 10, "
        "column 'split': 'validation' is not a split (data.init_args.split_column: each "
        "value must be one of ['train', 'val', 'test'], lower case)"
    )
    frame.to_parquet(tmp_path / "c.parquet")
    with pytest.raises(DataError, match=r"c\.parquet: row 3, column 'split': 'Train' is not a split"):
        _survival(tmp_path / "c.parquet", split_column="split").setup()
    frame = _cohort()
    frame.loc[frame["site"] == "b", "split"] = "test"
    frame.to_csv(tmp_path / "c.csv", index=False)
    with pytest.raises(
        DataError,
        match=re.escape(
            "column 'split' (data.init_args.split_column): site 'b' has no "
            "train row; every site needs train and test rows"
        ),
    ):
        _survival(tmp_path / "c.csv", split_column="split").setup()
    with pytest.raises(ConfigError, match=r"split_fractions=\[0.5, 0.25, 0.25\] with split_column='split'"):
        _survival(tmp_path / "c.csv", split_column="split", split_fractions=(0.5, 0.25, 0.25))
    with pytest.raises(DataError, match=r"split_column: \['splits'\] not in the columns"):
        _survival(tmp_path / "c.csv", split_column="splits").setup()


def test_survival_splits_are_stratified_by_the_event_flag(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    n = 40  # 8 events per site: 4 train, 2 val, 2 test when split 0.5 / 0.25 / 0.25 in proportion
    frame = pd.DataFrame(
        {
            "x": rng.normal(size=2 * n),
            "time": rng.exponential(1.0, 2 * n),
            "event": np.tile(np.r_[np.ones(8), np.zeros(n - 8)], 2).astype(int),
            "site": np.repeat(["s0", "s1"], n),
        }
    )
    frame.to_csv(tmp_path / "c.csv", index=False)
    for seed in range(8):
        data = _survival(tmp_path / "c.csv", split_fractions=(0.5, 0.25, 0.25), seed=seed)
        events = data.data.targets[:, 1]
        for site in ("s0", "s1"):
            counts = [int(events[torch.from_numpy(data.data.splits[site][s])].sum()) for s in ("train", "val", "test")]
            assert counts == [4, 2, 2], (seed, site, counts)
    assert "stratified by the event flag" in data.manifest()["details"]["splits_from"]


@pytest.mark.parametrize(
    ("column", "value", "message"),
    [
        ("time", -1.5, "line 6, column 'time': -1.5 is negative (survival times are >= 0)"),
        ("time", np.inf, "line 6, column 'time': inf is not finite"),
        ("event", 2, "line 6, column 'event': 2 is not an event flag (1 = event, 0 = censored)"),
        ("event", "yes", "line 6, column 'event': 'yes' is not a number"),
    ],
)
def test_bad_survival_targets_name_file_line_and_column(
    tmp_path: Path, column: str, value: object, message: str
) -> None:
    frame = _cohort()
    frame[column] = frame[column].astype(object)
    frame.loc[4, column] = value
    frame.to_csv(tmp_path / "c.csv", index=False)
    with pytest.raises(DataError) as info:
        _survival(tmp_path / "c.csv", split_column="split").setup()
    assert str(info.value).startswith(f"{tmp_path / 'c.csv'}: {message}")
    with pytest.raises(ConfigError, match=r"a survival task takes two columns, \[time, event\], got \['time'\]"):
        SiteTable(path=tmp_path / "c.csv", task="survival", target_column="time")


def _warned(data: SiteTable) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        data.setup()
    return [str(w.message) for w in caught if "no event" in str(w.message)]


def test_splits_without_events_warn_once_per_site(tmp_path: Path) -> None:
    frame = _cohort()
    frame.loc[(frame["site"] == "b") & (frame["split"] != "train"), "event"] = 0  # b: no event in val nor test
    frame.loc[(frame["site"] == "a") & (frame["split"] == "test"), "event"] = 0  # a: none in test
    frame.to_csv(tmp_path / "c.csv", index=False)
    messages = _warned(_survival(tmp_path / "c.csv", split_column="split"))
    assert len(messages) == 2
    assert messages[0].startswith(
        f"SiteTable ({tmp_path / 'c.csv'}): site 'a' has no event in its test split (2 "
        "rows): its C-index is undefined there (NaN), so the mean over clients of that "
        "split leaves it out and covers fewer clients; mark rows with an event as val/test"
    )
    assert "site 'b' has no event in its val split (2 rows) or its test split (2 rows)" in messages[1]
    # drawn splits: one event at site a lands in one split, so its val or its test split has none
    frame = _cohort().drop(columns="split")
    frame.loc[frame["site"] == "a", "event"] = [1] + [0] * 9
    frame.to_csv(tmp_path / "d.csv", index=False)
    messages = _warned(_survival(tmp_path / "d.csv"))
    assert len(messages) == 1 and "site 'a' has no event in its" in messages[0]
    assert "larger val/test share of split_fractions" in messages[0]
    assert _warned(_survival(tmp_path / "c.csv", split_column="split", standardize=False)) != []
    frame = _cohort()
    frame.to_csv(tmp_path / "e.csv", index=False)
    assert _warned(_survival(tmp_path / "e.csv", split_column="split")) == []  # events everywhere: no warning


def test_parquet_dates_durations_categories_and_numbers_as_text_are_refused(tmp_path: Path) -> None:
    frame = _cohort().drop(columns="split")
    frame["when"] = pd.Timestamp("2020-01-01") + pd.to_timedelta(np.arange(20), unit="D")
    frame["stay"] = pd.to_timedelta(np.arange(20), unit="h")
    frame["dose"] = [str(v) for v in range(20)]
    frame["grade"] = pd.Categorical(["low", "high"] * 10)
    frame.to_parquet(tmp_path / "c.parquet")
    with pytest.raises(DataError) as info:
        _survival(tmp_path / "c.parquet").setup()
    message = str(info.value)
    assert message.startswith(f"{tmp_path / 'c.parquet'}: column 'when' (feature) has dtype datetime64[")
    assert "column 'stay' (feature) has dtype timedelta64[" in message and ".dt.total_seconds()" in message
    assert "numbers stored as text; cast it first: df['dose'] = pd.to_numeric(df['dose'])" in message
    assert "column 'grade' (feature) has dtype category: one-hot encode it" in message
    assert len(message.splitlines()) == 1
    frame = _cohort().drop(columns="split")
    frame["time"] = frame["time"].astype(str)  # a numeric target stored as text
    frame.to_parquet(tmp_path / "t.parquet")
    with pytest.raises(DataError, match=r"column 'time' \(target\) has dtype .*: numbers stored as text"):
        _survival(tmp_path / "t.parquet").setup()


def test_booleans_are_0_and_1_in_parquet_and_csv(tmp_path: Path) -> None:
    frame = _cohort().drop(columns="split")
    frame["smoker"] = [True, False, False] * 6 + [True, True]
    frame.to_parquet(tmp_path / "c.parquet")
    frame.to_csv(tmp_path / "c.csv", index=False)  # written as True/False text
    assert "True" in (tmp_path / "c.csv").read_text()
    built = [_survival(tmp_path / name, standardize=False).data for name in ("c.parquet", "c.csv")]
    for data in built:
        details_rows = np.concatenate([np.arange(1, 20, 2), np.arange(0, 20, 2)])  # site a's rows, then b's
        assert data.inputs[:, 2].tolist() == frame["smoker"].to_numpy()[details_rows].astype(float).tolist()
    assert torch.equal(built[0].inputs, built[1].inputs)


def test_csv_not_utf8_far_into_the_file_names_its_byte_and_line(tmp_path: Path) -> None:
    rows = "".join(f"{i},{i % 2},x{i % 3}\n" for i in range(30_000))  # past the first chunk pandas decodes
    data = ("f,site,label\n" + rows).encode()
    at = data.index(b"\n", len(data) - 40) + 1
    (tmp_path / "big.csv").write_bytes(data[:at] + b"\xe9" + data[at + 1 :])
    line = data[:at].count(b"\n") + 1
    with pytest.raises(DataError, match=re.escape(f"not UTF-8 text: byte {at} (line {line}) is 0xe9")):
        SiteTable(path=tmp_path / "big.csv").setup()


RECIPE = """
model:
  class_path: fedlit.tasks.CoxModule
  init_args:
    backbone: {class_path: fedlit.models.Identity, init_args: {num_features: 2}}
    optimizer: adam
    lr: 0.05
data:
  class_path: fedlit.data.SiteTable
  init_args: {path: PATH, task: survival, target_column: [time, event], split_column: split, batch_size: 8}
strategy: {class_path: FedAvg}
federation: {rounds: 2, local_epochs: 1, seed: 0, progress_bar: false}
"""


def test_cox_recipe_on_a_split_column_trains_through_the_cli(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(80, 2))
    frame = pd.DataFrame(
        {
            "x1": x[:, 0],
            "x2": x[:, 1],
            "time": rng.exponential(np.exp(-x[:, 0])),
            "event": (rng.random(80) < 0.7).astype(int),
            "site": np.repeat(["a", "b"], 40),
            "split": np.tile(["train"] * 24 + ["val"] * 8 + ["test"] * 8, 2),
        }
    )
    frame.to_csv(tmp_path / "c.csv", index=False)
    recipe = tmp_path / "cox.yaml"
    recipe.write_text(RECIPE.replace("PATH", str(tmp_path / "c.csv")))
    run(["fit", "--config", str(recipe), "--out_dir", str(tmp_path / "run")])
    saved = json.loads((tmp_path / "run" / "results.json").read_text())
    assert saved["last"]["round"] == 2 and sorted(saved["last"]["clients"]) == ["a", "b"]
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert {s: [len(manifest["clients"][s][k]) for k in ("train", "val", "test")] for s in ("a", "b")} == {
        "a": [24, 8, 8],
        "b": [24, 8, 8],
    }
    assert manifest["clients"]["b"]["test"] == list(range(72, 80))  # the pool rows of b's last 8 file rows
    for site in ("a", "b"):
        assert 0.0 <= saved["last"]["clients"][site]["c_index"] <= 1.0  # test metrics
