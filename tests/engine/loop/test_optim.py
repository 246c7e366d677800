"""Optimizers and learning-rate schedules given by class: recipes, the two intervals, resume, refused forms."""

from __future__ import annotations

import functools
import math
from pathlib import Path

import pytest
import torch
from lightning.pytorch import Callback
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch import nn

import fedlit.tasks
from fedlit import FedAvg
from fedlit.cli import main, prepare
from fedlit.core.errors import ConfigError
from fedlit.core.roles import RoleRule
from fedlit.engine.loop.optim import unpack
from fedlit.module import FederatedModule
from fedlit.tasks import ClassificationModule
from tests.conftest import TinyMLP, TinyTabular, assert_resume_is_exact, make_federation

RECIPE = """\
model:
  class_path: fedlit.tasks.ClassificationModule
  init_args:
    backbone: {class_path: tests.conftest.TinyMLP}
    num_classes: 3
    roles:
      - {pattern: "backbone.*", role: shared}
    optimizer:
      class_path: torch.optim.AdamW
      init_args: {lr: 0.1, weight_decay: 0.01}
    lr_scheduler:
      class_path: torch.optim.lr_scheduler.CosineAnnealingLR
      init_args: {T_max: 4}
data:
  class_path: tests.conftest.TinyTabular
strategy:
  class_path: FedAvg
federation:
  rounds: 4
  local_steps: 2
  progress_bar: false
callbacks:
  - class_path: tests.engine.loop.test_optim.LearningRates
"""


class LearningRates(Callback):
    """Records, per (round, client), the learning rate of every local step as the optimizer applies it."""

    def __init__(self) -> None:
        self.seen: dict[tuple[int, str], list[float]] = {}
        self.optimizers: set[str] = set()
        self._key: tuple[int, str] | None = None

    def on_client_fit_start(self, server_round: int, client_id: str, **_: object) -> None:
        self._key = (server_round, client_id)
        self.seen[self._key] = []

    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer, **_: object) -> None:
        self.seen[self._key].append(optimizer.param_groups[0]["lr"])
        self.optimizers.add(type(optimizer).__name__.removeprefix("Fabric"))
        self.weight_decay = optimizer.param_groups[0]["weight_decay"]


def fit_recipe(tmp_path, *overrides):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(RECIPE)
    job = prepare(["fit", "--config", str(recipe), "--out_dir", str(tmp_path / "run"), *overrides])
    results = job()
    return job.federation, job.federation.callbacks[1], results


def test_recipe_adamw_with_a_cosine_schedule_over_rounds(tmp_path):
    federation, recorder, results = fit_recipe(tmp_path)
    assert recorder.optimizers == {"AdamW"} and recorder.weight_decay == 0.01
    # CosineAnnealingLR, T_max = 4, eta_min = 0: round t trains at 0.1 * (1 + cos(pi (t - 1) / 4)) / 2, the same for
    # every client and every local step of the round
    expected = {1: 0.1, 2: 0.05 * (1 + math.sqrt(0.5)), 3: 0.05, 4: 0.05 * (1 - math.sqrt(0.5))}
    for (server_round, client), lrs in recorder.seen.items():
        assert lrs == pytest.approx([expected[server_round]] * 2), (server_round, client)
    assert sorted(recorder.seen) == [(r, c) for r in range(1, 5) for c in ("c0", "c1", "c2")]
    # the server's schedule went on after round 4 (value after 4 steps: eta_min) and logs each round's value
    assert federation.lr_schedule.learning_rates() == pytest.approx([0.0], abs=1e-12)
    events = EventAccumulator(str(tmp_path / "run" / "tensorboard")).Reload()
    logged = [e.value for e in events.Scalars("server/train/lr")]
    assert logged == pytest.approx([expected[t] for t in range(1, 5)], rel=1e-6)
    assert results["last"]["round"] == 4


def test_a_step_schedule_advances_per_local_step_and_restarts_each_turn_under_reset(tmp_path):
    _, recorder, _ = fit_recipe(
        tmp_path,
        "--model.init_args.lr_scheduler",
        "torch.optim.lr_scheduler.StepLR",
        "--model.init_args.lr_scheduler.step_size",
        "2",
        "--model.init_args.lr_scheduler.gamma",
        "0.5",
        "--model.init_args.lr_scheduler_interval",
        "step",
        "--federation.local_steps",
        "3",
        "--federation.rounds",
        "2",
    )
    # StepLR(step_size=2, gamma=0.5) stepped after each of the 3 local steps: 0.1, 0.1, 0.05; every turn anew
    for key, lrs in recorder.seen.items():
        assert lrs == pytest.approx([0.1, 0.1, 0.05]), key


