"""A 1-D ResNet with squeeze-and-excitation for 12-lead ECGs: the ECG model of the FedPxN paper.

Yang et al., "Towards the Practical Utility of Federated Learning in the Medical Domain" (CHIL 2023) train, on the
PhysioNet/CinC 2021 ECGs, the "ResNet-NC-SE" of torch_ecg (Wen and Kang, "Hybrid Arrhythmia Detection on Varying-
Dimensional Electrocardiography: Combining Deep Neural Networks and Clinical Rules", CinC 2021; the authors' code
builds torch_ecg's ``resnet_nature_comm_bottle_neck_se``): the residual network of Ribeiro et al. ("Automatic
diagnosis of the 12-lead ECG using a deep neural network", Nature Communications 2020) with bottleneck blocks and
a squeeze-and-excitation gate (Hu et al., "Squeeze-and-Excitation Networks", CVPR 2018) closing each block:

- stem: Conv1d(leads -> 64, kernel 17) -> norm -> ReLU (stride 1, no pooling);
- four stages of one bottleneck block each, widths 128, 192, 256, 320, expansion 4 (outputs 512 ... 1280),
  stride 4 at the middle convolution (kernel 17): Conv1x1 -> norm -> ReLU -> dropout -> Conv17/4 -> norm -> ReLU
  -> dropout -> Conv1x1 -> norm -> SE (reduction 8) -> + shortcut (Conv1x1/4 -> norm) -> ReLU -> dropout (0.2);
- global max pooling over time -> (B, 1280) features; the task adds the linear classifier.

``norm`` picks the normalization layers (:mod:`fedlit.models.norms`): ``batch`` (the paper's "resnet") or
``group`` with ``groups`` groups (the paper's "resnet_gn" swaps every BatchNorm for ``GroupNorm(2, C)``), or
``layer``. Convolutions are bias-free and He-initialized, as torch_ecg's.

Convolutions pad ``kernel // 2``, so a stage of stride ``s`` turns ``L`` samples into ``ceil(L / s)``: a 5-s
segment at 500 Hz (2500 samples) leaves 10 time steps for the pooling.
"""

from __future__ import annotations

from collections import OrderedDict

from torch import Tensor, nn
from typing_extensions import override

from fedlit.core.errors import ConfigError
from fedlit.models.backbones import Backbone
from fedlit.models.norms import NormKind, check_norm, norm_layer

__all__ = ["ResNet1dSE", "SqueezeExcitation1d"]


