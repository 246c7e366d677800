"""Which callbacks the loop accepts, and server-side early stopping (stop round, results, resume)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml
from lightning.pytorch import Callback
from lightning.pytorch.callbacks import EarlyStopping as LightningEarlyStopping
from lightning.pytorch.callbacks import LambdaCallback, LearningRateMonitor, ModelCheckpoint, ModelSummary

from fedlit import Federation, Local, RoleRule
from fedlit.callbacks import EarlyStopping, accepted, check_callbacks
from fedlit.cli import main, prepare
from fedlit.core.contexts import ServerContext
from fedlit.core.errors import ConfigError
from fedlit.models import Backbone
from fedlit.tasks import ClassificationModule
from tests.conftest import TinyTabular


class OnValidationEnd(Callback):
    def on_validation_end(self, trainer, pl_module):
        pass


class LoopHooksOnly(Callback):
    def on_round_end(self, server_round, metrics):
        pass

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        pass


@pytest.mark.parametrize(
    "callback, hooks, instead",
    [
        (LightningEarlyStopping(monitor="val_loss"), "on_validation_end", "fedlit.callbacks.EarlyStopping"),
        (ModelCheckpoint(), "on_validation_end", "checkpoint_every"),
        (LearningRateMonitor(), "on_train_start", "model.init_args.lr"),
        (
            OnValidationEnd(),
            "relies on on_validation_end,",
            "implements the loop's hooks instead: on_after_aggregate, on_after_backward",
        ),
    ],
)
def test_trainer_only_callbacks_are_refused_naming_hooks_and_the_replacement(tmp_path, callback, hooks, instead):
    with pytest.raises(ConfigError) as err:
        _federation(tmp_path, callbacks=[LoopHooksOnly(), callback])
    message = str(err.value)
    assert f"callbacks[1]={type(callback).__module__}.{type(callback).__qualname__}" in message
    assert hooks in message and instead in message
    assert "callbacks[0]" not in message


def test_callbacks_on_loop_hooks_and_subclasses_of_trainer_ones_are_told_apart():
    check_callbacks([LoopHooksOnly(), EarlyStopping(patience=1)])  # accepted

    class Mine(LightningEarlyStopping):  # a subclass of a Trainer-only callback is refused too
        pass

    with pytest.raises(ConfigError, match=r"callbacks\[0\]=.*Mine relies on .*on_validation_end"):
        check_callbacks([Mine(monitor="x")])


def test_early_stopping_counts_rounds_without_improvement_beyond_min_delta():
    stopper = EarlyStopping(patience=2, min_delta=0.05)
    run = SimpleNamespace(should_stop=False, stop_reason=None, history=SimpleNamespace(selection_metric="accuracy"))
    trainer = ServerContext(run)
    module = SimpleNamespace(higher_is_better={"accuracy": True, "loss": False})
    # round: value -> improvement over the best by more than 0.05?
    # 1: 0.50 yes (first) | 2: no eval | 3: 0.54 no (+0.04) | 4: 0.60 yes (+0.10) | 5: nan no | 6: 0.64 no (+0.04)
    for server_round, value in [(1, 0.5), (2, None), (3, 0.54), (4, 0.6), (5, float("nan")), (6, 0.64)]:
        metrics = {} if value is None else {"server/val/accuracy_mean": value}
        stopper.on_round_end(trainer, module, server_round, metrics)
        assert trainer.should_stop == (server_round == 6)
    assert (stopper.best, stopper.best_round, stopper.wait) == (0.6, 4, 2)
    assert "best 0.6 at round 4" in trainer.stop_reason

    lower = EarlyStopping(patience=1, metric="loss")
    for value, stop in [(1.0, False), (0.9, False), (0.95, True)]:  # loss: lower is better
        run.should_stop = False
        lower.on_round_end(trainer, module, 1, {"server/val/loss_mean": value})
        assert trainer.should_stop is stop


def test_early_stopping_refuses_bad_settings():
    with pytest.raises(ConfigError, match=r"patience=0 must be an integer >= 1; min_delta=-1 must be >= 0"):
        EarlyStopping(patience=0, min_delta=-1)


def test_early_stopping_ends_the_run_records_it_and_stays_stopped_on_resume(tmp_path):
    # A linear model without norm statistics, trained at lr=1e-12, does not change (the steps are below float32
    # resolution), so the mean validation accuracy of round 1 is never beaten: with patience 2 the run stops
    # after round 1 + 2 = 3 of 10.
    federation = _federation(tmp_path, rounds=10, callbacks=[EarlyStopping(patience=2)])
    results = federation.fit()
    assert federation.server_round == 3
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["stopped_early"]["round"] == 3
    assert "did not improve by more than 0 for 2 evaluated rounds (best" in saved["stopped_early"]["reason"]
    assert results["last"]["round"] == 3
    assert "Stopped after round 3 of 10" in (tmp_path / "results.md").read_text()
    ckpt = tmp_path / "checkpoints" / "last.ckpt"
    assert torch.load(ckpt, weights_only=False)["server_round"] == 3  # saved although checkpoint_every=4

    again = _federation(tmp_path, rounds=10, callbacks=[EarlyStopping(patience=2)])
    again.fit(ckpt_path=ckpt)
    assert again.server_round == 3 and again.state.stopped_early["round"] == 3

    longer = _federation(tmp_path, rounds=10, callbacks=[EarlyStopping(patience=4)])
    longer.fit(ckpt_path=ckpt)  # the restored count (2) goes on: rounds 4 and 5 make it 4
    assert longer.server_round == 5


class LinearOnly(Backbone):
    def build(self) -> torch.nn.Module:
        net = torch.nn.Linear(4, 8)
        net.num_features = 8
        return net


def _federation(out_dir, rounds=2, **kwargs) -> Federation:
    torch.manual_seed(0)
    module = ClassificationModule(
        backbone=LinearOnly(), num_classes=3, lr=1e-12, roles=[RoleRule("backbone.*", "shared")]
    )
    return Federation(
        module, TinyTabular(), Local(), rounds=rounds, out_dir=out_dir, progress_bar=False, checkpoint_every=4, **kwargs
    )


def test_lightning_callbacks_on_hooks_named_like_the_loops_are_refused_as_written_for_the_trainer():
    with pytest.raises(ConfigError) as err:
        check_callbacks([LoopHooksOnly(), ModelSummary()])
    assert str(err.value).startswith(
        "callbacks[1]=lightning.pytorch.callbacks.model_summary.ModelSummary is written for Lightning's Trainer: the "
        "federated loop would call its on_fit_start with its own contexts, not a Trainer, and it would fail."
    )


def test_accepted_lists_only_classes_that_act_in_the_loop():
    class OwnLightningBase(ModelSummary):  # a user's subclass of Lightning's: its hooks still expect a Trainer
        pass

    assert accepted(EarlyStopping) and accepted(LoopHooksOnly)
    assert not accepted(OnValidationEnd) and not accepted(OwnLightningBase)
    assert not any(accepted(c) for c in (ModelCheckpoint, LearningRateMonitor, ModelSummary, LambdaCallback))


def test_the_cli_builds_early_stopping_from_a_recipe_and_refuses_trainer_callbacks(tmp_path, capsys):
    recipe = yaml.safe_load((Path(__file__).resolve().parents[1] / "recipes" / "quickstart.yaml").read_text())
    recipe["callbacks"] = [{"class_path": "fedlit.callbacks.EarlyStopping", "init_args": {"patience": 2}}]
    (tmp_path / "stop.yaml").write_text(yaml.safe_dump(recipe))
    job = prepare(["fit", "--config", str(tmp_path / "stop.yaml"), "--out_dir", str(tmp_path / "a")])
    assert repr(job.federation.callbacks[1:]) == "[EarlyStopping(patience=2, min_delta=0.0, metric=None)]"

    recipe["callbacks"] = [{"class_path": "lightning.pytorch.callbacks.ModelCheckpoint"}]
    (tmp_path / "checkpoint.yaml").write_text(yaml.safe_dump(recipe))
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", str(tmp_path / "checkpoint.yaml"), "--out_dir", str(tmp_path / "b")])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "callbacks[0]=lightning.pytorch.callbacks.model_checkpoint.ModelCheckpoint relies on" in err
    assert "checkpoint_every" in err
