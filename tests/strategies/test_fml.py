"""FML (Shen et al., arXiv 2020): both mutual-learning losses by hand on small logits (KL directions, batch mean,
detached teachers), alpha = beta = 1 being FedAvg for the meme and Local for the local model, two rounds end to end
with evaluation on the local model, the CLI name and bad options."""

import math
from pathlib import Path

import pytest
import torch

from fedlit.commands.fit import build_parser
from fedlit.core.errors import ConfigError
from fedlit.strategies import FML, FedAvg, Local
from fedlit.strategies.fml import fml_losses, two_class
from tests.conftest import make_federation

ROOT = Path(__file__).resolve().parents[2]


def test_both_losses_by_hand():
    # row 1: local p = (1/2, 1/2), meme p = (3/4, 1/4); row 2: both (1/2, 1/2), KL 0 (batch mean over 2 rows)
    local_logits = torch.tensor([[0.0, 0.0], [1.0, 1.0]], requires_grad=True)
    meme_logits = torch.tensor([[math.log(3.0), 0.0], [2.0, 2.0]], requires_grad=True)
    ce_local, ce_meme = torch.tensor(1.0), torch.tensor(2.0)
    kl_meme_local = 0.75 * math.log(0.75 / 0.5) + 0.25 * math.log(0.25 / 0.5)  # KL(p_meme || p_local) = 0.130812
    kl_local_meme = 0.5 * math.log(0.5 / 0.75) + 0.5 * math.log(0.5 / 0.25)  # KL(p_local || p_meme) = 0.143841
    local, meme = fml_losses(ce_local, ce_meme, local_logits, meme_logits, alpha=0.5, beta=0.25)
    # L_local = 0.5 * 1 + 0.5 * 0.130812 / 2 = 0.532703; L_meme = 0.25 * 2 + 0.75 * 0.143841 / 2 = 0.553940
    assert float(local.detach()) == pytest.approx(0.5 * 1.0 + 0.5 * kl_meme_local / 2, abs=1e-6)
    assert float(meme.detach()) == pytest.approx(0.25 * 2.0 + 0.75 * kl_local_meme / 2, abs=1e-6)
    assert float(local.detach()) == pytest.approx(0.532703, abs=1e-6)
    assert float(meme.detach()) == pytest.approx(0.553940, abs=1e-6)
    # each teacher is detached: L_local moves only the local logits, L_meme only the meme's
    local.backward(retain_graph=True)
    assert meme_logits.grad is None and local_logits.grad.abs().sum() > 0
    local_logits.grad = None
    meme.backward()
    assert local_logits.grad is None and meme_logits.grad.abs().sum() > 0
    # alpha = beta = 1: the CE terms alone
    local, meme = fml_losses(ce_local, ce_meme, local_logits, meme_logits, alpha=1.0, beta=1.0)
    assert (float(local.detach()), float(meme.detach())) == (1.0, 2.0)


def test_a_binary_logit_is_two_class():
    assert two_class(torch.tensor([[2.0], [-1.0]])).tolist() == [[0.0, 2.0], [0.0, -1.0]]
    logits = torch.tensor([[1.0, 2.0, 3.0]])
    assert two_class(logits) is logits


def test_alpha_beta_one_is_fedavg_for_the_meme_and_local_for_the_local_model(tmp_path):
    federation = make_federation(tmp_path / "fml", FML(alpha=1.0, beta=1.0), rounds=2)
    federation.fit()
    fedavg = make_federation(tmp_path / "fedavg", FedAvg(), rounds=2)
    fedavg.fit()
    ours, theirs = federation.strategy.global_state, fedavg.strategy.global_state
    assert all(torch.equal(ours[n], theirs[n]) for n in ours)
    local = make_federation(tmp_path / "local", Local(), rounds=2)
    local.fit()
    for client in federation.client_ids:
        assert federation.evaluate_client(2, client, "val") == local.evaluate_client(2, client, "val")


def test_two_rounds_with_the_defaults_evaluate_the_local_model(tmp_path):
    federation = make_federation(tmp_path / "fml", FML(), rounds=2)
    federation.fit()
    fedavg = make_federation(tmp_path / "fedavg", FedAvg(), rounds=2)
    fedavg.fit()
    ours, theirs = federation.strategy.global_state, fedavg.strategy.global_state
    assert not all(torch.equal(ours[n], theirs[n]) for n in ours)  # the KL term moves the meme
    payload = torch.load(tmp_path / "fml" / "checkpoints" / "last.ckpt", weights_only=False)
    assert payload["server_round"] == 2
    key = federation.strategy.state_key
    state = federation.store.extra("c0", key)
    assert set(state["local"]) == set(federation.module.named_tensors("shared", "personal"))
    got = federation.evaluate_client(2, "c0", "val")
    live = federation.module.named_tensors("shared", "personal")
    assert all(torch.equal(live[n], state["local"][n]) for n in live)
    assert math.isfinite(got["loss"])
    assert federation.strategy.global_model_state("c0").keys() == ours.keys()


def test_the_cli_selects_fml_by_its_short_name():
    cfg = (
        build_parser()
        .parse_args(
            [
                "fit",
                "--config",
                str(ROOT / "recipes" / "quickstart.yaml"),
                "--strategy",
                "FML",
                "--strategy.alpha",
                "0.3",
            ]
        )
        .fit
    )
    assert cfg.strategy.class_path == "fedlit.strategies.FML" and cfg.strategy.init_args.alpha == 0.3


def test_bad_options_are_named():
    with pytest.raises(ConfigError, match=r"alpha=1\.5.*beta=-1"):
        FML(alpha=1.5, beta=-1)
    assert repr(FML()) == "FML(alpha=0.5, beta=0.5, weighting='num_examples')"