def test_a_step_schedule_continues_across_turns_under_persist(tmp_path):
    federation, recorder, _ = fit_recipe(
        tmp_path,
        "--model.init_args.lr_scheduler",
        "torch.optim.lr_scheduler.StepLR",
        "--model.init_args.lr_scheduler.step_size",
        "2",
        "--model.init_args.lr_scheduler.gamma",
        "0.5",
        "--model.init_args.lr_scheduler_interval",
        "step",
        "--federation.local_steps",
        "3",
        "--federation.rounds",
        "2",
        "--federation.optimizer_state",
        "persist",
    )
    for client in ("c0", "c1", "c2"):
        assert recorder.seen[(1, client)] == pytest.approx([0.1, 0.1, 0.05])
        # steps 3, 4, 5 of the client's own schedule: 0.1 * 0.5 ** (3 // 2), 0.5 ** 2, 0.5 ** 2
        assert recorder.seen[(2, client)] == pytest.approx([0.05, 0.025, 0.025])
        assert federation.store.extra(client, "fedlit.lr_scheduler")["state"]["last_epoch"] == 6


def scheduled_module(monkeypatch, scheduler, interval):
    """make_federation's ClassificationModule, with a learning-rate scheduler."""

    class Scheduled(ClassificationModule):
        def __init__(self, **kwargs):
            super().__init__(**kwargs, lr_scheduler=scheduler, lr_scheduler_interval=interval)

    monkeypatch.setattr(fedlit.tasks, "ClassificationModule", Scheduled)


def test_resume_is_exact_with_a_schedule_over_rounds(tmp_path, monkeypatch):
    scheduled_module(monkeypatch, functools.partial(torch.optim.lr_scheduler.CosineAnnealingLR, T_max=4), "round")
    straight, second = assert_resume_is_exact(tmp_path, FedAvg)
    assert straight.lr_schedule.state_dict() == second.lr_schedule.state_dict()
    assert second.lr_schedule.scheduler.last_epoch == 4


def test_resume_is_exact_with_a_per_client_step_schedule(tmp_path, monkeypatch):
    scheduled_module(monkeypatch, functools.partial(torch.optim.lr_scheduler.StepLR, step_size=3, gamma=0.5), "step")
    straight, _ = assert_resume_is_exact(tmp_path, FedAvg, optimizer_state="persist")
    # the schedule's state is part of each client's stored (and checkpointed) state
    assert straight.store.extra("c0", "fedlit.lr_scheduler")["state"]["last_epoch"] > 0


def test_a_bad_scheduler_class_path_is_one_clear_line(tmp_path, capsys):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(RECIPE.replace("lr_scheduler.CosineAnnealingLR", "lr_scheduler.CosineAnealingLR"))
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", str(recipe), "--out_dir", str(tmp_path / "run")])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert err.startswith(
        "fedlit: error: model.init_args.lr_scheduler.class_path="
        "'torch.optim.lr_scheduler.CosineAnealingLR': module 'torch.optim.lr_scheduler' has no "
        "attribute 'CosineAnealingLR'. Did you mean torch.optim.lr_scheduler.CosineAnnealingLR?"
    )


def test_a_misspelled_scheduler_setting_lists_the_valid_ones(tmp_path, capsys):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(RECIPE.replace("T_max: 4", "T_mx: 4"))
    with pytest.raises(SystemExit):
        main(["fit", "--config", str(recipe), "--out_dir", str(tmp_path / "run")])
    assert capsys.readouterr().err.strip() == (
        "fedlit: error: model.init_args.lr_scheduler.init_args.T_mx is not an option of "
        "torch.optim.lr_scheduler.CosineAnnealingLR. Did you mean 'T_max'? Valid options: T_max, eta_min, last_epoch."
    )


