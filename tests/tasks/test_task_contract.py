"""The task contract between data, module and strategy: tasks are checked at set-up, the module supplies the
default selection metric, and the selection follows the metric's direction."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from fedlit import FedAvg, FederatedModule, Federation
from fedlit.cli import main, run
from fedlit.core.errors import ConfigError
from fedlit.data import SyntheticImages, SyntheticSurvival
from fedlit.engine.records.history import EvaluationHistory
from fedlit.models import Identity, SmallCNN
from fedlit.strategies import FedSLD
from fedlit.tasks import ClassificationModule, CoxModule
from tests.conftest import TinyMLP, TinyTabular

ROOT = Path(__file__).resolve().parents[2]
SURVIVAL = ["--config", str(ROOT / "recipes" / "survival_cox.yaml"), "--federation.progress_bar", "false"]


def cox() -> CoxModule:
    return CoxModule(backbone=Identity(num_features=8))


def small_survival() -> SyntheticSurvival:
    return SyntheticSurvival(num_clients=2, samples_per_client=40)


def test_survival_data_with_a_classification_module_is_refused_naming_both(tmp_path):
    module = ClassificationModule(backbone=Identity(num_features=8), num_classes=2)
    federation = Federation(module, small_survival(), FedAvg(), rounds=1, out_dir=tmp_path, progress_bar=False)
    with pytest.raises(ConfigError) as info:
        federation.fit()
    assert str(info.value) == (
        "Model, strategy and data do not fit: model ClassificationModule accepts tasks ['binary', 'multiclass', "
        "'multilabel'] but data SyntheticSurvival has task 'survival'."
    )
    assert not (tmp_path / "results.json").exists()


def test_classification_data_with_the_cox_module_is_refused(tmp_path):
    module = CoxModule(backbone=SmallCNN())
    data = SyntheticImages(num_clients=2, samples_per_client=20)
    with pytest.raises(
        ConfigError,
        match="model CoxModule accepts tasks \\['survival'\\] but data SyntheticImages has task 'multiclass'",
    ):
        Federation(module, data, FedAvg(), rounds=1, out_dir=tmp_path, progress_bar=False).setup()


def test_fedsld_needs_class_counts_and_refuses_survival_data(tmp_path):
    federation = Federation(cox(), small_survival(), FedSLD(), rounds=1, out_dir=tmp_path, progress_bar=False)
    with pytest.raises(
        ConfigError,
        match="strategy FedSLD accepts tasks \\['binary', 'multiclass'\\] but data "
        "SyntheticSurvival has task 'survival'",
    ):
        federation.setup()
    with pytest.raises(ConfigError, match="only a classification task .* has.*Use another strategy"):
        FedSLD().initialize({}, ["a"], None)


def test_the_module_supplies_the_default_selection_metric(tmp_path):
    survival = Federation(cox(), small_survival(), FedAvg(), rounds=1, out_dir=tmp_path / "s", progress_bar=False)
    classification = Federation(
        ClassificationModule(backbone=TinyMLP(), num_classes=3),
        TinyTabular(),
        FedAvg(),
        rounds=1,
        out_dir=tmp_path / "c",
        progress_bar=False,
    )
    chosen = Federation(
        cox(), small_survival(), FedAvg(), rounds=1, out_dir=tmp_path / "l", progress_bar=False, selection_metric="loss"
    )
    assert (
        survival.history.selection_metric,
        classification.history.selection_metric,
        chosen.history.selection_metric,
    ) == ("c_index", "accuracy", "loss")
    survival.setup()  # a task without classes: the strategy is told there are no class counts
    classification.setup()
    assert survival.strategy.class_counts is None and not (tmp_path / "s" / "class_counts.json").exists()
    assert classification.strategy.class_counts["c0"] == [
        int(n)
        for n in torch.bincount(
            TinyTabular().data.targets[torch.as_tensor(TinyTabular().data.splits["c0"]["train"])], minlength=3
        )
    ]
    with pytest.raises(ConfigError, match=r"selection_metric='accuracy' is not one of \['c_index', 'loss'\]"):
        Federation(cox(), small_survival(), FedAvg(), out_dir=tmp_path / "x", selection_metric="accuracy")

    class Odd(FederatedModule):
        default_selection_metric = "dice"

        @property
        def higher_is_better(self) -> dict[str, bool]:
            return {"iou": True}

    with pytest.raises(
        ConfigError,
        match=r"Odd.default_selection_metric='dice' is not one of its metrics \['iou'\]; "
        "set federation.selection_metric",
    ):
        Federation(Odd(), small_survival(), FedAvg(), out_dir=tmp_path / "y")


def test_the_best_round_follows_the_metric_direction():
    history = EvaluationHistory("loss", {"loss": False, "c_index": True})
    for server_round, (loss, c_index) in enumerate([(2.0, 0.6), (1.5, 0.7), (1.7, 0.8)], start=1):
        history.add(server_round, "val", {"a": {"loss": loss, "c_index": c_index}, "b": {"loss": loss}})
    assert history.best_round() == 2  # the lowest loss
    history.selection_metric = "c_index"
    assert history.best_round() == 3  # the highest C-index


def test_selection_metric_from_the_command_line(tmp_path):
    results = run(
        [
            "fit",
            *SURVIVAL,
            "--federation.rounds",
            "2",
            "--federation.selection_metric",
            "loss",
            "--out_dir",
            str(tmp_path),
        ]
    )
    assert results["selection_metric"] == "loss"
    assert "Test at the best mean validation loss" in (tmp_path / "results.md").read_text()


def test_a_task_mismatch_on_the_command_line_is_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(
            [
                "fit",
                *SURVIVAL,
                "--model",
                "fedlit.tasks.ClassificationModule",
                "--model.init_args.num_classes",
                "2",
                "--model.init_args.backbone",
                "fedlit.models.Identity",
                "--model.init_args.backbone.num_features",
                "8",
                "--out_dir",
                str(tmp_path / "run"),
            ]
        )
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "Traceback" not in err
    assert (
        "model ClassificationModule accepts tasks ['binary', 'multiclass', 'multilabel'] but data "
        "SyntheticSurvival has task 'survival'" in err
    )
