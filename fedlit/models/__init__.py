"""Backbone builders (timm, transformers, small nets) and adapters (peft LoRA) for fedlit.

A backbone is configured by a spec (`TimmBackbone`, `HFEncoder`, `SmallCNN`, `Identity`) whose `build()`
returns a module with `num_features` that maps inputs to (B, num_features) features. Nothing downloads:
weights come from local files, or by name from the registry packages fedlit knows (`PRETRAINED`: recipes say
`weights: efficientnet_lite0` or `weights: minilm_l6_v2`; `resolve_weights(name)` gives the path).

Each name is imported from its submodule on first use, so a recipe that uses `SmallCNN` never imports timm,
transformers or peft (`from fedlit.models import HFEncoder` and `class_path: fedlit.models.HFEncoder` work as
usual). timm's registry receives the `fedlit_test_*` models when timm is first needed (`TimmBackbone`,
`list_models`, `register_model`).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fedlit.models.audio import Wav2Vec2Encoder, Wav2Vec2Features, tiny_wav2vec2_config
    from fedlit.models.backbones import MLP, Backbone, Identity, SmallCNN, TimmBackbone
    from fedlit.models.hf import HFEncoder, TransformersEncoder, tiny_bert_config
    from fedlit.models.lora import LoRA
    from fedlit.models.pretrained import LoadReport, load_checkpoint, read_state_dict
    from fedlit.models.registry import list_models, register_model
    from fedlit.models.sam.adapter import SamAdapter
    from fedlit.models.unet import SegmentationNetwork, SmpUnet, TinyUNet
    from fedlit.models.weights import (
        PRETRAINED,
        PretrainedWeights,
        efficientnet_lite0_weights,
        minilm_l6_v2_folder,
        resolve_weights,
    )

_EXPORTS = {
    "PRETRAINED": "weights",
    "PretrainedWeights": "weights",
    "resolve_weights": "weights",
    "Backbone": "backbones",
    "HFEncoder": "hf",
    "Identity": "backbones",
    "LoRA": "lora",
    "MLP": "backbones",
    "LoadReport": "pretrained",
    "SamAdapter": "sam_adapter",
    "SegmentationNetwork": "unet",
    "SmallCNN": "backbones",
    "SmpUnet": "unet",
    "TimmBackbone": "backbones",
    "TinyUNet": "unet",
    "TransformersEncoder": "hf",
    "efficientnet_lite0_weights": "weights",
    "list_models": "registry",
    "load_checkpoint": "pretrained",
    "minilm_l6_v2_folder": "weights",
    "read_state_dict": "pretrained",
    "register_model": "registry",
    "tiny_bert_config": "hf",
    "Wav2Vec2Encoder": "audio",
    "Wav2Vec2Features": "audio",
    "tiny_wav2vec2_config": "audio",
}
__all__ = [
    "PRETRAINED",
    "Backbone",
    "HFEncoder",
    "Identity",
    "LoRA",
    "LoadReport",
    "MLP",
    "PretrainedWeights",
    "SamAdapter",
    "SegmentationNetwork",
    "SmallCNN",
    "SmpUnet",
    "TimmBackbone",
    "TinyUNet",
    "TransformersEncoder",
    "efficientnet_lite0_weights",
    "list_models",
    "load_checkpoint",
    "minilm_l6_v2_folder",
    "read_state_dict",
    "register_model",
    "resolve_weights",
    "tiny_bert_config",
    "Wav2Vec2Encoder",
    "Wav2Vec2Features",
    "tiny_wav2vec2_config",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'fedlit.models' has no attribute {name!r}")
    if module == "registry":
        # fedlit's own builders register themselves when their module is imported (they import the registry,
        # as timm's model files do): the registry is handed out with them in it.
        importlib.import_module("fedlit.models.tiny")
    value = getattr(importlib.import_module(f"fedlit.models.{module}"), name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})


_EXPORTS.update(MomentEncoder="timeseries", TimeSeriesEncoder="timeseries", tiny_moment_config="timeseries")
__all__ += ["MomentEncoder", "TimeSeriesEncoder", "tiny_moment_config"]
_EXPORTS["tiny_roberta_config"] = "hf"
__all__ += ["tiny_roberta_config"]

_EXPORTS.update({"CLIP": "clip", "CLIPEncoders": "clip", "tiny_clip_config": "clip"})
__all__ += ["CLIP", "CLIPEncoders", "tiny_clip_config"]
_EXPORTS.update(EHRGRU="ehr", EHRTransformer="ehr")
__all__ += ["EHRGRU", "EHRTransformer"]
_EXPORTS["EfficientNetB0"] = "efficientnet"
__all__ += ["EfficientNetB0"]
_EXPORTS["ResNet1dSE"] = "resnet1d"
__all__ += ["ResNet1dSE"]
