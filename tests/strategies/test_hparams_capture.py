"""Hyperparameters captured with no code from the subclass: a strategy's ``__init__`` arguments (most-derived
signature, defaults filled in, ``**kwargs`` expanded) and a callback's (its attributes named like them), shown in
``repr``, ``results.json``, TensorBoard's HParams and ``fedlit report``'s configuration table."""

from __future__ import annotations

import copy
import json
import pickle

import torch
from lightning.pytorch import Callback
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.hparams import plugin_data_pb2

from fedlit.callbacks import EarlyStopping
from fedlit.commands import report
from fedlit.core.init_args import hparams_of
from fedlit.strategies import FedAvg, MedianAggregator
from tests.conftest import make_federation


class FedAvgM(FedAvg):
    """A user's strategy: no ``hparams()``, its own arguments and FedAvg's through ``**kw``."""

    def __init__(self, server_lr=1.0, beta=0.9, **kw):
        super().__init__(**kw)
        self.server_lr, self.beta = server_lr, beta


class FixedFedAvgM(FedAvgM):
    """Calls its base with other arguments: only the outermost construction is recorded."""

    def __init__(self, *, momentum: float = 0.5):
        super().__init__(server_lr=2.0, beta=momentum)


class WithObjects(FedAvg):
    def __init__(self, *, anchor=None, net=None, levels=(1, 2), aggregator=None):
        super().__init__(aggregator=aggregator)


class Threshold(Callback):
    """A plain Lightning callback (no capture): read from its attributes named like its parameters."""

    def __init__(self, threshold=0.5, label="x", unused=3):
        self.threshold, self.label = threshold, label

    def on_round_end(self, server_round, metrics):
        pass


def test_a_strategys_arguments_are_recorded_without_an_hparams_method():
    assert repr(FedAvgM()) == "FedAvgM(server_lr=1.0, beta=0.9, weighting='num_examples')"
    # **kw expanded in the order of FedAvg's signature, whatever the order of the call
    assert repr(FedAvgM(weighting="uniform", beta=0.8, server_lr=0.5)) == (
        "FedAvgM(server_lr=0.5, beta=0.8, weighting='uniform')"
    )
    assert FedAvgM(0.25).hparams() == {"server_lr": 0.25, "beta": 0.9, "weighting": "num_examples"}


def test_only_the_outermost_construction_is_recorded_and_ints_for_floats_become_floats():
    assert FixedFedAvgM(momentum=1).hparams() == {"momentum": 1.0}  # not FedAvgM's server_lr=2.0, beta=1
    assert repr(FixedFedAvgM()) == "FixedFedAvgM(momentum=0.5)"


def test_recorded_values_are_json_friendly():
    strategy = WithObjects(anchor=torch.zeros(2), net=torch.nn.Linear(2, 2), aggregator=MedianAggregator())
    assert strategy.hparams() == {
        "anchor": "Tensor",
        "net": "Linear",
        "levels": [1, 2],
        "aggregator": "MedianAggregator()",
    }
    assert repr(strategy) == "WithObjects(anchor=Tensor, net=Linear, levels=[1, 2], aggregator=MedianAggregator())"
    assert json.loads(json.dumps(strategy.hparams())) == strategy.hparams()


def test_copies_keep_the_recorded_arguments():
    strategy = FedAvgM(server_lr=0.3)
    assert (
        repr(copy.deepcopy(strategy))
        == repr(pickle.loads(pickle.dumps(strategy)))
        == ("FedAvgM(server_lr=0.3, beta=0.9, weighting='num_examples')")
    )


def test_a_foreign_callback_is_read_from_its_attributes():
    assert hparams_of(Threshold(threshold=0.25)) == {"threshold": 0.25, "label": "x"}  # no attribute `unused`
    assert hparams_of(EarlyStopping(patience=3)) == {"patience": 3, "min_delta": 0.0, "metric": None}


def _run(out_dir, server_lr, threshold):
    federation = make_federation(
        out_dir,
        FedAvgM(server_lr=server_lr, beta=0.8),
        rounds=1,
        local_steps=1,
        callbacks=[Threshold(threshold=threshold)],
    )
    federation.fit()
    return json.loads((out_dir / "results.json").read_text())


def test_a_tiny_runs_records_show_the_arguments_everywhere(tmp_path):
    results = _run(tmp_path / "a", 0.5, 0.25)
    assert results["strategy"] == "FedAvgM(server_lr=0.5, beta=0.8, weighting='num_examples')"
    assert results["strategy_hparams"] == {"server_lr": 0.5, "beta": 0.8, "weighting": "num_examples"}
    assert results["callbacks"] == [{"class": f"{__name__}.Threshold", "hparams": {"threshold": 0.25, "label": "x"}}]

    events = EventAccumulator(str(tmp_path / "a" / "tensorboard")).Reload()
    start = plugin_data_pb2.HParamsPluginData.FromString(
        events.PluginTagToContent("hparams")["_hparams_/session_start_info"]
    ).session_start_info
    logged = {k: v.string_value or v.number_value for k, v in start.hparams.items()}
    assert logged["strategy"] == "FedAvgM"
    assert (logged["strategy.server_lr"], logged["strategy.beta"], logged["strategy.weighting"]) == (
        0.5,
        0.8,
        "num_examples",
    )
    assert (logged["callbacks.Threshold.threshold"], logged["callbacks.Threshold.label"]) == (0.25, "x")

    _run(tmp_path / "b", 1.5, 0.75)
    report.main([str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(tmp_path / "report")])
    table = (tmp_path / "report" / "report.md").read_text().split("Configurations: the keys that differ")[1]
    rows = {
        line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
        for line in table.splitlines()
        if line.startswith("| ")
    }
    assert rows["strategy.init_args.server_lr"] == ["0.5", "1.5"]
    assert "strategy.init_args.beta" not in rows  # the same in both runs
    assert ['"threshold": 0.25' in rows["callbacks"][0], '"threshold": 0.75' in rows["callbacks"][1]] == [True, True]
