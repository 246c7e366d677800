"""The ``manifest.json`` block of docs/runs.md, run as written on a tiny SiteTable run: the clients' indices are
pool indices, and ``details.pool`` with ``details.rows`` map them back to the rows of the CSV."""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd
import torch
import yaml

from fedlit.cli import run
from fedlit.data import SiteTable

ROOT = Path(__file__).resolve().parents[2]
MARKER = r"<!-- tests/docs/test_runs_manifest.py runs this block[^>]*-->"


def _block() -> str:
    blocks = re.findall(MARKER + r"\n```python\n(.*?)```", (ROOT / "docs" / "runs.md").read_text(), re.S)
    assert len(blocks) == 1, "docs/runs.md: the marked manifest.json block is missing or not unique"
    return blocks[0]


def test_the_manifest_block_maps_each_clients_pool_indices_to_its_csv_rows(tmp_path, monkeypatch):
    # two sites whose rows alternate in the file: pool order (site by site) is not file order
    ids = list(range(100, 124))
    frame = pd.DataFrame({"site": ["a", "b"] * 12, "id": ids, "x": [i % 5 for i in ids], "label": [0, 1, 1, 0] * 6})
    frame.to_csv(tmp_path / "cohort.csv", index=False)
    recipe = {
        "model": {
            "class_path": "fedlit.tasks.ClassificationModule",
            "init_args": {
                "backbone": {"class_path": "fedlit.models.Identity", "init_args": {"num_features": 2}},
                "num_classes": 1,
                "task": "binary",
            },
        },
        "data": {
            "class_path": "fedlit.data.SiteTable",
            "init_args": {"path": str(tmp_path / "cohort.csv"), "task": "binary", "standardize": False},
        },
        "strategy": {"class_path": "FedAvg"},
        "federation": {"rounds": 1, "local_steps": 1, "progress_bar": False},
    }
    (tmp_path / "cohort.yaml").write_text(yaml.safe_dump(recipe))
    monkeypatch.chdir(tmp_path)
    run(["fit", "--config", "cohort.yaml", "--strategy", "FedAvg"])  # runs/cohort_fedavg/version_0
    namespace: dict = {}
    exec(compile(_block(), "docs/runs.md", "exec"), namespace)  # noqa: S102
    test = namespace["test"]
    assert sorted(test) == ["a", "b"]
    manifest = namespace["manifest"]
    for client, rows in test.items():
        assert len(rows) == len(manifest["clients"][client]["test"]) > 0
        assert set(rows["site"]) == {client}
    # by hand: site b's rows are the file's rows 1, 3, 5, ... (ids 101, 103, ...), pool indices 12..23 in that order
    assert manifest["details"]["pool"] == {"a": [0, 12], "b": [12, 24]}
    assert namespace["file_row"](12) == ("b", 1) and namespace["file_row"](23) == ("b", 23)
    assert namespace["file_row"](5) == ("a", 10)
    # the rows the block found are the samples the clients were tested on: the pool's own inputs at those indices
    data = SiteTable(path=str(tmp_path / "cohort.csv"), task="binary", standardize=False)
    data.setup()
    column = manifest["details"]["feature_names"].index("id")
    for client, splits in manifest["clients"].items():
        tested = data.data.inputs[torch.as_tensor(splits["test"]), column]
        assert sorted(tested.tolist()) == sorted(test[client]["id"].astype(float))
        assert all(int(i) % 2 == (client == "b") for i in tested)
