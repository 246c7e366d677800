"""pFedMoAP: the gate's logits worked by hand, the nearest experts, the global prompt, and a run through the CLI."""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path

import pytest
import torch
from torch import nn

from fedlit.cli import main, run
from fedlit.core.errors import ConfigError
from fedlit.data import SyntheticImages
from fedlit.models import CLIP, tiny_clip_config
from fedlit.strategies import ClientUpdate, pFedMoAP
from fedlit.strategies.pfedmoap import nearest_experts
from fedlit.tasks import CLIPPromptModule
from fedlit.tasks.clip_prompt import moap_logits

ROOT = Path(__file__).resolve().parents[2]


def tiny_moap_module() -> CLIPPromptModule:
    """A tiny random CLIP (projection 32) with 16 context tokens and the gate on 8 pooled dims, 2 heads."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "randomly initialized"
        return CLIPPromptModule(
            clip=CLIP(config=tiny_clip_config()),
            class_names=["blob", "ring", "bar"],
            gating=True,
            gate_dim=8,
            gate_heads=2,
            in_channels=1,
            lr=0.05,
        )


def tiny_image_sites() -> SyntheticImages:
    return SyntheticImages(num_clients=3, samples_per_client=12, num_classes=3, image_size=16, batch_size=4, seed=0)


def identity_attention(dim: int) -> nn.MultiheadAttention:
    attention = nn.MultiheadAttention(dim, 1)
    with torch.no_grad():
        attention.in_proj_weight.copy_(torch.cat([torch.eye(dim)] * 3))
        attention.in_proj_bias.zero_()
        attention.out_proj.weight.copy_(torch.eye(dim))
        attention.out_proj.bias.zero_()
    return attention


def test_gate_logits_by_hand_with_identity_projections():
    image = torch.tensor([[1.0, 2.0, 2.0, 0.0]])  # |I| = 3; pooled (every 2nd of the normalized): q = (1/3, 2/3)
    local = torch.tensor([[3.0, 0.0, 4.0, 0.0], [0.0, 0.0, 0.0, 1.0]])  # pooled normalized: (.6, .8) and (0, 0)
    experts = torch.tensor([[[1.0, 0.0], [0.0, 1.0]]])  # one expert, its features for class 0 and class 1
    s, lam = torch.tensor(2.0), 0.5
    got = moap_logits(image, local, experts, s, identity_attention(2), dim=2, scale=10.0, lam=lam)

    # class 0: cos = (1*3 + 2*4) / (3*5) = 11/15; keys (.6, .8) and (1, 0): scores 10 * (11/15, 1/3)
    w = 1 / (1 + math.exp(-10 * (11 / 15 - 1 / 3)))
    gate0 = w * (11 / 15) + (1 - w) * (1 / 3)  # <q, w k_L + (1 - w) k_1>
    # class 1: cos = 0; keys (0, 0) and (0, 1): scores 0 and 10 * 2/3; <q, (0, 1)> = 2/3
    w1 = 1 / (1 + math.exp(-10 * 2 / 3))
    gate1 = w1 * 2 / 3
    expected = torch.tensor([[lam * 2 * 11 / 15 + 2 * gate0, 2 * gate1]])
    assert torch.allclose(got, expected, atol=1e-6)


def explicit_gate(image, local, experts, s, attention, dim, scale, lam):
    """The gate written out with loops and an explicit softmax (no torch attention function)."""
    heads = attention.num_heads
    w_q, w_k, w_v = attention.in_proj_weight.detach().chunk(3)
    b_q, b_k, b_v = attention.in_proj_bias.detach().chunk(3)
    image_n = image / image.norm(dim=-1, keepdim=True)
    local_n = local / local.norm(dim=-1, keepdim=True)
    stride = image.shape[-1] // dim
    out = torch.zeros(len(image), len(local), dtype=torch.float64)
    for b in range(len(image)):
        q_in = image_n[b, ::stride]
        for c in range(len(local)):
            keys = [local_n[c, ::stride]] + [e[c] for e in experts]
            q = w_q @ q_in + b_q
            ks = [w_k @ k + b_k for k in keys]
            vs = [w_v @ k + b_v for k in keys]
            size = dim // heads
            mixed = []
            for h in range(heads):
                part = slice(h * size, (h + 1) * size)
                scores = [scale * float(q[part] @ k[part]) for k in ks]
                top = max(scores)
                weights = [math.exp(x - top) for x in scores]
                total = sum(weights)
                mixed.append(sum(wt / total * v[part] for wt, v in zip(weights, vs, strict=True)))
            o = attention.out_proj.weight.detach() @ torch.cat(mixed) + attention.out_proj.bias.detach()
            cos = float(image_n[b] @ local_n[c])
            out[b, c] = lam * float(s) * cos + float(s) * float(q_in @ o)
    return out


def test_gate_logits_match_an_explicit_computation_with_heads():
    torch.manual_seed(0)
    image, local = torch.randn(3, 8), torch.randn(4, 8)
    experts = torch.nn.functional.normalize(torch.randn(2, 4, 8), dim=-1)[..., ::2]  # (E, C, d = 4)
    attention = nn.MultiheadAttention(4, 2)
    with torch.no_grad():
        attention.in_proj_bias.normal_()
        attention.out_proj.bias.normal_()
    got = moap_logits(image, local, experts, torch.tensor(3.0), attention, dim=4, scale=10.0, lam=0.5)
    expected = explicit_gate(image, local, experts, 3.0, attention, 4, 10.0, 0.5)
    assert torch.allclose(got.double(), expected, atol=1e-5)
    # without experts: CoOp's logits s cos(I, T_L), no lam
    coop = moap_logits(image, local, None, torch.tensor(3.0), attention, dim=4, scale=10.0, lam=0.5)
    cos = torch.nn.functional.normalize(image, dim=-1) @ torch.nn.functional.normalize(local, dim=-1).t()
    assert torch.allclose(coop, 3.0 * cos, atol=1e-6)


def test_nearest_experts_by_hand():
    zero = torch.zeros(2, 2)
    candidates = {
        "a": torch.ones(2, 2),  # distance 2
        "b": torch.tensor([[0.0, 0.0], [0.0, 1.0]]),  # 1
        "c": torch.tensor([[0.0, 0.0], [0.0, -1.0]]),  # 1 (a tie: b came first)
        "d": torch.tensor([[3.0, 0.0], [0.0, 0.0]]),
    }  # 3
    assert nearest_experts(zero, candidates, 3) == ["b", "c", "a"]
    assert nearest_experts(zero, candidates, 9) == ["b", "c", "a", "d"]  # capped at what is stored
    assert nearest_experts(zero, candidates, 0) == [] and nearest_experts(zero, {}, 3) == []


def test_global_prompt_is_the_weighted_mean_and_experts_are_the_nearest_stored_prompts():
    strategy = pFedMoAP(num_experts=3)
    strategy.initialize({"prompt.ctx": torch.zeros(2, 2)}, ["a", "b", "c"])
    assert strategy.configure_client_extras(1, "a")["experts"].shape == (0, 2, 2)  # nothing stored yet
    strategy.global_state = strategy.aggregate(
        1,
        [
            ClientUpdate("a", 1, {"prompt.ctx": torch.ones(2, 2)}),
            ClientUpdate("b", 3, {"prompt.ctx": torch.full((2, 2), 2.0)}),
        ],
    )
    assert torch.allclose(strategy.global_state["prompt.ctx"], torch.full((2, 2), (1 * 1 + 3 * 2) / 4))
    assert torch.equal(strategy.configure_client(2, "c")["prompt.ctx"], strategy.global_state["prompt.ctx"])
    assert strategy.configure_client_extras(2, "c")["experts"].shape == (0, 2, 2)  # c has no previous prompt
    assert torch.equal(strategy.configure_client_extras(2, "a")["experts"], torch.full((1, 2, 2), 2.0))
    strategy.global_state = strategy.aggregate(2, [ClientUpdate("c", 2, {"prompt.ctx": torch.full((2, 2), 5.0)})])
    assert torch.equal(strategy.global_state["prompt.ctx"], torch.full((2, 2), 5.0))  # the round's uploads only
    # a (all 1) is 2 from b (all 2) and 8 from c (all 5): b first; K - 1 = 2
    assert strategy.expert_ids("a") == ["b", "c"] and strategy.expert_ids("c") == ["b", "a"]
    assert torch.equal(
        strategy.configure_client_extras(3, "a")["experts"],
        torch.stack([torch.full((2, 2), 2.0), torch.full((2, 2), 5.0)]),
    )
    restored = pFedMoAP(num_experts=3)
    restored.initialize({"prompt.ctx": torch.zeros(2, 2)}, ["a", "b", "c"])
    restored.load_state_dict(strategy.state_dict())
    assert restored.expert_ids("a") == ["b", "c"]


def test_settings_and_models_it_cannot_use_are_refused():
    with pytest.raises(ConfigError, match="num_experts=0 must be an integer >= 1"):
        pFedMoAP(num_experts=0)
    with pytest.raises(ConfigError, match="does not share"):
        pFedMoAP().initialize({"head.weight": torch.zeros(2, 2)}, ["a"])
    module = tiny_moap_module()
    module.gate = None
    with pytest.raises(ConfigError, match="gating: true"):
        pFedMoAP().on_fit_start(None, module)


def test_two_rounds_through_the_cli_send_the_experts(tmp_path):
    out = tmp_path / "run"
    main(
        [
            "fit",
            "--config",
            str(ROOT / "recipes/pfedmoap_tiny.yaml"),
            "--out_dir",
            str(out),
            "--data.init_args.samples_per_client=20",
            "--federation.progress_bar=false",
        ]
    )
    results = json.loads((out / "results.json").read_text())
    assert results["last"]["round"] == 2 and results["strategy_class"].endswith("pFedMoAP")
    prompt = 16 * 32 * 4  # bytes of one float32 prompt (16 tokens, width 32)
    # round 1: 4 clients receive the global prompt, no experts; round 2: the prompt and K - 1 = 2 peers' prompts
    assert results["comm"]["download_bytes"] == 4 * prompt + 4 * 3 * prompt
    assert results["comm"]["upload_bytes"] == 2 * 4 * prompt  # the prompt only: the gate stays
    # `fedlit cost` on the same recipe estimates what the run measured, experts included
    estimate = run(["cost", "--config", str(ROOT / "recipes/pfedmoap_tiny.yaml"), "--format", "json"])
    totals = estimate["strategies"][0]["run"]
    assert (totals["download_bytes"], totals["upload_bytes"]) == (
        results["comm"]["download_bytes"],
        results["comm"]["upload_bytes"],
    )
    accuracy = results["last"]["test"]["accuracy_mean"] if "test" in results["last"] else None
    assert accuracy is None or 0.0 <= accuracy <= 1.0


def test_the_module_keeps_the_experts_of_the_turn_for_evaluation():
    module = tiny_moap_module().eval()
    strategy = pFedMoAP(num_experts=3)
    experts = torch.randn(2, 16, 32) * 0.02
    strategy.on_client_fit_start(module, {"experts": experts})
    assert module.experts.shape == (2, 3, 8)
    features = module.experts.clone()

    class Store:
        device = torch.device("cpu")

    class Client:
        store = Store()

    state: dict = {}
    strategy.on_client_fit_end(module, state, Client())
    assert module.experts is None and torch.equal(state["experts"], features)
    images = torch.randn(2, 1, 16, 16)
    plain = module(images)
    strategy.on_client_evaluate_start(module, state)
    assert torch.equal(module.experts, features) and not torch.allclose(module(images), plain)
    strategy.on_client_evaluate_start(module, {})  # a client that never trained: no experts left over
    assert module.experts is None and torch.equal(module(images), plain)


def test_the_gate_drops_nothing_by_default_as_the_authors_code_behaves():
    # the authors' gate takes dropout=0.1 and never applies it: by default a training forward is deterministic and
    # equals the evaluation forward; gate_dropout: 0.1 applies it (two training forwards then differ)
    module = tiny_moap_module()
    assert module.gate_dropout == 0.0
    torch.manual_seed(0)
    pFedMoAP(num_experts=3).on_client_fit_start(module, {"experts": torch.randn(2, 16, 32) * 0.02})
    images = torch.randn(2, 1, 16, 16)
    module.train()
    first = module(images)
    assert torch.equal(module(images), first) and torch.equal(module.eval()(images), first)
    module.gate_dropout = 0.1
    module.train()
    assert not torch.equal(module(images), module(images))
