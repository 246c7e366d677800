"""``SiteTable``: a CSV or Parquet file with a site column; per-site standardization, refused values, CLI."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from fedlit.cli import run
from fedlit.core.errors import DataError
from fedlit.data import SiteTable

SIZES = {"north": 20, "south": 12, "east": 16}


def _frame(seed: int = 0) -> pd.DataFrame:
    """Sites with shifted features; label "yes" when f1 + f2 > the site's shift."""
    rng = np.random.default_rng(seed)
    parts = []
    for k, (site, n) in enumerate(SIZES.items()):
        f1, f2 = rng.normal(3 * k, 1 + k, n), rng.normal(-k, 2, n)
        label = np.where(f1 + f2 > 2 * k, "yes", "no")
        label[:2] = ["yes", "no"]  # both classes at every site
        parts.append(pd.DataFrame({"f1": f1, "hospital": site, "f2": f2, "outcome": label, "age": 50 + k}))
    frame = pd.concat(parts, ignore_index=True)
    return frame.sample(frac=1.0, random_state=1).reset_index(drop=True)  # sites interleaved in the file


@pytest.fixture
def table(tmp_path: Path) -> Path:
    path = tmp_path / "cohort.csv"
    _frame().to_csv(path, index=False)
    return path


def _data(path: Path, **kwargs) -> SiteTable:
    options = {"site_column": "hospital", "target_column": "outcome", "split_fractions": (0.5, 0.25, 0.25)}
    return SiteTable(path=path, **{**options, **kwargs})


