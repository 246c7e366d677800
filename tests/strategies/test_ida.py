"""IDA (Yeganeh, Farshad, Navab, Albarqouni, MICCAI DART 2020): the inverse-distance weights and the aggregate by
hand (distances over all tensors together, from the round's mean or the previous global model, times the sample
counts, a client at distance 0), two rounds end to end, the CLI name and bad options."""

from pathlib import Path

import pytest
import torch

from fedlit.commands.fit import build_parser
from fedlit.core.errors import ConfigError
from fedlit.strategies import IDA, FedAvg
from fedlit.strategies.base import ClientUpdate
from fedlit.strategies.ida import ida_weights
from tests.conftest import make_federation

ROOT = Path(__file__).resolve().parents[2]


def _states(*points):
    return [{"a": torch.tensor([float(x)]), "b": torch.tensor([float(y)])} for x, y in points]


def test_the_weights_by_hand():
    # mean (1, 1); offsets (3, 4), (-3, -4), (6, 8), (-6, -8): d = 5, 5, 10, 10 (over both tensors together);
    # 1/d = 0.2, 0.2, 0.1, 0.1, Z = 0.6: a = 1/3, 1/3, 1/6, 1/6
    states = _states((4, 5), (-2, -3), (7, 9), (-5, -7))
    assert ida_weights(states) == pytest.approx([1 / 3, 1 / 3, 1 / 6, 1 / 6], abs=1e-12)
    # times n = (1, 1, 2, 1): 0.2, 0.2, 0.2, 0.1, Z = 0.7: a = 2/7, 2/7, 2/7, 1/7
    assert ida_weights(states, prior=[1, 1, 2, 1]) == pytest.approx([2 / 7, 2 / 7, 2 / 7, 1 / 7], abs=1e-12)
    # L1 distances: 7, 7, 14, 14: the same ratios
    assert ida_weights(states, p=1) == pytest.approx([1 / 3, 1 / 3, 1 / 6, 1 / 6], abs=1e-12)
    # from a reference (-1, -1) instead of the mean: d = sqrt(61), sqrt(5), sqrt(164), sqrt(52)
    inv = [1 / 61**0.5, 1 / 5**0.5, 1 / 164**0.5, 1 / 52**0.5]
    got = ida_weights(states, reference={"a": torch.tensor([-1.0]), "b": torch.tensor([-1.0])})
    assert got == pytest.approx([v / sum(inv) for v in inv], abs=1e-12)
    # a client at the reference takes the whole weight (the limit of 1/d); two share it by their prior
    one = [{"p": torch.tensor([v])} for v in (0.0, 1.0, 5.0)]
    assert ida_weights(one, reference={"p": torch.tensor([1.0])}) == [0.0, 1.0, 0.0]
    assert ida_weights(one * 2, reference={"p": torch.tensor([1.0])}, prior=[1, 1, 1, 1, 3, 1]) == pytest.approx(
        [0, 0.25, 0, 0, 0.75, 0], abs=1e-12
    )
    # identical models: the prior's mean
    assert ida_weights([{"p": torch.ones(2)}] * 2, prior=[1, 3]) == [0.25, 0.75]


def test_the_aggregate_by_hand():
    strategy = IDA()
    strategy.initialize({"p": torch.tensor([-1.0]), "n": torch.tensor(0)}, ["a", "b", "c"])
    # theta = 0, 1, 5: mean 2, d = 2, 1, 3, 1/d = 1/2, 1, 1/3, Z = 11/6: a = 3/11, 6/11, 2/11;
    # theta' = 6/11 + 10/11 = 16/11 (the integer buffer 2, 4, 9 -> 6/11*4 + 2/11*9 = 42/11 -> 4)
    updates = [
        ClientUpdate(c, 10 * (k + 1), {"p": torch.tensor([v]), "n": torch.tensor(i)})
        for k, (c, v, i) in enumerate((("a", 0.0, 2), ("b", 1.0, 4), ("c", 5.0, 9)))
    ]
    out = strategy.aggregate(1, updates)
    assert float(out["p"]) == pytest.approx(16 / 11, abs=1e-6) and int(out["n"]) == 4
    # from the previous global model -1: d = 1, 2, 6, 1/d = 1, 1/2, 1/6, Z = 5/3: a = 0.6, 0.3, 0.1; theta' = 0.8
    strategy = IDA(reference="global")
    strategy.initialize({"p": torch.tensor([-1.0]), "n": torch.tensor(0)}, ["a", "b", "c"])
    assert float(strategy.aggregate(1, updates)["p"]) == pytest.approx(0.8, abs=1e-6)
    # times n_k = 10, 20, 30 (from the mean): 5, 20, 10, Z = 35: theta' = 20/35 + 50/35 = 2
    strategy = IDA(weighting="num_examples")
    strategy.initialize({"p": torch.tensor([-1.0]), "n": torch.tensor(0)}, ["a", "b", "c"])
    assert float(strategy.aggregate(1, updates)["p"]) == pytest.approx(2.0, abs=1e-6)


def test_two_rounds_end_to_end(tmp_path):
    federation = make_federation(tmp_path / "ida", IDA(), rounds=2)
    results = federation.fit()
    assert results["last"]["round"] == 2
    fedavg = make_federation(tmp_path / "fedavg", FedAvg(weighting="uniform"), rounds=2)
    fedavg.fit()
    ours, theirs = federation.strategy.global_state, fedavg.strategy.global_state
    assert not all(torch.equal(ours[n], theirs[n]) for n in ours)  # other weights than the plain mean
    assert all(torch.isfinite(t).all() for t in ours.values() if t.is_floating_point())


def test_the_cli_selects_ida_by_its_short_name():
    cfg = (
        build_parser()
        .parse_args(
            [
                "fit",
                "--config",
                str(ROOT / "recipes" / "quickstart.yaml"),
                "--strategy",
                "IDA",
                "--strategy.reference",
                "global",
            ]
        )
        .fit
    )
    assert cfg.strategy.class_path == "fedlit.strategies.IDA" and cfg.strategy.init_args.reference == "global"


def test_bad_options_are_named():
    with pytest.raises(ConfigError, match=r"reference='median'.*p=0\.5"):
        IDA(reference="median", p=0.5)
    assert repr(IDA()) == "IDA(reference='mean', p=2.0, weighting='uniform')"