def test_print_config_shows_the_optimizer_and_schedule(tmp_path, capsys):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(RECIPE)
    with pytest.raises(SystemExit):
        main(["fit", "--config", str(recipe), "--print_config"])
    out = capsys.readouterr().out
    assert "class_path: torch.optim.AdamW" in out and "weight_decay: 0.01" in out
    assert "class_path: torch.optim.lr_scheduler.CosineAnnealingLR" in out and "T_max: 4" in out
    assert "lr_scheduler_interval: round" in out
    with pytest.raises(SystemExit):  # a recipe with the shorthands shows the new options at their defaults
        main(["fit", "--config", str(Path(__file__).parents[3] / "recipes" / "quickstart.yaml"), "--print_config"])
    assert (
        "    optimizer: sgd\n    lr: 0.02\n    momentum: 0.9\n    weight_decay: 0.0\n    lr_scheduler: null\n"
        "    lr_scheduler_interval: round\n"
    ) in capsys.readouterr().out


def test_the_string_shorthands_still_build_their_optimizers():
    params = {"backbone": TinyMLP(), "num_classes": 3, "roles": [RoleRule("backbone.*", "shared")]}
    adam = ClassificationModule(**params, optimizer="adam", lr=0.3, weight_decay=0.1).configure_optimizers()
    assert type(adam) is torch.optim.Adam and adam.param_groups[0]["lr"] == 0.3
    assert adam.param_groups[0]["weight_decay"] == 0.1
    sgd = ClassificationModule(**params, lr=0.2, momentum=0.5).configure_optimizers()
    assert type(sgd) is torch.optim.SGD and (sgd.param_groups[0]["lr"], sgd.param_groups[0]["momentum"]) == (0.2, 0.5)


def test_shorthand_settings_beside_a_class_optimizer_are_refused():
    with pytest.raises(ConfigError, match=r"model.init_args.lr=0.5, momentum=0.9 only apply to the shorthands"):
        ClassificationModule(
            backbone=TinyMLP(), num_classes=3, optimizer=functools.partial(torch.optim.SGD), lr=0.5, momentum=0.9
        )
    with pytest.raises(ConfigError, match=r"lr_scheduler_interval='epoch' is not one of \['round', 'step'\]"):
        ClassificationModule(backbone=TinyMLP(), num_classes=3, lr_scheduler_interval="epoch")


class Returns(FederatedModule):
    """A module whose configure_optimizers returns what ``make`` builds from its parameters."""

    def __init__(self, make):
        super().__init__()
        self.layer = nn.Linear(2, 2)
        self.make = make

    def configure_optimizers(self):
        return self.make(list(self.parameters()))


def sgd(params):
    return torch.optim.SGD(params, lr=0.1)


def test_lightnings_forms_are_accepted():
    module = Returns(sgd)
    assert unpack(module, module.configure_optimizers()).scheduler is None
    opt = sgd(module.parameters())
    sched = torch.optim.lr_scheduler.StepLR(opt, 1)
    assert unpack(module, {"optimizer": opt}).scheduler is None
    assert unpack(module, {"optimizer": opt, "lr_scheduler": sched}).interval == "round"
    local = unpack(module, {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}})
    assert (local.optimizer, local.scheduler, local.interval) == (opt, sched, "step")


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (
            lambda p: [sgd(p), sgd(p)],
            "Returns.configure_optimizers returned a list of 2: a client trains with one "
            "optimizer and at most one learning-rate scheduler; return one optimizer, or",
        ),
        (
            lambda p: (
                lambda o: {
                    "optimizer": o,
                    "lr_scheduler": {"scheduler": torch.optim.lr_scheduler.StepLR(o, 1), "interval": "epoch"},
                }
            )(sgd(p)),
            "interval='epoch' (not one of ['round', 'step']). 'round' steps the schedule once per server round",
        ),
        (
            lambda p: (lambda o: {"optimizer": o, "lr_scheduler": torch.optim.lr_scheduler.ReduceLROnPlateau(o)})(
                sgd(p)
            ),
            "ReduceLROnPlateau is not supported (it needs a monitored metric",
        ),
        (lambda p: {"optimizer": sgd(p), "monitor": "val/loss"}, "unsupported keys ['monitor']"),
    ],
)
def test_other_forms_are_refused_before_the_first_round(tmp_path, make, message):
    from fedlit import Federation

    federation = Federation(Returns(make), TinyTabular(), FedAvg(), rounds=1, out_dir=tmp_path, progress_bar=False)
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        federation.setup()


