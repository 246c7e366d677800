"""A published row reproduces on any core count: ``recipes/fedsca_tiny.yaml`` pins ``federation.threads: 2`` (the
count docs/segmentation.md's tiny-run table was measured at), so its FedAvg row comes out to the doc's digits even
where PyTorch would choose 1 thread (``OMP_NUM_THREADS=1``, a 1-core machine)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from tests.children import run_child

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "segmentation.md"


def _doc_row(strategy: str) -> dict[str, str]:
    """The row of the doc's tiny-run table whose first cell is ``strategy``, cells by column header."""
    lines = DOC.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| strategy | site_0 |"))
    header = [cell.strip() for cell in lines[start].strip("|").split("|")]
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        cells = [cell.strip().strip("*") for cell in line.strip("|").split("|")]
        if cells[0] == strategy:
            return dict(zip(header, cells, strict=True))
    raise AssertionError(f"no {strategy} row in the table of {DOC.name}")


def test_the_doc_row_is_read_as_published():
    """The parser reads the FedAvg row as printed in docs/segmentation.md (copied here by hand)."""
    row = _doc_row("FedAvg")
    assert [row[f"site_{i}"] for i in range(4)] == ["0.755", "0.591", "0.638", "0.533"]
    assert (row["mean Dice"], row["mean IoU"]) == ("0.629", "0.479")


@pytest.mark.long
def test_the_fedavg_row_of_the_tiny_table_reproduces_at_one_omp_thread(tmp_path):
    """``fedsca_tiny.yaml`` + ``fedsca_baselines/fedavg.yaml`` as the doc runs them, under ``OMP_NUM_THREADS=1``:
    the pinned 2 threads are recorded and the round-10 test Dice per site, mean Dice and mean IoU equal the doc's
    FedAvg row to its 3 decimals (without the pin, 1 thread changes the third decimal)."""
    out = tmp_path / "fedavg"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    recipes = ROOT / "recipes"
    done = run_child(
        [
            sys.executable,
            "-m",
            "fedlit",
            "fit",
            "--config",
            str(recipes / "fedsca_tiny.yaml"),
            "--config",
            str(recipes / "fedsca_baselines" / "fedavg.yaml"),
            "--federation.progress_bar",
            "false",
            "--out_dir",
            str(out),
        ],
        cwd=ROOT,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads((out / "config.json").read_text())["federation"]["threads"] == 2
    row = _doc_row("FedAvg")
    test = {}
    for line in (out / "metrics.csv").read_text().splitlines()[1:]:
        rnd, client, split, metric, value = line.split(",")
        if rnd == "10" and split == "test" and metric in ("dice", "iou"):
            test[client, metric] = float(value)
    sites = [f"site_{i}" for i in range(4)]
    assert [f"{test[site, 'dice']:.3f}" for site in sites] == [row[site] for site in sites], test
    assert f"{sum(test[s, 'dice'] for s in sites) / 4:.3f}" == row["mean Dice"], test
    assert f"{sum(test[s, 'iou'] for s in sites) / 4:.3f}" == row["mean IoU"], test