def test_sites_rows_classes_and_per_site_standardization(table: Path) -> None:
    data = _data(table)
    frame = pd.read_csv(table)
    assert data.client_ids == ["east", "north", "south"]
    assert data.task == "multiclass" and data.num_classes == 2
    manifest = data.manifest()
    details = manifest["details"]
    assert details["class_names"] == ["no", "yes"] and details["feature_names"] == ["f1", "f2", "age"]
    pool = data.data
    for site, n in SIZES.items():
        rows = details["rows"][site]
        assert sorted(rows) == frame.index[frame["hospital"] == site].tolist()
        start, end = details["pool"][site]
        assert end - start == n
        assert [data.num_examples(site, s) for s in ("train", "val", "test")] == [n // 2, n // 4, n // 4]
        # targets follow the file's rows
        assert pool.targets[start:end].tolist() == (frame.loc[rows, "outcome"] == "yes").astype(int).tolist()
        # standardized with the mean and unbiased std of the site's train rows, worked out from the file
        train_rows = [rows[i - start] for i in data.data.splits[site]["train"]]
        raw = frame.loc[rows, ["f1", "f2"]].to_numpy()
        train = frame.loc[train_rows, ["f1", "f2"]].to_numpy()
        expected = (raw - train.mean(axis=0)) / train.std(axis=0, ddof=1)
        assert np.allclose(pool.inputs[start:end, :2].numpy(), expected, atol=1e-5)
        assert torch.all(pool.inputs[start:end, 2] == 0)  # the constant age column is only centered
    counts = data.class_counts()
    assert sum(sum(counts["south"][s]) for s in counts["south"]) == 12
    x, y = next(iter(data.train_dataloader("north", torch.Generator().manual_seed(0))))
    assert x.shape == (10, 3) and y.dtype == torch.int64


def test_parquet_equals_csv_and_options(table: Path, tmp_path: Path) -> None:
    parquet = tmp_path / "cohort.parquet"
    pd.read_csv(table).to_parquet(parquet)
    a, b = _data(table), _data(parquet)
    assert torch.equal(a.data.inputs, b.data.inputs) and a.manifest()["clients"] == b.manifest()["clients"]
    raw = _data(table, standardize=False, feature_columns=["f2"])
    frame = pd.read_csv(table)
    start, end = raw.manifest()["details"]["pool"]["east"]
    rows = raw.manifest()["details"]["rows"]["east"]
    assert np.allclose(raw.data.inputs[start:end, 0].numpy(), frame.loc[rows, "f2"].to_numpy(), atol=1e-6)
    assert _data(table, seed=1).manifest()["clients"] != a.manifest()["clients"]
    assert _data(table).manifest()["clients"] == a.manifest()["clients"]


def test_binary_and_regression_targets(table: Path) -> None:
    binary = _data(table, task="binary")
    assert binary.num_classes == 1 and binary.data.targets.dtype == torch.float32
    regression = _data(table, task="regression", target_column="f2", feature_columns=["f1"])
    assert regression.task == "regression" and regression.num_classes == 1
    frame = pd.read_csv(table)
    start, end = regression.manifest()["details"]["pool"]["south"]
    rows = regression.manifest()["details"]["rows"]["south"]
    assert np.allclose(regression.data.targets[start:end].numpy(), frame.loc[rows, "f2"].to_numpy(), atol=1e-6)
    assert regression.class_counts() is None


def test_categorical_missing_and_infinite_values_name_line_and_column(tmp_path: Path) -> None:
    frame = _frame()
    frame["f2"] = frame["f2"].astype(object)
    frame.loc[3, "f2"] = "high"
    frame.loc[7, "f1"] = np.nan
    frame.loc[9, "f1"] = np.inf
    path = tmp_path / "bad.csv"
    frame.to_csv(path, index=False)
    with pytest.raises(DataError) as info:
        _data(path).setup()
    message = str(info.value)
    assert message.startswith(f"{path}: line 5, column 'f2': 'high' is not a number (a categorical feature?")
    assert "line 9, column 'f1': is missing" in message
    assert "line 11, column 'f1': inf is not finite" in message
    frame = _frame()
    frame.loc[4, "outcome"] = None
    frame.to_parquet(tmp_path / "bad.parquet")
    with pytest.raises(DataError, match=re.escape(f"{tmp_path / 'bad.parquet'}: row 4, column 'outcome': is miss")):
        _data(tmp_path / "bad.parquet").setup()


def test_bad_options_are_named(table: Path, tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"data.init_args.site_column: \['site'\] not in the columns"):
        _data(table, site_column="site").setup()
    with pytest.raises(DataError, match=r"task='binary' needs exactly 2 values in column 'hospital'"):
        _data(table, task="binary", target_column="hospital", site_column="outcome").setup()
    with pytest.raises(FileNotFoundError, match="data.init_args.path: no file"):
        _data(tmp_path / "none.csv")
    small = _frame()
    small.loc[small["hospital"] == "south", "hospital"] = ["tiny"] * 2 + ["south"] * 10
    small.to_csv(tmp_path / "small.csv", index=False)
    with pytest.raises(DataError, match=r"client 'tiny' has 2 samples, fewer than the 3 non-empty splits"):
        _data(tmp_path / "small.csv").setup()


def test_site_names_that_are_paths_are_refused_naming_them_and_the_column(tmp_path: Path) -> None:
    frame = _frame()
    outside = str(tmp_path.parent / "elsewhere")  # an absolute path
    frame["hospital"] = frame["hospital"].map({"north": "../../x", "south": outside, "east": "east"})
    frame.to_csv(tmp_path / "paths.csv", index=False)
    with pytest.raises(DataError) as info:
        _data(tmp_path / "paths.csv").setup()
    message = str(info.value)
    assert message.startswith(
        f"column 'hospital' of {tmp_path / 'paths.csv'} (data.init_args.site_column): "
        "client ids that are not safe as file names: "
    )
    assert f"'../../x' holds a path separator; {outside!r} holds a path separator." in message
    assert "'east'" not in message and "Rename these sites" in message
    # a space, a percent sign, a dollar sign and quotes are data: kept as they are
    frame["hospital"] = _frame()["hospital"].map({"north": "north 50%", "south": "$south$", "east": "O'East"})
    frame.to_csv(tmp_path / "odd.csv", index=False)
    assert _data(tmp_path / "odd.csv").client_ids == ["$south$", "O'East", "north 50%"]


RECIPE = """
model:
  class_path: fedlit.tasks.ClassificationModule
  init_args:
    backbone: {class_path: fedlit.models.MLP, init_args: {num_features: 3, hidden: [8]}}
    num_classes: 2
    roles: [{pattern: "backbone.*", role: shared}]
    lr: 0.1
data:
  class_path: fedlit.data.SiteTable
  init_args: {path: PATH, site_column: hospital, target_column: outcome, batch_size: 4}
strategy: {class_path: FedAvg}
federation: {rounds: 2, local_epochs: 1, seed: 0, progress_bar: false}
"""


def test_recipe_trains_two_rounds_through_the_cli(table: Path, tmp_path: Path) -> None:
    recipe = tmp_path / "table.yaml"
    recipe.write_text(RECIPE.replace("PATH", str(table)))
    out = tmp_path / "run"
    run(["fit", "--config", str(recipe), "--out_dir", str(out)])
    saved = json.loads((out / "results.json").read_text())
    assert saved["last"]["round"] == 2 and list(saved["last"]["clients"]) == ["east", "north", "south"]
    manifest = json.loads((out / "manifest.json").read_text())
    # default split_fractions 0.6 / 0.2 / 0.2 of 16, 20 and 12 rows
    assert {s: len(manifest["clients"][s]["test"]) for s in SIZES} == {"north": 4, "south": 2, "east": 3}


def test_csv_not_utf8_names_file_byte_offset_and_line(table: Path) -> None:
    raw = table.read_bytes()
    third = raw.index(b"\n", raw.index(b"\n") + 1) + 1  # the start of line 3
    table.write_bytes(raw[:third] + b"caf\xe9" + raw[third:])  # latin-1 "é"
    with pytest.raises(DataError) as info:
        _data(table).setup()
    message = str(info.value)
    assert f"{table}: not UTF-8 text: byte {third + 3} (line 3) is 0xe9; save the file as UTF-8" in message
    assert info.value.__cause__ is None and info.value.__suppress_context__


def test_parquet_text_not_utf8_names_row_and_column(tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    frame = _frame()
    sites = [s.encode() for s in frame["hospital"]]
    sites[5] = b"nor\xffth"
    binary = pa.array(sites, type=pa.binary())
    table = pa.Table.from_pandas(frame.drop(columns="hospital")).append_column(
        "hospital",
        pa.Array.from_buffers(pa.string(), len(sites), binary.buffers()),  # unchecked: not valid UTF-8
    )
    path = tmp_path / "cohort.parquet"
    pq.write_table(table, path)
    with pytest.raises(DataError) as info:
        _data(path).setup()
    assert str(info.value).startswith(f"{path}: row 5, column 'hospital' is not UTF-8 text (byte 3 of the value is")