def test_a_subclass_dict_form_with_a_step_interval_trains(tmp_path):
    def with_schedule(params):
        optimizer = torch.optim.SGD(params, lr=0.1)
        return {
            "optimizer": optimizer,
            "lr_scheduler": {
                "scheduler": torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (step + 1)),
                "interval": "step",
            },
        }

    recorder = LearningRates()
    federation = make_federation(tmp_path, FedAvg(), rounds=1, local_steps=3, callbacks=[recorder])
    federation.module.configure_optimizers = lambda: with_schedule(
        [p for p in federation.module.parameters() if p.requires_grad]
    )
    federation.fit()
    assert recorder.seen[(1, "c0")] == pytest.approx([0.1, 0.05, 0.1 / 3])


def test_the_server_schedule_steps_without_torchs_call_order_warning():
    import warnings

    from fedlit.engine.loop.optim import RoundSchedule

    module = Returns(sgd)
    opt = sgd(module.parameters())
    schedule = RoundSchedule(
        unpack(module, {"optimizer": opt, "lr_scheduler": torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)})
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        schedule.step()
        schedule.step()
    assert [str(w.message) for w in caught] == [] and schedule.learning_rates() == [0.025]
    client = sgd(module.parameters())
    schedule.apply(client)  # a client's fresh optimizer takes the round's rate
    assert client.param_groups[0]["lr"] == 0.025


def test_a_scheduler_on_another_optimizer_is_refused():
    module = Returns(sgd)
    other = sgd(module.parameters())
    with pytest.raises(ConfigError, match="built on another optimizer than the one returned"):
        unpack(
            module, {"optimizer": sgd(module.parameters()), "lr_scheduler": torch.optim.lr_scheduler.StepLR(other, 1)}
        )


def test_a_misspelled_optimizer_shorthand_is_one_clear_line(tmp_path, capsys):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(RECIPE)
    with pytest.raises(SystemExit):
        main(
            ["fit", "--config", str(recipe), "--out_dir", str(tmp_path / "run"), "--model.init_args.optimizer", "sgdd"]
        )
    assert capsys.readouterr().err.strip() == (
        "fedlit: error: model.init_args.optimizer='sgdd' is not one of the shorthands ['sgd', 'adam', 'adamw'] nor "
        "a known class. Did you mean 'sgd'? Give a shorthand, or a class of torch.optim as class_path (its name or "
        "full import path)."
    )


def _trained(tmp_path, name, optimizer_state, reuse, monkeypatch):
    """Every client's stored tensors (and optimizer states) and the server state after 3 rounds of 2 steps."""
    import fedlit.engine.loop.optim as optim_module

    with monkeypatch.context() as patch:
        if not reuse:
            patch.setattr(optim_module, "reused_optimizer", lambda module: None)
        federation = make_federation(
            tmp_path / f"{name}-{optimizer_state}-{reuse}",
            FedAvg(),
            rounds=3,
            roles=[RoleRule("backbone.*", "shared"), RoleRule("head.*", "personal")],
            local_steps=2,
            optimizer_state=optimizer_state,
            eval_every=10,
        )
        federation.module.optimizer_name = name
        federation.fit()
    return federation.store.state_dict(), federation.strategy.state_dict()


@pytest.mark.parametrize(("name", "optimizer_state"), [("sgd", "reset"), ("adam", "reset"), ("adamw", "persist")])
def test_a_reused_optimizer_trains_as_a_fresh_one_per_turn(tmp_path, monkeypatch, name, optimizer_state):
    from tests.conftest import _equal

    reused = _trained(tmp_path, name, optimizer_state, True, monkeypatch)
    fresh = _trained(tmp_path, name, optimizer_state, False, monkeypatch)
    assert _equal(reused, fresh)
    assert reused[0]["tensors"]  # the clients trained


def test_a_turn_does_not_build_the_module_s_own_optimizer_again(tmp_path, monkeypatch):
    federation = make_federation(tmp_path, FedAvg(), rounds=1, local_steps=1)
    federation.setup()
    federation.fit_client(1, "c0")
    built = []
    real = ClassificationModule.configure_optimizers
    monkeypatch.setattr(FederatedModule, "configure_optimizers", lambda self: built.append(1) or real(self))
    federation.fit_client(1, "c1")
    assert built == []
