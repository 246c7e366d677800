"""``fedlit report``: table arithmetic on hand-made run folders, unreadable files, a real quickstart run."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

from fedlit.cli import run as cli_run
from fedlit.commands import report
from fedlit.core.errors import ConfigError, DataError

LOCAL = "fedlit.strategies.local.Local"
FEDAVG = "fedlit.strategies.fedavg.FedAvg"


def make_run(
    folder: Path,
    strategy: str,
    seed: int,
    last: dict[str, float],
    best: dict[str, float] | None = None,
    val: dict[int, float] | None = None,
    lr: float = 0.1,
) -> Path:
    """A minimal run folder: results.json (last/best per client accuracy), config.json and metrics.csv."""
    folder.mkdir(parents=True)
    results = {
        "strategy_class": strategy,
        "seed": seed,
        "comm": {"upload_bytes": 1000 * (seed + 1)},
        "last": {"round": 3, "clients": {c: {"accuracy": v} for c, v in last.items()}},
    }
    if best is not None:
        results["best"] = {"round": 2, "clients": {c: {"accuracy": v} for c, v in best.items()}}
    (folder / "results.json").write_text(json.dumps(results))
    (folder / "config.json").write_text(
        json.dumps({"model": {"init_args": {"lr": lr}}, "federation": {"seed": seed}, "out_dir": str(folder)})
    )
    rows = ["round,client,split,metric,value"]
    for r, v in (val or {1: 0.5, 2: 0.6, 3: 0.7}).items():
        rows += [
            f"{r},,val,accuracy_mean,{v}",
            f"{r},,comm,upload_bytes_cumulative,{100 * r}",
            f"{r},,system,trainable_parameters,1234",
        ]
    (folder / "metrics.csv").write_text("\n".join(rows) + "\n")
    return folder


@pytest.fixture
def experiment(tmp_path: Path) -> Path:
    # FedAvg, seeds 0 and 1; Local, seeds 0 and 1; clients a and b
    make_run(tmp_path / "fedavg" / "seed_0", FEDAVG, 0, last={"a": 0.8, "b": 0.6}, best={"a": 0.9, "b": 0.5})
    make_run(tmp_path / "fedavg" / "seed_1", FEDAVG, 1, last={"a": 0.6, "b": 0.4}, best={"a": 0.7, "b": 0.3})
    make_run(tmp_path / "local" / "seed_0", LOCAL, 0, last={"a": 0.7, "b": 0.7}, best={"a": 0.6, "b": 0.6}, lr=0.2)
    make_run(tmp_path / "local" / "seed_1", LOCAL, 1, last={"a": 0.5, "b": 0.3}, best={"a": 0.5, "b": 0.1}, lr=0.2)
    return tmp_path


def test_tables_mean_std_over_seeds_and_gain_over_local(experiment: Path) -> None:
    runs, warnings = report.load_runs([experiment])
    assert warnings == []
    groups = report.by_method(runs)
    assert sorted(groups) == ["FedAvg", "Local"] and all(len(r) == 2 for r in groups.values())
    last = report.client_table(groups, "last", "accuracy")
    # client a, FedAvg: 0.8 and 0.6 -> mean 0.7, sample std sqrt(((0.1)^2 + (0.1)^2) / 1) = 0.141421
    assert last["a"]["FedAvg"] == pytest.approx((0.7, math.sqrt(0.02)))
    # average row: per-seed means 0.7 (seed 0) and 0.5 (seed 1) -> 0.6 +- 0.141421
    assert last["average"]["FedAvg"] == pytest.approx((0.6, math.sqrt(0.02)))
    # Local client b: 0.7, 0.3 -> 0.5 +- sqrt(0.08) = 0.282843
    assert last["b"]["Local"] == pytest.approx((0.5, math.sqrt(0.08)))
    stats = report.summary(groups, "best", "accuracy")
    # FedAvg best: seed 0 mean (0.9 + 0.5) / 2 = 0.7, worst 0.5; seed 1 mean 0.5, worst 0.3
    assert stats["FedAvg"]["mean"] == pytest.approx((0.6, math.sqrt(0.02)))
    assert stats["FedAvg"]["worst"] == pytest.approx((0.4, math.sqrt(0.02)))
    # gain paired by seed, at best: seed 0 (0.9 - 0.6 + 0.5 - 0.6) / 2 = 0.1; seed 1 (0.2 + 0.2) / 2 = 0.2
    # -> mean 0.15, std sqrt((0.05^2 * 2) / 1) = 0.070711
    assert stats["FedAvg"]["gain"] == pytest.approx((0.15, math.sqrt(0.005)))
    assert stats["FedAvg"]["paired"] == [0, 1]
    assert "gain" not in stats["Local"]


def test_standard_errors_over_seeds(experiment: Path) -> None:
    groups = report.by_method(report.load_runs([experiment])[0])
    # three values 0.5, 0.6, 0.9: mean 2/3, squared deviations 1/36 + 1/225 + 49/900 = 0.086667, / 2 = 0.043333;
    # standard error sqrt(0.043333 / 3) = 0.120185
    assert report.mean_se([0.5, 0.6, 0.9]) == pytest.approx((2 / 3, 0.120185), abs=1e-6)
    assert report.mean_se([0.5, math.nan]) == (0.5, pytest.approx(math.nan, nan_ok=True))
    # client a, FedAvg, last: 0.8 and 0.6 -> std 0.141421, standard error 0.141421 / sqrt(2) = 0.1
    assert report.client_table(groups, "last", "accuracy", report.mean_se)["a"]["FedAvg"] == pytest.approx((0.7, 0.1))
    stats = report.summary(groups, "best", "accuracy", spread=report.mean_se)
    assert stats["FedAvg"]["mean"] == pytest.approx((0.6, 0.1))
    assert stats["FedAvg"]["worst"] == pytest.approx((0.4, 0.1))
    # gains 0.1 and 0.2: std 0.070711, standard error 0.05
    assert stats["FedAvg"]["gain"] == pytest.approx((0.15, 0.05))


def test_sampling_standard_error_of_a_client() -> None:
    # accuracy 0.8 on 30 + 10 test images: sqrt(0.8 * 0.2 / 40) = sqrt(0.004) = 0.063246
    assert report.sampling_se("accuracy", 0.8, [30, 10, 0]) == pytest.approx(0.063246, abs=1e-6)
    # balanced accuracy 0.8 over the 2 classes present: sqrt(0.16 / 30 + 0.16 / 10) / 2 = sqrt(0.021333) / 2
    assert report.sampling_se("balanced_accuracy", 0.8, [30, 10, 0]) == pytest.approx(0.073030, abs=1e-6)
    # 15 images, 13 of the majority class: majority-class accuracy 13/15 = 0.8667 +- 0.0878
    assert report.sampling_se("accuracy", 13 / 15, [13, 2]) == pytest.approx(0.087771, abs=1e-6)
    assert math.isnan(report.sampling_se("auroc", 0.8, [30, 10]))
    assert math.isnan(report.sampling_se("accuracy", 0.8, [0, 0]))


def test_report_shows_each_clients_sampling_error(experiment: Path, tmp_path: Path) -> None:
    for run in experiment.glob("*/seed_*"):
        (run / "class_counts.json").write_text(
            json.dumps({"a": {"train": [1, 1], "test": [20, 5]}, "b": {"train": [1, 1], "test": [100, 0]}})
        )
    report.write([experiment], tmp_path / "out")
    text = (tmp_path / "out" / "report.md").read_text()
    best = text.split("## Per-client test accuracy at the best")[1].split("## Per-client test accuracy at the last")[0]
    # client a (25 test images), best round: FedAvg 0.9 and 0.7 -> sqrt(0.09 / 25) = 0.06, sqrt(0.21 / 25) = 0.091652,
    # mean 0.075826; Local 0.6 and 0.5 -> 0.097980 and 0.1, mean 0.098990
    assert "| a | 25 | 0.0758 | 0.0990 |" in best
    # client b (100): FedAvg 0.5 and 0.3 -> 0.05 and 0.045826, mean 0.047913; Local 0.6, 0.1 -> 0.048990, 0.03
    assert "| b | 100 | 0.0479 | 0.0395 |" in best
    # average, FedAvg: seed 0 sqrt(0.06^2 + 0.05^2) / 2 = 0.039051, seed 1 sqrt(0.0084 + 0.0021) / 2 = 0.051235
    assert "| **average** | — | 0.0451 |" in best


def test_gain_pairs_only_matching_seeds(tmp_path: Path) -> None:
    make_run(tmp_path / "f0", FEDAVG, 0, last={"a": 0.8})
    make_run(tmp_path / "f5", FEDAVG, 5, last={"a": 0.1})  # no Local run of seed 5: not paired
    make_run(tmp_path / "l0", LOCAL, 0, last={"a": 0.5})
    runs, _ = report.load_runs([tmp_path])
    stats = report.summary(report.by_method(runs), "last", "accuracy")
    assert stats["FedAvg"]["paired"] == [0]
    assert stats["FedAvg"]["unpaired"] == [f"{tmp_path / 'f5'}: no Local run of seed 5"]
    assert stats["FedAvg"]["gain"][0] == pytest.approx(0.3)
    assert math.isnan(stats["FedAvg"]["gain"][1])  # one paired seed: no std


def test_write_report_bold_best_and_config_differences(experiment: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    report.main([str(experiment), "--out", str(out)])
    text = (out / "report.md").read_text()
    # last round, client a: FedAvg 0.7 beats Local 0.6 (0.7, 0.5)
    # the tables show mean ± standard error over the 2 seeds: std / sqrt(2) = 0.141421 / 1.414214 = 0.1
    assert "| a | **0.7000 ± 0.1000** | 0.6000 ± 0.1000 |" in text
    assert "+0.1500 ± 0.0500" in text  # gain std 0.070711 / sqrt(2)
    assert "model.init_args.lr" in text and "federation.seed" in text and "out_dir" not in text.split("differ")[1]
    assert {p.name for p in out.iterdir()} >= {"report.md", "report.html", "convergence.png", "cost.png"}
    page = (out / "report.html").read_text()
    assert page.count("data:image/png;base64,") == 2 and "<b>0.7000 ± 0.1000</b>" in page


def test_corrupt_files_are_named_and_the_others_reported(
    experiment: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    broken = experiment / "fedavg" / "seed_1" / "results.json"
    broken.write_text("{not json")
    bad_csv = experiment / "local" / "seed_1" / "metrics.csv"
    bad_csv.write_text("round,client,split,metric,value\n1,,val\n")
    out = tmp_path / "out"
    report.main([str(experiment), "--out", str(out)])
    printed = capsys.readouterr().out
    assert str(broken) in printed and str(bad_csv) in printed and "line 2 has 3 columns" in printed
    text = (out / "report.md").read_text()
    assert str(broken) in text
    runs, warnings = report.load_runs([experiment, experiment / "nowhere"])
    assert len(runs) == 3  # the run with a bad metrics.csv is still in the tables
    assert any(f"{experiment / 'nowhere'}: not a folder" in w for w in warnings)


def test_no_readable_run_is_a_data_error(tmp_path: Path) -> None:
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "results.json").write_text("[")
    with pytest.raises(DataError, match=r"no readable run.*results.json"):
        report.load_runs([tmp_path])
    with pytest.raises(DataError, match="missing: not a folder"):
        report.load_runs([tmp_path / "missing"])


def test_report_of_a_real_quickstart_run(tmp_path: Path) -> None:
    run_dir = tmp_path / "quickstart"
    cli_run(
        [
            "fit",
            "--config",
            "recipes/quickstart.yaml",
            "--federation.rounds",
            "2",
            "--federation.local_epochs",
            "1",
            "--data.init_args.samples_per_client",
            "60",
            "--out_dir",
            str(run_dir),
        ]
    )
    out = tmp_path / "report"
    cli_run(["report", str(run_dir), "--out", str(out)])
    text = (out / "report.md").read_text()
    assert "FedBN (1 seed: 0)" in text
    for client in ("site_0", "site_1", "site_2", "site_3"):
        assert f"| {client} |" in text
    assert (out / "convergence.png").stat().st_size > 0 and (out / "cost.png").exists()
    assert (out / "partition_seed_0.png").stat().st_size > 0 and "## Partition" in text
    assert "No run of Local among the inputs" in text


def test_labels_are_drawn_as_plain_text_and_escaped_in_tables(tmp_path: Path) -> None:
    # client ids and recipe folders that matplotlib's mathtext cannot parse, a | that would end a Markdown cell,
    # HTML markup: the report draws and writes them as text
    odd, clients = "$\\frac{x$", ["$\\frac{x$", "a|b", "<b>&"]
    for folder, lr, values in ((odd, 0.1, [0.8, 0.6, 0.5]), ("b|c", 0.2, [0.7, 0.9, 0.4])):
        run = make_run(tmp_path / "runs" / folder, FEDAVG, 0, last=dict(zip(clients, values, strict=True)), lr=lr)
        (run / "class_counts.json").write_text(
            json.dumps({c: {"train": [3, 1], "val": [1, 1], "test": [1, 1]} for c in clients})
        )
    out = tmp_path / "out"
    report.main([str(tmp_path / "runs"), "--out", str(out)])
    text = (out / "report.md").read_text()
    # methods are named by what sets them apart (their lr); the configuration table's columns by their folders
    assert "| client | FedAvg lr=0.1 | FedAvg lr=0.2 |" in text and f"| key | {odd} | b\\|c |" in text
    assert f"| {odd} | **0.8000** | 0.7000 |" in text and "| a\\|b | 0.6000 | **0.9000** |" in text
    for figure in ("convergence.png", "cost.png", "partition_seed_0.png"):
        assert (out / figure).stat().st_size > 0
    page = (out / "report.html").read_text()
    assert page.count("data:image/png;base64,") == 3 and "<td>&lt;b&gt;&amp;</td>" in page
    report.main([str(tmp_path / "runs"), "--out", str(tmp_path / "svg"), "--vector", "svg"])
    drawn = (tmp_path / "svg" / "partition_seed_0.svg").read_text()  # SVG text stays text: the id as given
    assert ">$\\frac{x$<" in drawn and ">&lt;b&gt;&amp;<" in drawn


def test_unknown_metric_lists_the_known_ones(experiment: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"--metric auroc: no run has test values of it; the runs have \['accuracy"):
        report.write([experiment], tmp_path / "out", metric="auroc")


def test_ties_as_shown_are_both_bold(tmp_path: Path) -> None:
    # FedAvg's client a: (0.1 + 0.2) / 2 = 0.15000000000000002 in floating point; Local's: 0.15
    make_run(tmp_path / "f" / "seed_0", FEDAVG, 0, last={"a": 0.1})
    make_run(tmp_path / "f" / "seed_1", FEDAVG, 1, last={"a": 0.2})
    make_run(tmp_path / "l" / "seed_0", LOCAL, 0, last={"a": 0.15})
    report.write([tmp_path], tmp_path / "out")
    assert "| a | **0.1500 ± 0.0500** | **0.1500** |" in (tmp_path / "out" / "report.md").read_text()


def test_a_local_run_of_other_clients_is_not_paired(tmp_path: Path) -> None:
    make_run(tmp_path / "f0", FEDAVG, 0, last={"a": 0.8})
    make_run(tmp_path / "l0", LOCAL, 0, last={"z": 0.5})
    runs, _ = report.load_runs([tmp_path])
    stats = report.summary(report.by_method(runs), "last", "accuracy")
    assert stats["FedAvg"]["paired"] == [] and math.isnan(stats["FedAvg"]["gain"][0])


def test_runs_on_other_data_are_not_paired_and_say_why(tmp_path: Path) -> None:
    f0 = make_run(tmp_path / "f0", FEDAVG, 0, last={"a": 0.8})
    l0 = make_run(tmp_path / "l0", LOCAL, 0, last={"a": 0.5})
    (f0 / "manifest.json").write_text(json.dumps({"dataset": "one", "clients": {"a": {}}}))
    (l0 / "manifest.json").write_text(json.dumps({"dataset": "two", "clients": {"a": {}}}))
    runs, _ = report.load_runs([tmp_path])
    stats = report.summary(report.by_method(runs), "last", "accuracy")
    assert stats["FedAvg"]["paired"] == [] and "data dataset 'two'" in stats["FedAvg"]["unpaired"][0]
    report.write([tmp_path], tmp_path / "out")
    assert f"Not paired (FedAvg): {f0}" in (tmp_path / "out" / "report.md").read_text()


def test_an_undefined_client_value_is_left_out_of_mean_and_worst(tmp_path: Path) -> None:
    make_run(tmp_path / "f0", FEDAVG, 0, last={"a": float("nan"), "b": 0.8, "c": 0.6})  # min(nan, ...) is nan
    runs, _ = report.load_runs([tmp_path])
    stats = report.summary(report.by_method(runs), "last", "accuracy")
    assert stats["FedAvg"]["mean"][0] == pytest.approx(0.7) and stats["FedAvg"]["worst"][0] == pytest.approx(0.6)


def _counts(clients: dict[str, list[int]]) -> str:
    return json.dumps({c: {"train": v, "val": [1, 1], "test": [1, 1]} for c, v in clients.items()})


@pytest.mark.long
def test_each_seed_has_its_own_partition_figure_and_the_cost_figure_its_own_heading(
    experiment: Path, tmp_path: Path
) -> None:
    # seed 0 and seed 1 drew other partitions; FedAvg and Local of one seed share theirs
    for method in ("fedavg", "local"):
        (experiment / method / "seed_0" / "class_counts.json").write_text(_counts({"a": [17, 3], "b": [2, 29]}))
        (experiment / method / "seed_1" / "class_counts.json").write_text(_counts({"a": [41, 5], "b": [7, 13]}))
    out = tmp_path / "out"
    report.main([str(experiment), "--out", str(out), "--vector", "svg"])
    text = (out / "report.md").read_text()
    headings = [line for line in text.splitlines() if line.startswith("#")]
    assert headings[-4:] == [
        "## Cost",
        "### Mean validation accuracy against bytes uploaded",
        "## Partition",
        "## Configurations: the keys that differ",
    ]
    cost_section = text.split("### Mean validation accuracy against bytes uploaded")[1].split("## Partition")[0]
    assert "(cost.png)" in cost_section and "partition" not in cost_section
    partition = text.split("## Partition")[1]
    assert "![Partition of seed 0 (from FedAvg" in partition and "(partition_seed_0.png)" in partition
    assert "![Partition of seed 1 (from FedAvg" in partition and "(partition_seed_1.png)" in partition
    assert "other partition" not in partition
    # each figure draws its own seed's counts and says which seed it is
    for seed, shown, absent in ((0, ["17", "29"], ["41"]), (1, ["41", "13"], ["17", "29"])):
        labels = re.findall(r">([^<>]+)</text>", (out / f"partition_seed_{seed}.svg").read_text())
        assert any(t.startswith(f"seed {seed}: ") for t in labels)
        assert all(n in labels for n in shown) and not any(n in labels for n in absent)
    assert (out / "report.html").read_text().count("data:image/png;base64,") == 4  # convergence, cost, 2 seeds
    assert sorted(p.name for p in out.glob("*.svg")) == [
        "convergence.svg",
        "cost.svg",
        "partition_seed_0.svg",
        "partition_seed_1.svg",
    ]
    # a run of seed 0 on other data is named, not drawn
    (experiment / "local" / "seed_0" / "class_counts.json").write_text(_counts({"a": [1, 1], "b": [1, 1]}))
    report.main([str(experiment), "--out", str(out)])
    assert (
        f"Seed 0: the runs {experiment / 'local' / 'seed_0'} have another partition" in (out / "report.md").read_text()
    )


def test_figures_are_written_as_pdf_with_embedded_truetype_fonts_or_png_only(experiment: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    report.main([str(experiment), "--out", str(out)])  # default: PDF beside each PNG
    pdf = (out / "convergence.pdf").read_bytes()
    assert pdf.startswith(b"%PDF") and b"/CIDFontType2" in pdf and b"/Type3" not in pdf
    assert "Vector: [cost.pdf](cost.pdf)" in (out / "report.md").read_text()
    report.main([str(experiment), "--out", str(tmp_path / "png"), "--vector", "none"])
    assert sorted(p.suffix for p in (tmp_path / "png").iterdir()) == [".html", ".md", ".png", ".png"]
    assert "Vector:" not in (tmp_path / "png" / "report.md").read_text()
    with pytest.raises(SystemExit):
        report.main([str(experiment), "--vector", "eps"])
