"""EfficientNet-B0 (Tan and Le, "EfficientNet: Rethinking Model Scaling for Convolutional Neural Networks", ICML
2019) as a headless backbone, with BatchNorm or GroupNorm: the image model of the FedPxN paper's skin cancer
benchmark (Yang et al., "Towards the Practical Utility of Federated Learning in the Medical Domain", CHIL 2023)."""

from __future__ import annotations

import logging
import os
import warnings
from pathlib import Path
from typing import Literal

from torch import Tensor, nn
from typing_extensions import override

from fedlit.core.errors import ConfigError, InputFileError
from fedlit.models.backbones import Backbone
from fedlit.models.norms import check_norm, swap_norms
from fedlit.models.pretrained import load_checkpoint

__all__ = ["EFFICIENTNET_B0_CHANNELS", "EfficientNetB0"]

_log = logging.getLogger(__name__)

#: The channels of EfficientNet-B0's normalization layers: ``groups`` must divide each (1, 2, 4 or 8).
EFFICIENTNET_B0_CHANNELS = (16, 24, 32, 40, 80, 96, 112, 144, 192, 240, 320, 480, 672, 1152, 1280)


class EfficientNetB0(Backbone):
    """torchvision's ``efficientnet_b0`` without its classifier: features -> global average pool -> dropout,
    (B, 1280) features for the task's head.

    Nothing downloads: the network is randomly initialized (with a ``UserWarning``), or loaded from ``weights``, a
    local file. torchvision's ImageNet checkpoint (``efficientnet_b0_rwightman-7f5810bc.pth``) loads by name; a
    checkpoint of ``efficientnet_pytorch`` (the FedPxN authors' ``EfficientNet.from_pretrained('efficientnet-b0')``)
    loads by position (``key_mapping: position``: both list the same tensors in the same order). The checkpoint's
    classifier is dropped.

    ``norm: group`` replaces every BatchNorm by ``GroupNorm(groups, channels)`` after the weights are loaded, each
    starting from the BatchNorm's affine weights (:func:`fedlit.models.norms.swap_norms`); the FedPxN authors' GroupNorm
    EfficientNet-B0 has 2 groups per layer. Parameter names are torchvision's (``features.<stage>...``), so FedBN,
    SiloBN and FedPxN find the normalization layers of either kind.

    Args:
        weights: A local checkpoint (``.pth``, ``.pt``, ``.bin``, ``.ckpt``, ``.safetensors``), or None: random.
        key_mapping: Match checkpoint tensors to the model's by ``name`` or by ``position``.
        norm: ``batch`` (torchvision's BatchNorm) or ``group`` (GroupNorm).
        groups: Groups of ``norm: group``; must divide every layer's channels (1, 2, 4 or 8).
        dropout: Dropout on the pooled features (torchvision's classifier has 0.2).
    """

    def __init__(
        self,
        *,
        weights: str | os.PathLike | None = None,
        key_mapping: Literal["name", "position"] = "name",
        norm: Literal["batch", "group"] = "batch",
        groups: int = 2,
        dropout: float = 0.2,
    ) -> None:
        problems = []
        if norm not in ("batch", "group"):
            problems.append(f"norm must be one of ['batch', 'group'], got {norm!r}")
        else:
            problems += check_norm(norm, groups, EFFICIENTNET_B0_CHANNELS)
        if key_mapping not in ("name", "position"):
            problems.append(f"key_mapping must be one of ['name', 'position'], got {key_mapping!r}")
        if isinstance(dropout, bool) or not isinstance(dropout, int | float) or not 0 <= dropout < 1:
            problems.append(f"dropout must be in [0, 1), got {dropout!r}")
        if problems:
            raise ConfigError("EfficientNetB0: " + "; ".join(problems))
        self.weights = None if weights is None else Path(weights).expanduser()
        self.key_mapping = key_mapping
        self.norm = norm
        self.groups = groups
        self.dropout = float(dropout)

    @override
    def build(self) -> nn.Module:
        """Build the network, load ``weights``, then swap the normalization layers.

        Raises:
            InputFileError: If ``weights`` is not a file (the message shows the path tried).
        """
        from torchvision.models import efficientnet_b0

        model = _Features(efficientnet_b0(weights=None).features, self.dropout)
        if self.weights is None:
            warnings.warn(
                "EfficientNetB0: no weights given, so the backbone is randomly initialized (fedlit never downloads "
                "weights; set weights to a local file, e.g. torchvision's efficientnet_b0_rwightman-7f5810bc.pth)",
                UserWarning,
                stacklevel=2,
            )
        else:
            if not self.weights.is_file():
                raise InputFileError(
                    f"EfficientNetB0: weights={str(self.weights)!r} is not a file (tried {self.weights.resolve()}); "
                    "give the path of a local weight file"
                )
            report = load_checkpoint(model, self.weights, key_mapping=self.key_mapping)
            if report.missing or report.unexpected:
                warnings.warn(f"EfficientNetB0: {report.summary()}", UserWarning, stacklevel=2)
            else:
                _log.info("EfficientNetB0: %s", report.summary())
        return swap_norms(model, self.norm, groups=self.groups)


class _Features(nn.Module):
    def __init__(self, features: nn.Module, dropout: float) -> None:
        super().__init__()
        self.features = features
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.dropout = nn.Dropout(dropout)
        self.num_features = 1280

    @override
    def forward(self, inputs: Tensor) -> Tensor:
        return self.dropout(self.avgpool(self.features(inputs)).flatten(1))
