"""LoRA through peft: only adapter tensors are new, the output is unchanged at init, targets are checked."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

from fedlit.models import HFEncoder, LoRA, TimmBackbone, tiny_bert_config
from fedlit.models.lora import FusedQVLoRA


def _quiet_build(spec) -> nn.Module:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return spec.build()


def _original_name(name: str) -> str:
    # peft keeps a targeted layer as `base_layer`.
    return name.replace(".base_layer.", ".")


def _check_only_lora_is_new(plain: nn.Module, adapted: nn.Module, target: str) -> list[str]:
    before = {name for name, _ in plain.named_parameters()}
    after = [name for name, _ in adapted.named_parameters()]
    new = sorted({_original_name(name) for name in after} - before)
    assert new and all(".lora_A.default." in name or ".lora_B.default." in name for name in new)
    assert all(f"{target}.lora_" in name for name in new)
    assert before <= {_original_name(name) for name in after}
    return new


def test_vit_lora_adds_only_adapters_and_keeps_output(images: torch.Tensor) -> None:
    torch.manual_seed(1)
    plain = _quiet_build(TimmBackbone(name="fedlit_test_vit")).eval()
    torch.manual_seed(1)
    adapted = _quiet_build(TimmBackbone(name="fedlit_test_vit", lora=LoRA(r=2, alpha=4))).eval()
    new = _check_only_lora_is_new(plain, adapted, "qkv")
    # depth 2 x (A, B); A is r x 32, B is 96 x r (q, k and v fused).
    assert new == [
        "blocks.0.attn.qkv.lora_A.default.weight",
        "blocks.0.attn.qkv.lora_B.default.weight",
        "blocks.1.attn.qkv.lora_A.default.weight",
        "blocks.1.attn.qkv.lora_B.default.weight",
    ]
    params = dict(adapted.named_parameters())
    assert params["blocks.0.attn.qkv.lora_A.default.weight"].shape == (2, 32)
    assert params["blocks.0.attn.qkv.lora_B.default.weight"].shape == (96, 2)
    assert torch.equal(params["blocks.0.attn.qkv.base_layer.weight"], plain.blocks[0].attn.qkv.weight)
    assert adapted.blocks[0].attn.qkv.scaling["default"] == 2.0
    assert torch.equal(adapted(images), plain(images))
    # The test can fail: a nonzero B changes the output.
    with torch.no_grad():
        params["blocks.0.attn.qkv.lora_B.default.weight"].fill_(0.1)
    assert not torch.allclose(adapted(images), plain(images))


def test_lora_does_not_decide_what_trains() -> None:
    model = _quiet_build(TimmBackbone(name="fedlit_test_vit", lora=LoRA(r=2)))
    assert all(p.requires_grad for p in model.parameters())
    assert model.blocks[0].attn.qkv.base_layer.weight.requires_grad


def test_bert_lora_targets_query_value(tokens: dict[str, torch.Tensor]) -> None:
    torch.manual_seed(2)
    plain = _quiet_build(HFEncoder(config=tiny_bert_config())).eval()
    torch.manual_seed(2)
    adapted = _quiet_build(HFEncoder(config=tiny_bert_config(), lora=LoRA(r=2, dropout=0.1))).eval()
    new = [name for name, _ in adapted.named_parameters() if "lora_" in name]
    assert len(new) == 2 * 2 * 2  # layers x (query, value) x (A, B)
    assert {name.split(".lora_")[0].rsplit(".", 1)[-1] for name in new} == {"query", "value"}
    assert "bert.encoder.layer.0.attention.self.query.lora_A.default.weight" in new
    assert torch.equal(adapted(tokens), plain(tokens))


def test_explicit_targets(images: torch.Tensor) -> None:
    model = _quiet_build(TimmBackbone(name="fedlit_test_vit", lora=LoRA(r=2, target_modules=["qkv", "fc1"])))
    names = [name for name, _ in model.named_parameters() if "lora_A" in name]
    assert len(names) == 4 and sum("mlp.fc1" in name for name in names) == 2


def test_architecture_without_default_needs_targets() -> None:
    with pytest.raises(ValueError, match=r"lora.target_modules is required for EfficientNet.*conv_pw"):
        _quiet_build(TimmBackbone(name="fedlit_test_cnn", lora=LoRA()))
    model = _quiet_build(TimmBackbone(name="fedlit_test_cnn", lora=LoRA(r=2, target_modules=["conv_pwl"])))
    assert any(name.endswith("conv_pwl.lora_A.default.weight") for name, _ in model.named_parameters())


def test_unmatched_target_is_an_error() -> None:
    with pytest.raises(ValueError, match=r"\['kqv'\] match no layer of VisionTransformer; .*'qkv'"):
        _quiet_build(TimmBackbone(name="fedlit_test_vit", lora=LoRA(target_modules=["qkv", "kqv"])))


def test_lora_options_validated_together() -> None:
    with pytest.raises(ValueError) as error:
        LoRA(r=0, alpha=-1, dropout=1.0, target_modules="qkv")  # type: ignore[arg-type]
    message = str(error.value)
    for option in ("lora.r", "lora.alpha", "lora.dropout", "lora.target_modules"):
        assert option in message
    assert LoRA(r=4, alpha=8).scaling == 2.0


def test_qv_slice_lora_names_shapes_and_init(images: torch.Tensor) -> None:
    torch.manual_seed(1)
    plain = _quiet_build(TimmBackbone(name="fedlit_test_vit")).eval()
    torch.manual_seed(1)
    adapted = _quiet_build(TimmBackbone(name="fedlit_test_vit", lora=LoRA(r=2, alpha=4, fused_qkv="qv"))).eval()
    new = [name for name, _ in adapted.named_parameters() if "lora_" in name]
    # Per block: A then B, q then v (FHBench's order of B tensors: block 0 q, block 0 v, block 1 q, ...).
    assert new == [f"blocks.{i}.attn.qkv.lora_{m}.{s}.weight" for i in (0, 1) for m in "AB" for s in "qv"]
    params = dict(adapted.named_parameters())
    assert params["blocks.0.attn.qkv.lora_A.q.weight"].shape == (2, 32)
    assert params["blocks.0.attn.qkv.lora_B.v.weight"].shape == (32, 2)  # one third of the 96 outputs
    a = params["blocks.1.attn.qkv.lora_A.v.weight"]
    # Kaiming-uniform with a = sqrt(5) on a (2, 32) weight is U(-1/sqrt(32), 1/sqrt(32)).
    assert a.abs().max() <= 32**-0.5 and a.abs().max() > 0.05
    assert not params["blocks.1.attn.qkv.lora_B.q.weight"].any()
    assert torch.equal(params["blocks.0.attn.qkv.base_layer.weight"], plain.blocks[0].attn.qkv.weight)
    assert torch.equal(adapted(images), plain(images))  # B = 0: the original model


def test_qv_slice_lora_adds_scaled_update_to_q_and_v_only() -> None:
    base = nn.Linear(4, 6)  # q | k | v, two outputs each
    layer = FusedQVLoRA(base, r=1, alpha=3)  # scale 3
    with torch.no_grad():
        layer.lora_A["q"].weight.copy_(torch.tensor([[1.0, 0.0, 0.0, 0.0]]))
        layer.lora_B["q"].weight.copy_(torch.tensor([[2.0], [0.0]]))
        layer.lora_A["v"].weight.copy_(torch.tensor([[0.0, 1.0, 1.0, 0.0]]))
        layer.lora_B["v"].weight.copy_(torch.tensor([[0.0], [-1.0]]))
    x = torch.tensor([[0.5, 1.0, 2.0, -3.0]])
    # A_q x = 0.5 -> B_q A_q x = [1, 0] -> x3 = [3, 0]; A_v x = 3 -> B_v A_v x = [0, -3] -> x3 = [0, -9].
    expected = base(x) + torch.tensor([[3.0, 0.0, 0.0, 0.0, 0.0, -9.0]])
    assert torch.allclose(layer(x), expected)


def test_qv_slice_lora_is_trainable_and_keeps_k(images: torch.Tensor) -> None:
    model = _quiet_build(TimmBackbone(name="fedlit_test_vit", lora=LoRA(r=2, alpha=16, fused_qkv="qv")))
    qkv = model.blocks[0].attn.qkv
    assert isinstance(qkv, FusedQVLoRA) and qkv.scaling == 8.0
    with torch.no_grad():
        qkv.lora_B["q"].weight.normal_()
        qkv.lora_B["v"].weight.normal_()
    tokens = torch.randn(2, 5, 32)
    delta = qkv(tokens) - qkv.base_layer(tokens)
    a_q, b_q = qkv.lora_A["q"].weight, qkv.lora_B["q"].weight
    a_v, b_v = qkv.lora_A["v"].weight, qkv.lora_B["v"].weight
    assert torch.allclose(delta[..., :32], 8.0 * tokens @ a_q.T @ b_q.T, atol=1e-5)
    assert torch.equal(delta[..., 32:64], torch.zeros(2, 5, 32))
    assert torch.allclose(delta[..., 64:], 8.0 * tokens @ a_v.T @ b_v.T, atol=1e-5)
    model(images).pow(2).sum().backward()  # (a plain sum of LayerNorm outputs has zero gradient)
    assert qkv.lora_A["q"].weight.grad is not None and qkv.lora_B["v"].weight.grad.abs().sum() > 0


def test_qv_slice_lora_with_other_targets_and_errors() -> None:
    model = _quiet_build(
        TimmBackbone(name="fedlit_test_vit", lora=LoRA(r=2, fused_qkv="qv", target_modules=["qkv", "fc1"]))
    )
    names = [name for name, _ in model.named_parameters() if "lora_A" in name]
    assert "blocks.0.attn.qkv.lora_A.q.weight" in names and "blocks.0.mlp.fc1.lora_A.default.weight" in names
    with pytest.raises(ValueError, match="lora.fused_qkv='qv' adapts fused qkv Linears"):
        _quiet_build(TimmBackbone(name="fedlit_test_vit", lora=LoRA(fused_qkv="qv", target_modules=["fc1"])))
    with pytest.raises(ValueError, match="lora.fused_qkv must be 'all' or 'qv'"):
        LoRA(fused_qkv="kv")  # type: ignore[arg-type]


def test_bert_lora_on_query_and_value_changes_only_those(tokens: dict[str, torch.Tensor]) -> None:
    torch.manual_seed(3)
    plain = _quiet_build(HFEncoder(config=tiny_bert_config())).eval()
    torch.manual_seed(3)
    spec = HFEncoder(config=tiny_bert_config(), lora=LoRA(r=8, alpha=16, target_modules=["query", "value"]))
    adapted = _quiet_build(spec).eval()
    attention = adapted.hf_model.encoder.layer[0].attention.self
    assert not any("lora_" in name for name, _ in attention.key.named_parameters())
    assert torch.equal(adapted(tokens), plain(tokens))  # B = 0
    x = torch.randn(3, 32)
    with torch.no_grad():
        attention.query.lora_B.default.weight.normal_()
    a, b = attention.query.lora_A.default.weight, attention.query.lora_B.default.weight
    expected = attention.query.base_layer(x) + 2.0 * x @ a.T @ b.T  # scale 16 / 8
    assert torch.allclose(attention.query(x), expected, atol=1e-5)
    assert torch.equal(attention.value(x), attention.value.base_layer(x))
    assert not torch.allclose(adapted(tokens), plain(tokens))
