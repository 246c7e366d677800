"""One published row of each results table reproduces at 1 and at 2 OpenMP threads.

Every recipe whose numbers a doc publishes pins ``federation.threads`` to the count the doc measured at, so
``OMP_NUM_THREADS`` (or the machine's core count) cannot change them. Each test runs one row the way its doc does,
once under ``OMP_NUM_THREADS=1`` and once under ``OMP_NUM_THREADS=2``, and compares both to the digits the doc
prints, read from the doc itself (so a doc edit that is not re-measured fails here). The FedSCA tiny table has its
own test (``test_threads_reproduce.py``).
"""

from __future__ import annotations

import json
import math
import os
import re
import statistics
import sys
from pathlib import Path

import pytest

from tests.children import run_child

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
RECIPES = ROOT / "recipes"
THREADS = ("1", "2")


def doc_table_row(doc: str, header: str, key: str, *, after: str = "") -> dict[str, str]:
    """The row whose first cell is ``key`` of the first table of ``doc`` whose header line starts with ``header``
    (after the line containing ``after``), cells by column name, markdown emphasis stripped."""
    lines = (DOCS / doc).read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if after in line) if after else 0
    top = next(i for i in range(start, len(lines)) if lines[i].startswith(header))
    names = [cell.strip() for cell in lines[top].strip("|").split("|")]
    for line in lines[top + 2 :]:
        if not line.startswith("|"):
            break
        cells = [cell.strip().strip("*") for cell in line.strip("|").split("|")]
        if cells[0].strip("`") == key:
            return dict(zip(names, cells, strict=True))
    raise AssertionError(f"no row {key!r} in the table {header!r} of {doc}")


