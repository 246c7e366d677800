"""The (image, mask) pairs of the segmentation sites: :class:`MaskedImageFile` reads a pair of files as tensors
(:func:`decode_image` decodes one file), and :class:`PairRandomCrop` and :class:`PairFlip` (composed by
:func:`pair_augmentation`) crop and flip image and mask alike at train time. Shared by ``FedProstateSlices``,
``FedFundus``, ``FedPolyp`` and ``FedProstateVolumes``."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn
from typing_extensions import override

from fedlit.core.errors import DataError
from fedlit.data.common.samples import Compose, image_errors, unreadable_image

__all__ = ["MaskedImageFile", "PairFlip", "PairRandomCrop", "decode_image", "pair_augmentation"]

_OPTION = "data.init_args"


@dataclass(frozen=True)
class MaskedImageFile:
    """Reads an ``[image, mask]`` pair of paths (relative to ``root``) as float tensors, resized to ``image_size``.

    The image becomes float32 (``channels``, H, W) in [0, 1] (bilinear, antialiased resize). The mask is read as
    grey levels (an RGB mask must have three equal channels), every level must be one of ``allowed_levels``, and
    channel ``k`` of the float32 (len(``channel_levels``), H, W) mask is 1 where the level is one of
    ``channel_levels[k]`` (nearest-neighbour resize, so it stays 0/1).

    Raises:
        DataError: naming the file when it is missing, cannot be decoded, or (masks) holds another level.
    """

    root: str
    channels: int
    channel_levels: tuple[tuple[int, ...], ...]
    allowed_levels: tuple[int, ...]
    image_size: int | None = None

    def __call__(self, identity: list[str] | tuple[str, str]) -> tuple[torch.Tensor, torch.Tensor]:
        from torchvision.transforms.v2 import InterpolationMode
        from torchvision.transforms.v2 import functional as TF

        image_path, mask_path = (Path(self.root) / p for p in identity)
        image = torch.from_numpy(decode_image(image_path, "L" if self.channels == 1 else "RGB")).float().div_(255.0)
        image = image[None] if image.ndim == 2 else image.permute(2, 0, 1)
        levels = decode_image(mask_path, None)
        if levels.ndim == 3:
            if not ((levels[..., 0] == levels[..., 1]) & (levels[..., 0] == levels[..., 2])).all():
                raise DataError(f"{mask_path}: a colour mask needs three equal channels (grey levels); replace it")
            levels = levels[..., 0]
        found = np.unique(levels)
        bad = [int(v) for v in found if v not in self.allowed_levels]
        if bad:
            raise DataError(
                f"{mask_path}: mask levels {bad[:5]} are not among the expected "
                f"{list(self.allowed_levels)}; fix the mask (interpolation or JPEG compression may have "
                "blurred it)"
            )
        if levels.shape != tuple(image.shape[-2:]):
            raise DataError(
                f"{mask_path}: mask is {levels.shape[1]}x{levels.shape[0]} but its image {image_path} is "
                f"{image.shape[-1]}x{image.shape[-2]}; they must match"
            )
        mask = torch.stack([torch.from_numpy(np.isin(levels, chosen)) for chosen in self.channel_levels]).float()
        if self.image_size is not None and tuple(image.shape[-2:]) != (self.image_size, self.image_size):
            size = [self.image_size, self.image_size]
            image = TF.resize(image, size, antialias=True).clamp_(0.0, 1.0)
            mask = TF.resize(mask, size, interpolation=InterpolationMode.NEAREST)
        return image.contiguous(), mask.contiguous()


def decode_image(path: Path, mode: str | None) -> np.ndarray:
    """The 8-bit pixels of the image file ``path`` in PIL ``mode`` (``None``: RGB for colour files, else grey).

    Raises:
        DataError: naming the file when it is missing or PIL cannot decode it.
    """
    from PIL import Image

    try:
        with Image.open(path) as image:
            if mode is None:
                mode = "RGB" if image.mode in ("RGB", "RGBA", "P") else "L"
            return np.array(image.convert(mode), dtype=np.uint8)
    except FileNotFoundError:
        raise DataError(f"{path}: file not found (it was listed when the data set was built); restore it") from None
    except image_errors() as err:
        raise unreadable_image(path, err) from None


class PairFlip(nn.Module):
    """Random horizontal and vertical flips applied to an ``(image, mask)`` pair alike.

    Draws from torch's global generator, which the federated loop seeds per round and client (and each
    DataLoader worker from the loader's generator), so a run with the same seed sees the same flips.
    """

    def __init__(self, horizontal: float = 0.5, vertical: float = 0.5) -> None:
        super().__init__()
        self.horizontal, self.vertical = float(horizontal), float(vertical)

    @override
    def forward(self, pair: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        image, mask = pair
        draws = torch.rand(2)
        if draws[0] < self.horizontal:
            image, mask = image.flip(-1), mask.flip(-1)
        if draws[1] < self.vertical:
            image, mask = image.flip(-2), mask.flip(-2)
        return image, mask

    @override
    def extra_repr(self) -> str:
        return f"horizontal={self.horizontal}, vertical={self.vertical}"


class PairRandomCrop(nn.Module):
    """A random ``size`` x ``size`` window cut from an ``(image, mask)`` pair at the same place.

    The corner is drawn from torch's global generator, as :class:`PairFlip` draws its flips: the federated loop
    seeds it per round and client, and each DataLoader worker is seeded from the loader's generator, so a run
    with the same seed sees the same crops while every epoch (a new draw of the worker seeds) sees new ones.

    Raises:
        DataError: when the pair is smaller than ``size`` on a side (the option and the fix are named).
    """

    def __init__(self, size: int) -> None:
        super().__init__()
        self.size = int(size)

    @override
    def forward(self, pair: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        image, mask = pair
        height, width = image.shape[-2:]
        if height < self.size or width < self.size:
            raise DataError(
                f"{_OPTION}.crop_size={self.size} is larger than a train image of {width}x{height}; "
                f"lower crop_size or set {_OPTION}.image_size to at least {self.size}"
            )
        top = int(torch.randint(0, height - self.size + 1, (1,)))
        left = int(torch.randint(0, width - self.size + 1, (1,)))
        window = (..., slice(top, top + self.size), slice(left, left + self.size))
        return image[window].contiguous(), mask[window].contiguous()

    @override
    def extra_repr(self) -> str:
        return f"size={self.size}"


def pair_augmentation(crop_size: int | None, flip: bool) -> nn.Module | None:
    """The train-time transform of the segmentation sites: a random crop (if ``crop_size``), then random flips
    (if ``flip``), applied to image and mask alike; ``None`` when neither is asked for."""
    parts: list[nn.Module] = ([PairRandomCrop(crop_size)] if crop_size is not None else []) + (
        [PairFlip()] if flip else []
    )
    if not parts:
        return None
    return parts[0] if len(parts) == 1 else Compose(parts)
