"""Backbone builders (timm, transformers, small nets) and adapters (peft LoRA) for fedlit.

A backbone is configured by a spec (`TimmBackbone`, `HFEncoder`, `SmallCNN`, `Identity`) whose `build()`
returns a module with `num_features` that maps inputs to (B, num_features) features. Nothing downloads:
weights come from local files, or by name from the registry packages fedlit knows (`PRETRAINED`: recipes say
`weights: efficientnet_lite0` or `weights: minilm_l6_v2`; `resolve_weights(name)` gives the path).
"""

from fedlit.models import tiny  # noqa: F401 - registers the fedlit_test_* models in timm
from fedlit.models.backbones import MLP, Backbone, Identity, SmallCNN, TimmBackbone
from fedlit.models.checkpoints import LoadReport, load_checkpoint, read_state_dict
from fedlit.models.hf import HFEncoder, TransformersEncoder, tiny_bert_config
from fedlit.models.lora import LoRA
from fedlit.models.registry import list_models, register_model
from fedlit.models.weights import (
    PRETRAINED,
    PretrainedWeights,
    efficientnet_lite0_weights,
    minilm_l6_v2_folder,
    resolve_weights,
)

__all__ = [
    "PRETRAINED",
    "Backbone",
    "HFEncoder",
    "Identity",
    "LoRA",
    "MLP",
    "PretrainedWeights",
    "LoadReport",
    "SmallCNN",
    "TimmBackbone",
    "TransformersEncoder",
    "efficientnet_lite0_weights",
    "list_models",
    "load_checkpoint",
    "minilm_l6_v2_folder",
    "read_state_dict",
    "register_model",
    "resolve_weights",
    "tiny_bert_config",
]
