"""Normalization layers are found by class, by class name and by structure (fedlit.core.roles.is_norm_module)."""

import pytest
import torch
import transformers
from peft import LoraConfig, get_peft_model
from timm.layers import LayerNorm2d, LayerScale, RmsNorm
from torch import nn
from torch.nn.utils import parametrizations

from fedlit.core.roles import ParameterRoles, is_norm_module
from fedlit.strategies import FedBN, SiloBN


def tiny_t5() -> nn.Module:
    torch.manual_seed(0)
    config = transformers.T5Config(d_model=16, d_ff=32, num_layers=1, num_heads=2, d_kv=8, vocab_size=32)
    return transformers.T5EncoderModel(config)


def tiny_llama() -> nn.Module:
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        vocab_size=32,
    )
    return transformers.LlamaModel(config)


T5_NORM = {
    "encoder.block.0.layer.0.layer_norm.weight",
    "encoder.block.0.layer.1.layer_norm.weight",
    "encoder.final_layer_norm.weight",
}
LLAMA_NORM = {
    "layers.0.input_layernorm.weight",
    "layers.0.post_attention_layernorm.weight",
    "norm.weight",
}


@pytest.mark.parametrize(
    "build, expected, not_norm",
    [
        (
            tiny_t5,
            T5_NORM,
            [
                "shared.weight",
                "encoder.block.0.layer.0.SelfAttention.q.weight",
                "encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight",
                "encoder.block.0.layer.1.DenseReluDense.wo.weight",
            ],
        ),
        (
            tiny_llama,
            LLAMA_NORM,
            [
                "embed_tokens.weight",
                "layers.0.self_attn.q_proj.weight",
                "layers.0.mlp.down_proj.weight",
                "rotary_emb.inv_freq",
            ],
        ),
    ],
    ids=["t5", "llama"],
)
def test_custom_norm_classes_of_transformers_encoders_are_norm(build, expected, not_norm):
    roles = ParameterRoles.from_module(build(), [])
    assert {n for n in roles if roles.is_norm(n)} == expected
    for name in not_norm:
        assert name in roles and not roles.is_norm(name)


@pytest.mark.parametrize("build, expected", [(tiny_t5, T5_NORM), (tiny_llama, LLAMA_NORM)], ids=["t5", "llama"])
def test_fedbn_makes_exactly_the_custom_norm_layers_personal(build, expected):
    roles = FedBN().configure_roles(ParameterRoles.from_module(build(), []))
    assert set(roles.names("personal")) == expected


@pytest.mark.parametrize("use_dora", [False, True], ids=["lora", "dora"])
def test_lora_matrices_are_not_norm_and_the_wrapped_norms_still_are(use_dora):
    config = LoraConfig(r=2, target_modules=["q_proj", "v_proj"], use_dora=use_dora)
    roles = ParameterRoles.from_module(get_peft_model(tiny_llama(), config), [])
    assert {n for n in roles if roles.is_norm(n)} == {"base_model.model." + n for n in LLAMA_NORM}
    lora = [n for n in roles if "lora_" in n]
    # lora_A and lora_B of two layers, and with DoRA a 1-D magnitude vector per layer.
    assert len(lora) == (6 if use_dora else 4) and not any(roles.is_norm(n) for n in lora)


class MyRMSNorm(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(dim))


class Affine(nn.Module):
    """A plain module with a 1-D weight and bias: norm only when its attribute name says so."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim))


class BiasOnly(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.bias = nn.Parameter(torch.zeros(dim))


class FrozenBatchNorm2d(nn.Module):
    """torchvision style: statistics and affine terms are all buffers."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        for key, value in (("weight", 1.0), ("bias", 0.0), ("running_mean", 0.0), ("running_var", 1.0)):
            self.register_buffer(key, torch.full((dim,), value))


class PreNorm(nn.Module):
    """Wraps a norm and a layer: the wrapper itself is not a norm layer, its ``norm`` child is."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.norm = Affine(dim)
        self.fn = nn.Linear(dim, dim)


class Mixed(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.pre = MyRMSNorm(4)
        self.ln_f = Affine(4)
        self.norms = nn.ModuleList([Affine(4), Affine(4)])
        self.scale = Affine(4)  # same class, name does not say norm
        self.ls1 = LayerScale(4)  # timm LayerScale: a 1-D gamma
        self.norm_proj = nn.Linear(4, 1)  # name says norm, but a Linear (its bias is 1-D)
        self.norm_bias = BiasOnly(4)
        self.bn = nn.Conv1d(4, 4, 1)
        self.block = PreNorm(4)
        self.frozen_bn = FrozenBatchNorm2d(4)
        self.snorm = parametrizations.spectral_norm(nn.Linear(4, 4))
        self.wnorm = parametrizations.weight_norm(nn.Linear(4, 4))
        self.head = nn.Linear(4, 2)


def test_norm_by_class_name_and_by_structure_and_never_otherwise():
    roles = ParameterRoles.from_module(Mixed(), [])
    assert {n for n in roles if roles.is_norm(n)} == {
        "pre.scale",
        "ln_f.weight",
        "ln_f.bias",
        "norms.0.weight",
        "norms.0.bias",
        "norms.1.weight",
        "norms.1.bias",
        "block.norm.weight",
        "block.norm.bias",
        "frozen_bn.weight",
        "frozen_bn.bias",
        "frozen_bn.running_mean",
        "frozen_bn.running_var",
    }
    # The spectral normalization's power-iteration vectors are buffers, but not normalization statistics.
    assert "snorm.parametrizations.weight.0._u" in roles and not roles.is_norm("snorm.parametrizations.weight.0._u")


def test_silobn_keeps_the_buffers_of_a_custom_batchnorm_local():
    roles = SiloBN().configure_roles(ParameterRoles.from_module(Mixed(), []))
    assert set(roles.names("personal")) == {
        "frozen_bn.weight",
        "frozen_bn.bias",
        "frozen_bn.running_mean",
        "frozen_bn.running_var",
    }


@pytest.mark.parametrize(
    "module, name, expected",
    [
        (RmsNorm(4), "", True),
        (LayerNorm2d(4), "neck.1", True),
        (nn.BatchNorm2d(4), "", True),
        (MyRMSNorm(4), "", True),
        (Affine(4), "layer.0.LayerNorm", True),
        (Affine(4), "blocks.3.norm1", True),
        (Affine(4), "q_norm", True),
        (Affine(4), "", False),
        (Affine(4), "enormous", False),
        (LayerScale(4), "blocks.0.ls1", False),
        (LayerScale(4), "norm", False),
        (nn.Linear(4, 4), "norm", False),
        (nn.Conv2d(4, 4, 1), "bn1", False),
        (nn.Embedding(4, 4), "layer_norm", False),
        (BiasOnly(4), "norm", False),
        (nn.LayerNorm(4, elementwise_affine=False), "", True),
        (nn.Identity(), "norm", False),
        (PreNorm(4), "layers.0.attn", False),
    ],
    ids=lambda v: type(v).__name__ if isinstance(v, nn.Module) else repr(v),
)
def test_is_norm_module(module, name, expected):
    assert is_norm_module(module, name) is expected
