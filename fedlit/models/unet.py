"""Dense networks for segmentation: specs whose ``build(out_channels)`` returns a module mapping (B, C_in, H, W)
images to (B, out_channels, H, W) logits.

- :class:`TinyUNet`: a small U-Net (Ronneberger, Fischer, Brox, "U-Net: Convolutional Networks for Biomedical
  Image Segmentation", MICCAI 2015) written here, for quick runs on small images;
- :class:`SmpUnet`: segmentation-models-pytorch's ``Unet`` with a named encoder (``resnet18``...), randomly
  initialized: nothing downloads.
"""

from __future__ import annotations

import inspect
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Literal

import torch
from torch import Tensor, nn
from typing_extensions import override

from fedlit.core.errors import ConfigError


class SegmentationNetwork(ABC):
    """Base of the dense-network specs. Subclasses store each constructor argument under its own name."""

    @abstractmethod
    def build(self, out_channels: int) -> nn.Module:
        """A new module: forward((B, C_in, H, W) images) -> (B, out_channels, H, W) logits."""

    @override
    def __repr__(self) -> str:
        names = list(inspect.signature(type(self).__init__).parameters)[1:]
        return f"{type(self).__name__}({', '.join(f'{n}={getattr(self, n)!r}' for n in names)})"


def _positive_ints(owner: str, **values: object) -> None:
    problems = [
        f"model.init_args.network.init_args.{name} must be an integer >= 1, got {value!r}"
        for name, value in values.items()
        if isinstance(value, bool) or not isinstance(value, int) or value < 1
    ]
    if problems:
        raise ConfigError(f"{owner}: " + "; ".join(problems) + ".")


class TinyUNet(SegmentationNetwork):
    """A small U-Net: ``depth`` 2x2 poolings down and transposed convolutions up, with skip connections.

    Level i has ``width * 2**i`` channels and two conv 3x3 -> norm -> ReLU layers; a 1x1 convolution gives the
    logits. Parameters are named ``down.<i>.*``, ``bottom.*``, ``up.<i>.*``, ``merge.<i>.*`` and ``head.*``.
    Image height and width must be multiples of ``2**depth``. Randomly initialized.

    ``norm``: ``batch`` (BatchNorm2d, whose running statistics FedAvg averages over sites and FedBN keeps
    personal) or ``instance`` (InstanceNorm2d with affine weights: each image is normalized by itself, which
    removes a site's intensity offset and contrast and keeps no running statistics).

    Args:
        in_channels: Channels of the input images.
        width: Channels of the first level.
        depth: Number of poolings (levels below the first).
        norm: ``batch`` or ``instance``.
    """

    def __init__(
        self, *, in_channels: int = 1, width: int = 8, depth: int = 2, norm: Literal["batch", "instance"] = "batch"
    ) -> None:
        _positive_ints("TinyUNet", in_channels=in_channels, width=width, depth=depth)
        if norm not in _NORMS:
            raise ConfigError(
                f"TinyUNet: model.init_args.network.init_args.norm={norm!r} is not one of {list(_NORMS)}."
            )
        self.in_channels, self.width, self.depth, self.norm = in_channels, width, depth, norm

    @override
    def build(self, out_channels: int) -> nn.Module:
        return _TinyUNet(self.in_channels, out_channels, self.width, self.depth, _NORMS[self.norm])


_NORMS: dict[str, Callable[[int], nn.Module]] = {
    "batch": nn.BatchNorm2d,
    "instance": lambda channels: nn.InstanceNorm2d(channels, affine=True),
}


def _double_conv(c_in: int, c_out: int, norm: Callable[[int], nn.Module]) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(c_in, c_out, 3, padding=1, bias=False),
        norm(c_out),
        nn.ReLU(inplace=True),
        nn.Conv2d(c_out, c_out, 3, padding=1, bias=False),
        norm(c_out),
        nn.ReLU(inplace=True),
    )