def fit(out: Path, threads: str, configs: list[str], *args: str) -> Path:
    """``fedlit fit`` of ``configs`` (relative to recipes/) in a child process under ``OMP_NUM_THREADS=threads``."""
    command = [sys.executable, "-m", "fedlit", "fit"]
    for config in configs:
        command += ["--config", str(RECIPES / config)]
    command += ["--federation.progress_bar", "false", "--out_dir", str(out), *args]
    env = {**os.environ, "OMP_NUM_THREADS": threads, "PYTHONPATH": str(ROOT)}
    done = run_child(command, cwd=ROOT, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    return out


def results(run: Path) -> dict:
    return json.loads((run / "results.json").read_text())


def test_the_doc_rows_are_read_as_published():
    """The reader finds the rows as printed (copied here by hand)."""
    row = doc_table_row("fedpxn_heart.md", "| strategy | round |", "FedPxN")
    assert (row["round"], row["cleveland"], row["va"], row["mean"]) == ("4", "0.834", "0.751", "0.836")
    row = doc_table_row("recipes.md", "| strategy | cleveland |", "FedAdam")
    assert (row["cleveland"], row["mean accuracy"], row["mean AUROC"]) == ("0.750 / 0.854", "0.748", "0.850")
    row = doc_table_row("personalized.md", "| method |", "Local", after="## A setting that can resolve")
    assert (row["mean balanced accuracy"], row["worst client"]) == ("0.675 ± 0.027", "0.425 ± 0.060")


@pytest.mark.long
@pytest.mark.parametrize("threads", THREADS)
def test_fedpxn_heart_table_row(tmp_path, threads):
    """docs/fedpxn_heart.md, test AUROC at the best-validation round: the FedPxN row (round, hospitals, mean)."""
    row = doc_table_row("fedpxn_heart.md", "| strategy | round |", "FedPxN")
    best = results(fit(tmp_path / "run", threads, ["fedpxn_heart/heart_disease_fedpxn.yaml"]))["best"]
    hospitals = ["cleveland", "hungarian", "switzerland", "va"]
    aurocs = [best["clients"][h]["auroc"] for h in hospitals]
    assert str(best["round"]) == row["round"]
    assert [f"{a:.3f}" for a in aurocs] == [row[h] for h in hospitals]
    assert f"{sum(aurocs) / 4:.3f}" == row["mean"]


@pytest.mark.long
@pytest.mark.parametrize("threads", THREADS)
def test_flamby_heart_table_row(tmp_path, threads):
    """docs/recipes.md, FLamby's Fed-Heart-Disease benchmark: the FedAdam row at the last round."""
    row = doc_table_row("recipes.md", "| strategy | cleveland |", "FedAdam")
    last = results(fit(tmp_path / "run", threads, ["flamby_heart/heart_disease_fedadam.yaml"]))["last"]["clients"]
    hospitals = ["cleveland", "hungarian", "switzerland", "va"]
    assert [f"{last[h]['accuracy']:.3f} / {last[h]['auroc']:.3f}" for h in hospitals] == [row[h] for h in hospitals]
    assert f"{sum(last[h]['accuracy'] for h in hospitals) / 4:.3f}" == row["mean accuracy"]
    assert f"{sum(last[h]['auroc'] for h in hospitals) / 4:.3f}" == row["mean AUROC"]


@pytest.mark.long
@pytest.mark.parametrize("threads", THREADS)
def test_recipes_results_table_row(tmp_path, threads):
    """docs/recipes.md, the recipes' results: the TinyUNet row (mean test Dice after rounds 1 and 5, worst site)."""
    row = doc_table_row("recipes.md", "| recipe |", "segmentation_tiny_unet.yaml` (FedAvg)")
    published = re.search(r"Dice ([\d.]+) after round 1, ([\d.]+) after round 5 \(worst site ([\d.]+)\)", str(row))
    assert published, row
    run = fit(tmp_path / "run", threads, ["segmentation_tiny_unet.yaml"])
    dice: dict[tuple[str, str], float] = {}
    for line in (run / "metrics.csv").read_text().splitlines()[1:]:
        rnd, client, split, metric, value = line.split(",")
        if split == "test" and metric == "dice" and client.startswith("site_"):
            dice[rnd, client] = float(value)
    sites = [f"site_{i}" for i in range(4)]
    mean1, mean5 = (sum(dice[r, s] for s in sites) / 4 for r in ("1", "5"))
    worst5 = min(dice["5", s] for s in sites)
    assert (f"{mean1:.3f}", f"{mean5:.3f}", f"{worst5:.3f}") == published.groups()


def seeds_summary(runs: list[Path], metric: str) -> tuple[str, str]:
    """``mean ± standard error`` over seeds of the clients' mean and of the worst client (best-validation round),
    as the report prints them, to 3 decimals."""
    means, worsts = [], []
    for run in runs:
        values = [c[metric] for c in results(run)["best"]["clients"].values()]
        means.append(sum(values) / len(values))
        worsts.append(min(values))

    def fmt(xs: list[float]) -> str:
        return f"{statistics.mean(xs):.3f} ± {statistics.stdev(xs) / math.sqrt(len(xs)):.3f}"

    return fmt(means), fmt(worsts)


@pytest.mark.long
@pytest.mark.parametrize("threads", THREADS)
def test_personalized_synthetic_table_row(tmp_path, threads):
    """docs/personalized.md, the synthetic sites with 160 test images: the Local row over seeds 0, 1, 2."""
    row = doc_table_row("personalized.md", "| method |", "Local", after="## A setting that can resolve")
    configs = ["personalized_partitions/synthetic_base.yaml", "personalized_partitions/synthetic_local.yaml"]
    fit(tmp_path / "local", threads, configs, "--seeds", "0", "1", "2")
    runs = [tmp_path / "local" / f"seed_{s}" for s in range(3)]
    assert seeds_summary(runs, "balanced_accuracy") == (row["mean balanced accuracy"], row["worst client"])


@pytest.mark.long
@pytest.mark.parametrize("threads", THREADS)
def test_report_grid_table_cell(tmp_path, threads):
    """docs/report.md, the shipped CPU grid: its FedAvg cell on the synthetic sites (8 rounds of 5 steps, seeds
    0, 1, 2; mean ± standard error of the clients' mean test balanced accuracy, 4 decimals)."""
    text = (DOCS / "report.md").read_text()
    published = re.search(r"^synthetic +\*\*([\d.]+ ± [\d.]+)\*\*", text, re.M)
    assert published, "the grid table's synthetic row"
    configs = ["personalized_partitions/synthetic_base.yaml", "personalized_partitions/synthetic_fedavg.yaml"]
    overrides = ("--federation.rounds", "8", "--federation.local_steps", "5", "--seeds", "0", "1", "2")
    fit(tmp_path / "fedavg", threads, configs, *overrides)
    means = []
    for s in range(3):
        clients = results(tmp_path / "fedavg" / f"seed_{s}")["best"]["clients"].values()
        means.append(sum(c["balanced_accuracy"] for c in clients) / len(clients))
    se = statistics.stdev(means) / math.sqrt(3)
    assert f"{statistics.mean(means):.4f} ± {se:.4f}" == published.group(1)


@pytest.mark.long
@pytest.mark.parametrize("threads", THREADS)
def test_personalized_pneumoniamnist_table_row(tmp_path, threads, shared_data):
    """docs/personalized.md, PGFed's PneumoniaMNIST table: the Local row of the practical partition (last round:
    accuracy mean / worst, balanced accuracy mean, AUROC mean over the clients where it is defined)."""
    row = doc_table_row("personalized.md", "| run | partition |", "Local")
    configs = [
        "pneumoniamnist_local.yaml",
        "personalized_partitions/practical.yaml",
        "personalized_partitions/cpu.yaml",
    ]
    last = results(fit(tmp_path / "run", threads, configs))["last"]["clients"].values()
    accuracy = [c["accuracy"] for c in last]
    balanced = [c["balanced_accuracy"] for c in last]
    auroc = [c["auroc"] for c in last if not math.isnan(c["auroc"])]
    assert f"{sum(accuracy) / len(accuracy):.3f} / {min(accuracy):.3f}" == row["accuracy mean / worst"]
    assert f"{sum(balanced) / len(balanced):.3f}" == row["balanced accuracy mean"]
    assert f"{sum(auroc) / len(auroc):.3f}" == row["AUROC mean"]
