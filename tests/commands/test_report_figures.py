"""``fedlit report``'s figures where they used to fall short: runs without validation, a fixed split over seeds,
a zero count, one method, one seed."""

from __future__ import annotations

import json
import re
from pathlib import Path

from fedlit.commands import report
from fedlit.commands.partition_summary import plot
from tests.commands.test_report_methods import FEDAVG, LOCAL, write_run


def svg_text(path: Path) -> list[str]:
    return re.findall(r">([^<>]+)</text>", path.read_text())


def with_rows(folder: Path, rows: list[str]) -> None:
    (folder / "metrics.csv").write_text("round,client,split,metric,value\n" + "\n".join(rows) + "\n")


def test_runs_without_validation_get_a_training_curve(tmp_path: Path) -> None:
    for name, cls in (("fedavg", FEDAVG), ("local", LOCAL)):
        run = write_run(tmp_path / "runs" / name, cls, 0, {"a": {"accuracy": 0.5}})
        with_rows(run, [f"{r},,train,loss_mean,{1 / r}" for r in (1, 2, 3)] + ["3,,test,accuracy_mean,0.5"])
    out = tmp_path / "out"
    report.write([tmp_path / "runs"], out, vector="svg")
    text = (out / "report.md").read_text()
    assert not (out / "convergence.png").exists() and (out / "training.png").stat().st_size > 0
    assert "FedAvg, Local have no validation accuracy per round in metrics.csv" in text
    assert "![Mean training loss per round](training.png)" in text
    labels = svg_text(out / "training.svg")
    assert "Training: mean loss per round" in labels and "FedAvg (n=1)" in labels and "Local (n=1)" in labels


def test_one_seed_claims_no_band_and_one_method_is_singular(tmp_path: Path) -> None:
    run = write_run(tmp_path / "runs" / "fedavg", FEDAVG, 0, {"a": {"accuracy": 0.5}})
    with_rows(run, ["1,,val,accuracy_mean,0.4", "2,,val,accuracy_mean,0.6"])
    out = tmp_path / "out"
    report.write([tmp_path / "runs"], out, vector="svg")
    assert "1 run, 1 method: FedAvg (1 seed: 0)." in (out / "report.md").read_text()
    assert "Convergence: mean validation accuracy" in svg_text(out / "convergence.svg")
    second = write_run(tmp_path / "runs" / "fedavg_1", FEDAVG, 1, {"a": {"accuracy": 0.7}})
    with_rows(second, ["1,,val,accuracy_mean,0.5", "2,,val,accuracy_mean,0.7"])
    report.write([tmp_path / "runs"], out, vector="svg")
    assert "Convergence: mean validation accuracy (band: min-max over seeds)" in svg_text(out / "convergence.svg")
    assert "2 runs, 1 method: FedAvg (2 seeds: 0, 1)." in (out / "report.md").read_text()


def test_a_fixed_split_is_drawn_once_and_other_partitions_per_seed(tmp_path: Path) -> None:
    fixed = {"a": {"train": [5, 3], "test": [1, 1]}, "b": {"train": [2, 9], "test": [1, 1]}}
    for seed in (0, 1, 2):
        run = write_run(tmp_path / "runs" / f"seed_{seed}", FEDAVG, seed, {"a": {"accuracy": 0.5}})
        counts = fixed if seed < 2 else {**fixed, "b": {"train": [4, 4], "test": [1, 1]}}
        (run / "class_counts.json").write_text(json.dumps(counts))
    out = tmp_path / "out"
    report.write([tmp_path / "runs"], out, vector=None)
    text = (out / "report.md").read_text()
    assert sorted(p.name for p in out.glob("partition_*.png")) == ["partition_seed_0.png", "partition_seed_2.png"]
    assert "![Partition of seeds 0, 1, the same for each (from FedAvg" in text
    assert "![Partition of seed 2 (from FedAvg" in text
    # the same counts drawn from other samples (the manifests' pool indices differ): one figure, said so
    for seed, train in ((0, [0, 1]), (1, [2, 3])):
        manifest = {"dataset": "d", "clients": {"a": {"train": train}, "b": {"train": [4]}}}
        (tmp_path / "runs" / f"seed_{seed}" / "manifest.json").write_text(json.dumps(manifest))
    report.write([tmp_path / "runs"], out, vector=None)
    text = (out / "report.md").read_text()
    assert "![Partition of seeds 0, 1, the same counts for each (of other samples: the splits differ)" in text


def test_a_zero_count_is_drawn(tmp_path: Path) -> None:
    summary = {
        "dataset": "d",
        "classes": ["no", "yes"],
        "clients": {"a": {"classes": {"train": [7, 0]}}, "b": {"classes": {"train": [3, 5]}}},
    }
    plot(summary, tmp_path / "p.png", vector="svg")
    labels = svg_text(tmp_path / "p.svg")
    assert sorted(t for t in labels if t.isdigit()) == ["0", "3", "5", "7"]
    assert any("a grey x: zero" in t for t in labels)
