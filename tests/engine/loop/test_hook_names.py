"""Hook names checked when a run is built: a misspelt hook on the strategy, a callback or the module is refused
with the closest real name, a Lightning hook the loop never calls with what to use instead; and the loop's list
of hooks is the list of hooks the engine calls."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from lightning.pytorch import Callback

from fedlit import Federation, RoleRule
from fedlit.callbacks import HOOK_PREFIXES, LOOP_HOOKS, MODULE_HOOKS, STRATEGY_HOOKS, check_callbacks
from fedlit.core.errors import ConfigError
from fedlit.strategies import FedAvg
from fedlit.strategies.base import Strategy
from fedlit.tasks import ClassificationModule
from tests.conftest import TinyMLP, TinyTabular

FEDLIT = Path(__file__).resolve().parents[3] / "fedlit"
HERE = __name__


class MisspeltStrategy(FedAvg):
    def on_client_fitstart(self, client_id):
        pass


class MisspeltCallback(Callback):
    def on_round_ends(self, server_round, metrics):
        pass


class MisspeltModule(ClassificationModule):
    def configure_optimizer(self):
        return super().configure_optimizers()


class TrainStartStrategy(FedAvg):
    def on_train_start(self, trainer, pl_module):
        pass


class EpochHookModule(ClassificationModule):
    def on_train_epoch_start(self):
        pass


class ValidationCallback(Callback):
    def on_validation_epoch_end(self, trainer, pl_module):
        pass


class StrategyMethodCallback(Callback):
    def configure_client(self, server_round, client_id):
        return {}


class RightNames(FedAvg):
    def on_client_fit_start(self, client_id):
        pass

    def configure_client(self, server_round, client_id):
        return super().configure_client(server_round, client_id)


class RightModule(ClassificationModule):
    def configure_optimizers(self):
        return super().configure_optimizers()


class RightCallback(Callback):
    def on_round_end(self, server_round, metrics):
        pass


def _build(tmp_path, strategy=None, callbacks=(), module_cls=ClassificationModule) -> Federation:
    module = module_cls(backbone=TinyMLP(), num_classes=3, lr=0.1, roles=[RoleRule("backbone.*", "shared")])
    return Federation(
        module,
        TinyTabular(),
        strategy if strategy is not None else FedAvg(),
        rounds=1,
        out_dir=tmp_path,
        progress_bar=False,
        accelerator="cpu",
        callbacks=list(callbacks),
    )


@pytest.mark.parametrize(
    "kwargs, names, closest",
    [
        (
            {"strategy": MisspeltStrategy()},
            f"strategy={HERE}.MisspeltStrategy defines on_client_fitstart",
            "did you mean on_client_fit_start?",
        ),
        (
            {"callbacks": [RightCallback(), MisspeltCallback()]},
            f"callbacks[1]={HERE}.MisspeltCallback defines on_round_ends",
            "did you mean on_round_end?",
        ),
        (
            {"module_cls": MisspeltModule},
            f"model={HERE}.MisspeltModule defines configure_optimizer",
            "did you mean configure_optimizers?",
        ),
    ],
)
def test_a_misspelt_hook_is_refused_naming_the_closest_hook(tmp_path, kwargs, names, closest):
    with pytest.raises(ConfigError) as err:
        _build(tmp_path, **kwargs)
    message = str(err.value)
    assert names in message and closest in message
    assert "never be called" in message and "callbacks[0]" not in message


@pytest.mark.parametrize(
    "name, closest",
    [
        ("on_client_fit_begin", "on_client_fit_start"),  # by its letters alone, on_client_fit_end would be closer
        ("on_fit_finish", "on_fit_end"),
        ("configure_clients", "configure_client"),
        ("on_aggregate", "on_after_aggregate"),
    ],
)
def test_the_closest_hook_of_a_misspelt_name(name, closest):
    strategy = type("Mine", (FedAvg,), {name: lambda self: None})()
    with pytest.raises(ConfigError, match=rf"Mine defines {name}, .*did you mean {closest}\?"):
        check_callbacks([], strategy=strategy)


def test_every_problem_is_named_at_once(tmp_path):
    with pytest.raises(ConfigError) as err:
        _build(tmp_path, MisspeltStrategy(), [MisspeltCallback()], MisspeltModule)
    message = str(err.value)
    order = [message.index(s) for s in ("strategy=", "callbacks[0]=", "model=")]
    assert order == sorted(order) and message.count("did you mean") == 3


@pytest.mark.parametrize(
    "kwargs, names, instead",
    [
        ({"strategy": TrainStartStrategy()}, "a Lightning hook that fedlit's loop does not call", "Use on_fit_start"),
        (
            {"module_cls": EpochHookModule},
            "EpochHookModule defines on_train_epoch_start, a Lightning hook that fedlit's "
            "loop does not call on the module",
            "Use a callback's on_train_epoch_start",
        ),
        (
            {"callbacks": [ValidationCallback()]},
            "relies on on_validation_epoch_end,",
            "(for on_validation_epoch_end: on_round_end, whose metrics hold the round's evaluation)",
        ),
        (
            {"callbacks": [StrategyMethodCallback()]},
            "StrategyMethodCallback defines configure_client",
            "a method of the Strategy API, which the loop calls on the strategy only",
        ),
    ],
)
def test_a_hook_the_loop_never_calls_there_is_refused_with_what_to_use(tmp_path, kwargs, names, instead):
    with pytest.raises(ConfigError) as err:
        _build(tmp_path, **kwargs)
    assert names in str(err.value) and instead in str(err.value)


def test_the_hooks_the_loop_calls_are_accepted(tmp_path):
    federation = _build(tmp_path, RightNames(), [RightCallback()], RightModule)
    assert type(federation.strategy) is RightNames


def _called(pattern: str, root: Path = FEDLIT) -> set[str]:
    return {
        m
        for path in root.rglob("*.py")
        if "strategies" not in path.parts
        for m in re.findall(pattern, path.read_text())
    }


def test_the_loop_hooks_are_the_hooks_the_engine_calls():
    call = r"hooks\.call\(\s*\"(\w+)\""
    assert _called(call, FEDLIT / "engine") | _called(call, FEDLIT / "flower") == LOOP_HOOKS
    assert _called(call) == LOOP_HOOKS  # nothing else of fedlit calls another


def test_the_strategy_and_module_hooks_are_those_the_loop_calls_directly():
    assert _called(r"strategy\.((?:on|configure)_\w+)\(") == STRATEGY_HOOKS
    assert {n for n in vars(Strategy) if n.startswith(HOOK_PREFIXES)} == STRATEGY_HOOKS | {"on_client_evaluate_start"}
    assert _called(r"module\.((?:on|configure)_\w+)\(", FEDLIT / "engine") == MODULE_HOOKS