def _positive(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


class ResNet1dSE(Backbone):
    """The paper's 1-D ResNet with squeeze-and-excitation (module docstring); inputs (B, leads, samples).

    Args:
        in_channels: Input leads.
        stem_width: Channels of the stem convolution.
        widths: Bottleneck width of each stage (its output has ``widths[i] * expansion`` channels).
        blocks: Bottleneck blocks of each stage (the first one strides).
        kernel_size: Kernel of the stem and of the middle convolution of each block (odd).
        stride: Downsampling of each stage.
        expansion: Output channels per bottleneck channel.
        se_reduction: Squeeze-and-excitation bottleneck ratio.
        dropout: Dropout after the first two convolutions and at the end of each block.
        norm: ``batch``, ``group`` or ``layer`` (:mod:`fedlit.models.norms`).
        groups: Groups of ``norm: group``; must divide every normalized layer's channels.
    """

    def __init__(
        self,
        *,
        in_channels: int = 12,
        stem_width: int = 64,
        widths: list[int] | None = None,
        blocks: list[int] | None = None,
        kernel_size: int = 17,
        stride: int = 4,
        expansion: int = 4,
        se_reduction: int = 8,
        dropout: float = 0.2,
        norm: NormKind = "batch",
        groups: int = 2,
    ) -> None:
        widths = [128, 192, 256, 320] if widths is None else list(widths)
        blocks = [1] * len(widths) if blocks is None else list(blocks)
        problems = []
        for name, value in (
            ("in_channels", in_channels),
            ("stem_width", stem_width),
            ("stride", stride),
            ("expansion", expansion),
            ("se_reduction", se_reduction),
        ):
            if not _positive(value):
                problems.append(f"{name} must be an integer >= 1, got {value!r}")
        if not _positive(kernel_size) or kernel_size % 2 == 0:
            problems.append(f"kernel_size must be an odd integer >= 1, got {kernel_size!r}")
        if not widths or not all(_positive(w) for w in widths):
            problems.append(f"widths must be a non-empty list of integers >= 1, got {widths!r}")
        elif len(blocks) != len(widths) or not all(_positive(b) for b in blocks):
            problems.append(f"blocks must be {len(widths)} integers >= 1 (one per stage of widths), got {blocks!r}")
        if isinstance(dropout, bool) or not isinstance(dropout, int | float) or not 0 <= dropout < 1:
            problems.append(f"dropout must be in [0, 1), got {dropout!r}")
        if not problems:
            channels = [stem_width, *widths, *(w * expansion for w in widths)]
            if norm not in ("batch", "group", "layer"):
                problems.append(f"norm must be one of ['batch', 'group', 'layer'], got {norm!r}")
            else:
                problems += check_norm(norm, groups, channels)
            if any(w * expansion // se_reduction < 1 for w in widths if _positive(se_reduction)):
                problems.append(f"se_reduction={se_reduction} leaves no channel in the smallest gate")
        if problems:
            raise ConfigError("ResNet1dSE: " + "; ".join(problems))
        self.in_channels, self.stem_width, self.widths, self.blocks = in_channels, stem_width, widths, blocks
        self.kernel_size, self.stride, self.expansion, self.se_reduction = kernel_size, stride, expansion, se_reduction
        self.dropout, self.norm, self.groups = float(dropout), norm, groups

    @override
    def build(self) -> nn.Module:
        """Build the network (He-initialized convolutions)."""
        return _ResNet1dSE(self)


class SqueezeExcitation1d(nn.Module):
    """Channel gate of Hu et al.: mean over time -> Linear(C, C / r) -> ReLU -> Linear(C / r, C) -> sigmoid."""

    def __init__(self, channels: int, reduction: int) -> None:
        super().__init__()
        self.fc = nn.Sequential(
            nn.Linear(channels, channels // reduction),
            nn.ReLU(inplace=True),
            nn.Linear(channels // reduction, channels),
            nn.Sigmoid(),
        )

    @override
    def forward(self, x: Tensor) -> Tensor:
        return x * self.fc(x.mean(dim=-1)).unsqueeze(-1)


def _conv_norm(spec: ResNet1dSE, cin: int, cout: int, kernel: int, stride: int) -> OrderedDict[str, nn.Module]:
    conv = nn.Conv1d(cin, cout, kernel, stride=stride, padding=kernel // 2, bias=False)
    nn.init.kaiming_normal_(conv.weight)
    return OrderedDict(conv=conv, norm=norm_layer(spec.norm, cout, dims=1, groups=spec.groups))


class _Bottleneck(nn.Module):
    def __init__(self, spec: ResNet1dSE, cin: int, width: int, stride: int) -> None:
        super().__init__()
        cout = width * spec.expansion
        self.head = nn.Sequential(_conv_norm(spec, cin, width, 1, 1))
        self.neck = nn.Sequential(_conv_norm(spec, width, width, spec.kernel_size, stride))
        self.tail = nn.Sequential(_conv_norm(spec, width, cout, 1, 1))
        self.se = SqueezeExcitation1d(cout, spec.se_reduction)
        self.shortcut = (
            nn.Sequential(_conv_norm(spec, cin, cout, 1, stride)) if stride > 1 or cin != cout else nn.Identity()
        )
        self.act = nn.ReLU(inplace=True)
        self.drop = nn.Dropout(spec.dropout)

    @override
    def forward(self, x: Tensor) -> Tensor:
        out = self.drop(self.act(self.head(x)))
        out = self.drop(self.act(self.neck(out)))
        out = self.se(self.tail(out))
        return self.drop(self.act(out + self.shortcut(x)))


class _ResNet1dSE(nn.Module):
    def __init__(self, spec: ResNet1dSE) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            OrderedDict(
                **_conv_norm(spec, spec.in_channels, spec.stem_width, spec.kernel_size, 1), act=nn.ReLU(inplace=True)
            )
        )
        stages, cin = [], spec.stem_width
        for width, count in zip(spec.widths, spec.blocks, strict=True):
            layers = []
            for b in range(count):
                layers.append(_Bottleneck(spec, cin, width, spec.stride if b == 0 else 1))
                cin = width * spec.expansion
            stages.append(nn.Sequential(*layers))
        self.stages = nn.Sequential(*stages)
        self.in_channels = spec.in_channels
        self.num_features = cin

    @override
    def forward(self, inputs: Tensor) -> Tensor:
        if inputs.ndim != 3 or inputs.shape[1] != self.in_channels:
            raise ValueError(
                f"ResNet1dSE expects inputs (B, {self.in_channels}, samples), got {tuple(inputs.shape)}; set "
                "in_channels to the number of leads"
            )
        return self.stages(self.stem(inputs)).amax(dim=-1)