class _TinyUNet(nn.Module):
    def __init__(
        self, in_channels: int, out_channels: int, width: int, depth: int, norm: Callable[[int], nn.Module]
    ) -> None:
        super().__init__()
        channels = [width * 2**i for i in range(depth + 1)]
        inputs = [in_channels, *channels[:-2]]
        self.down = nn.ModuleList(_double_conv(c_in, c, norm) for c_in, c in zip(inputs, channels[:-1], strict=True))
        self.bottom = _double_conv(channels[-2], channels[-1], norm)
        self.up = nn.ModuleList(
            nn.ConvTranspose2d(channels[i + 1], channels[i], 2, stride=2) for i in reversed(range(depth))
        )
        self.merge = nn.ModuleList(_double_conv(2 * channels[i], channels[i], norm) for i in reversed(range(depth)))
        self.head = nn.Conv2d(channels[0], out_channels, 1)
        self.pool = nn.MaxPool2d(2)
        self.multiple = 2**depth

    @override
    def forward(self, x: Tensor) -> Tensor:
        if x.shape[-1] % self.multiple or x.shape[-2] % self.multiple:
            raise ConfigError(
                f"TinyUNet with depth {len(self.down)} needs image sides that are multiples of "
                f"{self.multiple}, got {tuple(x.shape[-2:])}; resize the images or lower depth"
            )
        skips = []
        for block in self.down:
            x = block(x)
            skips.append(x)
            x = self.pool(x)
        x = self.bottom(x)
        for up, merge, skip in zip(self.up, self.merge, reversed(skips), strict=True):
            x = merge(torch.cat([up(x), skip], dim=1))
        return self.head(x)


class SmpUnet(SegmentationNetwork):
    """segmentation-models-pytorch's ``Unet`` (or another of its architectures) with a randomly initialized
    encoder; the weights come from a fedlit checkpoint, never from a download.

    Args:
        arch: An architecture of segmentation-models-pytorch (``Unet``, ``UnetPlusPlus``, ``FPN``...).
        encoder_name: Its encoder (``resnet18``, ``resnet34``, ``efficientnet-b0``...).
        encoder_depth: Encoder stages (3 to 5); image sides must be multiples of ``2**encoder_depth``.
        encoder_weights: Must be None: fedlit downloads nothing (load weights from a checkpoint instead).
        in_channels: Channels of the input images.
    """

    def __init__(
        self,
        *,
        arch: str = "Unet",
        encoder_name: str = "resnet18",
        encoder_depth: int = 5,
        encoder_weights: str | None = None,
        in_channels: int = 1,
    ) -> None:
        if encoder_weights is not None:
            raise ConfigError(
                f"model.init_args.network.init_args.encoder_weights={encoder_weights!r}: nothing "
                "downloads in fedlit; set it to null (random initialization) and load trained "
                "weights from a checkpoint."
            )
        _positive_ints("SmpUnet", encoder_depth=encoder_depth, in_channels=in_channels)
        self.arch, self.encoder_name, self.encoder_depth = arch, encoder_name, encoder_depth
        self.encoder_weights, self.in_channels = encoder_weights, in_channels

    @override
    def build(self, out_channels: int) -> nn.Module:
        import segmentation_models_pytorch as smp

        kwargs = {
            "encoder_name": self.encoder_name,
            "encoder_depth": self.encoder_depth,
            "encoder_weights": None,
            "in_channels": self.in_channels,
            "classes": out_channels,
        }
        if self.arch in ("Unet", "UnetPlusPlus"):  # one decoder block per encoder stage
            kwargs["decoder_channels"] = [256, 128, 64, 32, 16][5 - self.encoder_depth :]
        try:
            return smp.create_model(self.arch, **kwargs)
        except (KeyError, ValueError) as error:
            raise ConfigError(
                f"SmpUnet(arch={self.arch!r}, encoder_name={self.encoder_name!r}): {error}; see "
                "segmentation-models-pytorch's lists of architectures and encoders."
            ) from error
