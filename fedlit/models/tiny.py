"""Tiny timm models for tests and quick runs, registered like real ones (`TimmBackbone(name=...)`).

- `fedlit_test_vit`: a ViT on 16x16 images (patch 4, embed 32, depth 2, heads 2; 16 tokens + CLS).
- `fedlit_test_cnn`: a 3-stage EfficientNet-Lite-style CNN (stem 8, stages of 8, 16, 24 channels, 32
  features) with BatchNorm, named like timm's EfficientNet (`conv_stem`, `bn1`, `blocks.<i>.<j>...`).

Both take timm's usual keyword arguments (e.g. `img_size`, `in_chans`, `drop_rate`) through `model_args`.
They have no pretrained weights; asking for them is an error, not a download.
"""

from __future__ import annotations

from typing import Any

from timm.models import build_model_with_cfg, generate_default_cfgs
from timm.models.efficientnet import EfficientNet, decode_arch_def
from timm.models.vision_transformer import VisionTransformer
from torch import nn

from fedlit.core.errors import ConfigError
from fedlit.models.registry import register_model

__all__ = ["fedlit_test_cnn", "fedlit_test_vit"]

# timm looks up each model's pretrained config (input size, normalization) in its module's `default_cfgs`.
default_cfgs = generate_default_cfgs(
    {
        "fedlit_test_vit": {"input_size": (3, 16, 16), "num_classes": 0},
        "fedlit_test_cnn": {"input_size": (3, 16, 16), "num_classes": 0},
    }
)


def _refuse_pretrained(name: str, pretrained: bool) -> None:
    if pretrained:
        raise ConfigError(f"{name} is a tiny test model: it has no pretrained weights (use pretrained=False)")


@register_model
def fedlit_test_vit(pretrained: bool = False, **kwargs: Any) -> VisionTransformer:
    """A 2-block ViT for 16x16 images: patch 4, embed 32, 2 heads, MLP ratio 2.

    Args:
        pretrained: Must be False.
        **kwargs: `VisionTransformer` arguments overriding the defaults.

    Returns:
        The model.
    """
    _refuse_pretrained("fedlit_test_vit", pretrained)
    args = {"img_size": 16, "patch_size": 4, "embed_dim": 32, "depth": 2, "num_heads": 2, "mlp_ratio": 2.0}
    return build_model_with_cfg(VisionTransformer, "fedlit_test_vit", pretrained=False, **{**args, **kwargs})


@register_model
def fedlit_test_cnn(pretrained: bool = False, **kwargs: Any) -> EfficientNet:
    """A 3-stage EfficientNet-Lite-style CNN (depthwise-separable then inverted-residual blocks, ReLU6, BN).

    Args:
        pretrained: Must be False.
        **kwargs: `EfficientNet` arguments overriding the defaults.

    Returns:
        The model.
    """
    _refuse_pretrained("fedlit_test_cnn", pretrained)
    arch = [["ds_r1_k3_s1_e1_c8"], ["ir_r1_k3_s2_e2_c16"], ["ir_r1_k3_s2_e2_c24"]]
    args = {
        "block_args": decode_arch_def(arch),
        "stem_size": 8,
        "fix_stem": True,
        "num_features": 32,
        "act_layer": nn.ReLU6,
    }
    return build_model_with_cfg(EfficientNet, "fedlit_test_cnn", pretrained=False, **{**args, **kwargs})
