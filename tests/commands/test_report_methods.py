"""``fedlit report``: runs grouped by what they are (class and configuration, seeds as replicates), each metric
ranked the way its module declared it, and FLamby's pooled figure shown where results.json holds it."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from typing_extensions import override

from fedlit import FedAvg, Federation
from fedlit.commands import report
from fedlit.commands.report import methods
from fedlit.commands.report.figures import bold_best
from fedlit.core.errors import ConfigError
from fedlit.data import SyntheticSurvival
from fedlit.models import Identity
from fedlit.strategies import Local
from fedlit.tasks import CoxModule

LOCAL = "fedlit.strategies.local.Local"
FEDAVG = "fedlit.strategies.fedavg.FedAvg"


def write_run(
    folder: Path,
    strategy: str,
    seed: int,
    last: dict[str, dict[str, float]],
    config: dict[str, Any] | None = None,
    **results: Any,
) -> Path:
    """A run folder: results.json (``last`` per client and metric, plus ``results``), config.json, metrics.csv."""
    folder.mkdir(parents=True)
    record = {"strategy_class": strategy, "seed": seed, "last": {"round": 2, "clients": last}, **results}
    (folder / "results.json").write_text(json.dumps(record))
    base = {"model": {"init_args": {"lr": 0.1}}, "federation": {"seed": seed}, "out_dir": str(folder)}
    (folder / "config.json").write_text(json.dumps({**base, **(config or {})}))
    (folder / "metrics.csv").write_text("round,client,split,metric,value\n1,,train,loss_mean,0.5\n")
    return folder


def lr(value: float) -> dict[str, Any]:
    return {"model": {"init_args": {"lr": value}}}


def test_two_learning_rates_in_the_default_layout_are_two_methods(tmp_path: Path) -> None:
    # runs/<name>/version_0/seed_<s>, as `fedlit fit --seeds 0 1 2` lays them out: the folders alone look alike
    for name, rate, values in (("fedavg_a", 0.01, [0.5, 0.6, 0.7]), ("fedavg_b", 0.1, [0.8, 0.9, 1.0])):
        for seed, value in enumerate(values):
            folder = tmp_path / name / "version_0" / f"seed_{seed}"
            write_run(folder, FEDAVG, seed, {"a": {"accuracy": value}}, lr(rate))
    runs, warnings = report.load_runs([tmp_path])
    groups = report.by_method(runs)
    assert warnings == [] and list(groups) == ["FedAvg lr=0.01", "FedAvg lr=0.1"]
    assert [r.seed for r in groups["FedAvg lr=0.1"]] == [0, 1, 2]
    # lr 0.1: 0.8, 0.9, 1.0 -> mean 0.9, std 0.1
    assert report.client_table(groups, "last", "accuracy")["a"]["FedAvg lr=0.1"] == pytest.approx((0.9, 0.1))
    report.write([tmp_path], tmp_path / "out", vector=None)
    text = (tmp_path / "out" / "report.md").read_text()
    assert "6 runs, 2 methods: FedAvg lr=0.01 (3 seeds: 0, 1, 2), FedAvg lr=0.1 (3 seeds: 0, 1, 2)." in text
    # the configuration table's columns name each run by its path below the folder that holds them all
    header = next(line for line in text.splitlines() if line.startswith("| key |"))
    assert header.startswith("| key | fedavg_a/version_0/seed_0 | fedavg_a/version_0/seed_1 |")
    assert "fedavg_b/version_0/seed_2 |" in header


def test_the_same_configuration_under_two_names_is_one_method(tmp_path: Path) -> None:
    write_run(tmp_path / "first" / "seed_0", FEDAVG, 0, {"a": {"accuracy": 0.5}}, {"name": "first"})
    write_run(tmp_path / "second" / "seed_1", FEDAVG, 1, {"a": {"accuracy": 0.7}}, {"name": "second"})
    write_run(tmp_path / "local" / "seed_0", LOCAL, 0, {"a": {"accuracy": 0.4}}, lr(0.3))
    groups = report.by_method(report.load_runs([tmp_path])[0])
    assert {m: [r.seed for r in v] for m, v in groups.items()} == {"FedAvg": [0, 1], "Local": [0]}


def test_a_seed_run_twice_is_kept_once_with_a_warning_naming_both(tmp_path: Path) -> None:
    old = write_run(tmp_path / "x" / "version_0", FEDAVG, 0, {"a": {"accuracy": 0.2}}, ended="2025-01-01T10:00:00")
    new = write_run(tmp_path / "x" / "version_1", FEDAVG, 0, {"a": {"accuracy": 0.6}}, ended="2025-01-02T10:00:00")
    write_run(tmp_path / "x" / "version_2", FEDAVG, 1, {"a": {"accuracy": 0.8}}, ended="2025-01-01T12:00:00")
    runs, warnings = report.load_runs([tmp_path])
    assert [r.folder.name for r in runs] == ["version_1", "version_2"]
    assert len(warnings) == 1 and f"{old} and {new}" in warnings[0] and f"only {new} (ended last)" in warnings[0]
    # seed 0 once (0.6), seed 1 (0.8): mean 0.7; 0.2 counted too would give 0.5333
    stats = report.summary(report.by_method(runs), "last", "accuracy")
    assert stats["FedAvg"]["seeds"] == 2 and stats["FedAvg"]["mean"][0] == pytest.approx(0.7)


def test_labels_use_the_shortest_key_tail_that_is_unique() -> None:
    shorts = methods._short_keys(
        ["model.init_args.lr", "strategy.init_args.lr", "model.init_args.backbone.class_path", "federation.rounds"]
    )
    assert shorts == {
        "model.init_args.lr": "model.lr",
        "strategy.init_args.lr": "strategy.lr",
        "model.init_args.backbone.class_path": "backbone",
        "federation.rounds": "rounds",
    }


def test_a_resume_that_changed_nothing_stays_a_seed_one_that_changed_a_key_does_not(tmp_path: Path) -> None:
    write_run(tmp_path / "r" / "seed_0", FEDAVG, 0, {"a": {"accuracy": 0.5}})
    write_run(tmp_path / "r" / "seed_1", FEDAVG, 1, {"a": {"accuracy": 0.5}}, {"resumed": [{"from_round": 2}]})
    changed = {"resumed": [{"from_round": 2, "changed": {"federation.rounds": [2, 4]}}]}
    write_run(tmp_path / "r" / "seed_2", FEDAVG, 2, {"a": {"accuracy": 0.5}}, changed)
    groups = report.by_method(report.load_runs([tmp_path])[0])
    assert {m: [r.seed for r in v] for m, v in groups.items()} == {
        "FedAvg resumed@2.rounds=—": [0, 1],
        "FedAvg resumed@2.rounds=4": [2],
    }


def test_a_strategy_argument_recorded_only_in_results_json_tells_methods_apart(tmp_path: Path) -> None:
    for mu in (0.01, 0.1):
        folder = write_run(tmp_path / f"mu{mu}", FEDAVG, 0, {"a": {"accuracy": mu}}, strategy_hparams={"mu": mu})
        (folder / "config.json").unlink()  # a run built in Python
    runs, _ = report.load_runs([tmp_path])
    assert [r.method for r in runs] == ["FedAvg mu=0.01", "FedAvg mu=0.1"]


def test_many_differing_keys_name_the_method_by_its_experiment(tmp_path: Path) -> None:
    many = {"model": {"init_args": {"lr": 0.5, "momentum": 0.9, "wd": 1, "depth": 3}}}
    write_run(tmp_path / "tcga" / "seed_0", FEDAVG, 0, {"a": {"accuracy": 0.5}}, many)
    write_run(tmp_path / "quick" / "seed_0", FEDAVG, 0, {"a": {"accuracy": 0.5}})
    assert [r.method for r in report.load_runs([tmp_path])[0]] == ["FedAvg (quick)", "FedAvg (tcga)"]


def mse_runs(tmp_path: Path, recorded: bool = True) -> Path:
    # a regression module's mse, lower is better: FedAvg a 1.0, b 3.0; Local a 2.0, b 7.12
    extra = {"higher_is_better": {"mse": False}} if recorded else {}
    write_run(tmp_path / "fedavg", FEDAVG, 0, {"a": {"mse": 1.0}, "b": {"mse": 3.0}}, **extra)
    write_run(tmp_path / "local", LOCAL, 0, {"a": {"mse": 2.0}, "b": {"mse": 7.12}}, **extra)
    return tmp_path


def test_a_lower_is_better_metric_is_ranked_as_its_module_declares(tmp_path: Path) -> None:
    report.write([mse_runs(tmp_path / "runs")], tmp_path / "out", metric="mse", vector=None)
    text = (tmp_path / "out" / "report.md").read_text()
    assert "| a | **1.0000** | 2.0000 |" in text and "| b | **3.0000** | 7.1200 |" in text
    # worst client: the highest mse (FedAvg 3.0, Local 7.12, not their best 1.0 and 2.0); gain over Local:
    # Local's minus FedAvg's, positive is better: ((2 - 1) + (7.12 - 3)) / 2 = 2.56
    assert "| FedAvg | 1 | 2.0000 | 3.0000 | +2.5600 | — | one seed: no interval | 0 |" in text
    assert "| Local | 1 | 4.5600 | 7.1200 | — | — | — | — |" in text
    assert "lower mse is better" in text


def test_old_results_without_directions_fall_back_to_the_name(tmp_path: Path) -> None:
    runs, _ = report.load_runs([mse_runs(tmp_path, recorded=False)])
    assert report.higher_is_better("mse", runs) and not report.higher_is_better("val_loss", runs)
    stats = report.summary(report.by_method(runs), "last", "mse")
    assert stats["Local"]["worst"][0] == pytest.approx(2.0)  # the lowest, as for an accuracy


def test_opposite_declared_directions_are_refused(tmp_path: Path) -> None:
    write_run(tmp_path / "up", FEDAVG, 0, {"a": {"score": 1.0}}, higher_is_better={"score": True})
    write_run(tmp_path / "down", LOCAL, 0, {"a": {"score": 1.0}}, higher_is_better={"score": False})
    runs, _ = report.load_runs([tmp_path])
    with pytest.raises(ConfigError, match=r"--metric score: the runs' modules rank it in opposite directions"):
        report.higher_is_better("score", runs)


def test_bold_best_follows_the_direction() -> None:
    cells = {"x": (0.2, math.nan), "y": (0.5, math.nan)}
    assert bold_best(cells, ["x", "y"], higher=False) == ["**0.2000**", "0.5000"]
    assert bold_best(cells, ["x", "y"], higher=True) == ["0.2000", "**0.5000**"]


def test_the_pooled_figure_is_shown_with_its_spread_over_seeds(tmp_path: Path) -> None:
    for seed, pooled in ((0, 0.7), (1, 0.8)):
        write_run(
            tmp_path / "fedavg" / f"seed_{seed}",
            FEDAVG,
            seed,
            {"a": {"c_index": 0.6}, "b": {"c_index": 0.5}},
            higher_is_better={"c_index": True},
        )
        results = json.loads((tmp_path / "fedavg" / f"seed_{seed}" / "results.json").read_text())
        results["last"]["pooled"] = {"c_index": pooled}
        (tmp_path / "fedavg" / f"seed_{seed}" / "results.json").write_text(json.dumps(results))
    write_run(tmp_path / "local" / "seed_0", LOCAL, 0, {"a": {"c_index": 0.5}, "b": {"c_index": 0.5}})
    report.write([tmp_path], tmp_path / "out", metric="c_index", vector=None)
    text = (tmp_path / "out" / "report.md").read_text()
    assert "| method | seeds | mean c_index | worst-client c_index | pooled c_index (FLamby's pooled test) |" in text
    # pooled 0.7 and 0.8: mean 0.75, std 0.070711, standard error 0.05; Local recorded none; one seed paired
    assert (
        "| FedAvg | 2 | 0.5500 ± 0.0000 | 0.5000 ± 0.0000 | 0.7500 ± 0.0500 | +0.0500 | — | one seed: no interval | 0 |"
        in text
    )
    assert "| Local | 1 | 0.5000 | 0.5000 | — | — | — | — | — |" in text
    assert "FLamby's pooled test figure, c_index computed once on all clients' test predictions" in text


class MseCox(CoxModule):
    """A custom module whose ``mse`` (the Cox loss, renamed) is declared lower-is-better: no "loss" in its name."""

    default_selection_metric = "c_index"

    @override
    def compute_metrics(self) -> dict[str, float]:
        out = super().compute_metrics()
        return {"c_index": out["c_index"], "mse": out["loss"]} if out else {}

    @override
    @property
    def higher_is_better(self) -> dict[str, bool]:
        return {"c_index": True, "mse": False}


@pytest.mark.long
def test_a_custom_modules_direction_is_recorded_and_ranks_the_report(tmp_path: Path) -> None:
    for name, strategy in (("fedavg", FedAvg()), ("local", Local())):
        data = SyntheticSurvival(num_clients=3, samples_per_client=40)
        module = MseCox(backbone=Identity(num_features=8))
        Federation(module, data, strategy, rounds=2, out_dir=tmp_path / name, progress_bar=False).fit()
    results = {n: json.loads((tmp_path / n / "results.json").read_text()) for n in ("fedavg", "local")}
    assert results["fedavg"]["higher_is_better"] == {"c_index": True, "mse": False}
    report.write([tmp_path / "fedavg", tmp_path / "local"], tmp_path / "out", metric="mse", vector=None)
    text = (tmp_path / "out" / "report.md").read_text()
    best = {n: {c: v["mse"] for c, v in r["best"]["clients"].items()} for n, r in results.items()}
    for method, values in (("FedAvg", best["fedavg"]), ("Local", best["local"])):
        # the worst client is the one of the highest mse
        assert f"| {method} | 1 | {sum(values.values()) / 3:.4f} | {max(values.values()):.4f} |" in text
    for client, theirs in best["local"].items():
        ours = best["fedavg"][client]
        cells = [f"**{v:.4f}**" if v == min(ours, theirs) else f"{v:.4f}" for v in (ours, theirs)]
        assert f"| {client} | {cells[0]} | {cells[1]} |" in text
