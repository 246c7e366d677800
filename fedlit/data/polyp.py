"""``FedPolyp``: Fed-Polyp, four colonoscopy polyp segmentation sets as four sites, read from image files.

The sites are the four sources gathered by Fan et al., "PraNet: Parallel Reverse Attention Network for Polyp
Segmentation", MICCAI 2020 (https://github.com/DengPingFan/PraNet): Kvasir-SEG (1000 images), CVC-ClinicDB
(612), CVC-ColonDB (380 in PraNet's download) and ETIS-LaribPolypDB (196). PraNet's download keeps its own
split: a ``TrainDataset`` mixing 900 Kvasir and 550 ClinicDB images, and a ``TestDataset`` folder per source
holding the rest (all of ColonDB and ETIS). Here every source is one client again and is split on its own.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import torch
from typing_extensions import override

from fedlit.core.errors import ConfigError, DataError
from fedlit.data.common.datamodule import FederatedDataModule
from fedlit.data.common.samples import SampleList, is_image
from fedlit.data.common.segmentation_pairs import decode_image, pair_augmentation
from fedlit.data.common.site_options import (
    check_site_names,
    find_sites,
    report_unmatched,
    segmentation_option_problems,
    site_rng,
)
from fedlit.data.common.splits import SPLITS, check_split_fractions, split_sizes

_OPTION = "data.init_args"
_SOURCE = (
    "Get PraNet's TrainDataset and TestDataset (Fan et al., \"PraNet: Parallel Reverse Attention Network for "
    'Polyp Segmentation", MICCAI 2020; download links in the README of https://github.com/DengPingFan/PraNet)'
)
# PraNet's TrainDataset mixes two sources, told apart by the file name: CVC-ClinicDB frames are numbered
# (1.png ... 612.png), Kvasir-SEG files carry non-numeric ids (cju0qkwl35piu0993l0dewei2.png).
_MIXED: dict[str, Callable[[str], bool]] = {"Kvasir": lambda stem: not stem.isdigit(), "CVC-ClinicDB": str.isdigit}


@dataclass(frozen=True)
class BinaryMaskImageFile:
    """Reads an ``[image, mask]`` pair of paths (relative to ``root``) as float tensors, resized to ``image_size``.

    The image becomes float32 (3, H, W) RGB in [0, 1] (bilinear, antialiased resize); the mask is read grey
    (PIL's luma for a colour file) and is 1 where the grey level exceeds ``threshold``, float32 (1, H, W)
    (nearest-neighbour resize, so it stays 0/1). ``image_size`` null keeps the files' size.

    Raises:
        DataError: naming the file when it is missing or cannot be decoded, or when image and mask differ in size.
    """

    root: str
    image_size: int | None = 352
    threshold: int = 127

    def __call__(self, identity: list[str] | tuple[str, str]) -> tuple[torch.Tensor, torch.Tensor]:
        from torchvision.transforms.v2 import InterpolationMode
        from torchvision.transforms.v2 import functional as TF

        image_path, mask_path = (Path(self.root) / p for p in identity)
        image = torch.from_numpy(decode_image(image_path, "RGB")).permute(2, 0, 1).float().div_(255.0)
        grey = decode_image(mask_path, "L")
        if grey.shape != tuple(image.shape[-2:]):
            raise DataError(
                f"{mask_path}: mask is {grey.shape[1]}x{grey.shape[0]} but its image {image_path} is "
                f"{image.shape[-1]}x{image.shape[-2]}; they must match"
            )
        mask = torch.from_numpy(grey > self.threshold)[None].float()
        if self.image_size is not None and tuple(image.shape[-2:]) != (self.image_size, self.image_size):
            size = [self.image_size, self.image_size]
            image = TF.resize(image, size, antialias=True).clamp_(0.0, 1.0)
            mask = TF.resize(mask, size, interpolation=InterpolationMode.NEAREST)
        return image.contiguous(), mask.contiguous()


class FedPolyp(FederatedDataModule):
    """Fed-Polyp: 4 sites of colonoscopy images (Kvasir, ETIS-LaribPolypDB, CVC-ColonDB, CVC-ClinicDB), polyp masks.

    The clients come in the order of the FedSCA paper's C1-C4 (Zhang et al., arXiv 2025): Kvasir, ETIS,
    ColonDB, ClinicDB, so per-client tables line up with its columns.

    Two layouts are read (the first when ``root`` holds ``TrainDataset`` or ``TestDataset``)::

        root/TrainDataset/{image,mask}/<name>.png            PraNet's download: the TrainDataset images of
        root/TestDataset/<site>/{images,masks}/<name>.png    Kvasir (non-numeric names) and CVC-ClinicDB
                                                             (numbered names) join that site's TestDataset
                                                             folder; CVC-ColonDB and ETIS-LaribPolypDB come
                                                             from TestDataset only
        root/<site>/{images,masks}/<name>.<ext>              one folder per site (``image``/``mask`` too)

    Image and mask are paired by file name without its extension (``a.jpg`` with ``a.png``). Each site's pairs
    are pooled and split (train, val, test) by ``split_fractions`` (8:0:2 by default), seeded by ``seed``:
    PraNet's own split is not kept, since two of the four sites exist only in its test folder. ``sites`` may
    name any other ``TestDataset`` folder (e.g. ``CVC-300``, not a site by default).

    Images are (3, H, W) RGB float in [0, 1], masks (1, H, W) float 0/1 (grey level > 127 = polyp), both
    resized to ``image_size`` x ``image_size`` (352 by default, PraNet's training and testing size; the sources
    differ in size and aspect, which the square resize does not keep).

    Args:
        root: the folder holding ``TrainDataset``/``TestDataset``, or one folder per site.
        sites: the sites to use, in this order (default: those of the four present under ``root``, in the
            order C1-C4 of FedSCA: Kvasir, ETIS-LaribPolypDB, CVC-ColonDB, CVC-ClinicDB).
        image_size: side of the square images and masks (bilinear for images, nearest for masks); null keeps each
            file's size (batches then need one size).
        split_fractions: (train, val, test) shares of each site's pairs.
        unmatched: ``error`` refuses an image without a mask of the same name (or the reverse), naming every such
            file; ``skip`` leaves them out with a warning and lists them in the manifest.
        augment: random horizontal and vertical flips of train pairs (image and mask together).
        crop_size: side of a random square window cut from every train pair (after resizing, before the flips);
            null = no crop. Validation and test pairs stay whole.
        batch_size: training batch size.
        eval_batch_size: val/test batch size (default ``batch_size``).
        num_workers: DataLoader worker processes decoding the images.
        seed: seed of the splits.
    """

    default_sites = ("Kvasir", "ETIS-LaribPolypDB", "CVC-ColonDB", "CVC-ClinicDB")  # FedSCA's C1-C4

    def __init__(
        self,
        *,
        root: str,
        sites: list[str] | None = None,
        image_size: int | None = 352,
        split_fractions: tuple[float, float, float] = (0.8, 0.0, 0.2),
        unmatched: Literal["error", "skip"] = "error",
        augment: bool = True,
        crop_size: int | None = None,
        batch_size: int = 8,
        eval_batch_size: int | None = None,
        num_workers: int = 0,
        seed: int = 0,
    ) -> None:
        super().__init__(batch_size=batch_size, eval_batch_size=eval_batch_size, num_workers=num_workers, seed=seed)
        problems = segmentation_option_problems(image_size, crop_size, unmatched)
        try:
            check_split_fractions(split_fractions, f"{_OPTION}.split_fractions")
        except ValueError as err:
            problems.append(str(err))
        if problems:
            raise ConfigError("; ".join(problems))
        if sites is not None:  # before any folder is looked at
            check_site_names(sites)
        self.root = Path(root).expanduser()
        layout = (
            f"{self.root}/TrainDataset/{{image,mask}}/*.png and {self.root}/TestDataset/<site>/{{images,masks}}"
            f"/*.png (PraNet's download), or {self.root}/<site>/{{images,masks}}/ (sites "
            f"{', '.join(self.default_sites)})"
        )
        self.pranet = (self.root / "TrainDataset").is_dir() or (self.root / "TestDataset").is_dir()
        self.sites = find_sites("FedPolyp", self.root, sites, self.default_sites, layout, _SOURCE, self._present)
        self.image_size, self.unmatched, self.augment, self.crop_size = image_size, unmatched, bool(augment), crop_size
        self.split_fractions = tuple(float(f) for f in split_fractions)

    @override
    def expected_num_clients(self) -> int | None:
        """One client per site of ``sites`` (known without reading an image)."""
        return len(self.sites) if self._data is None else super().expected_num_clients()

    @override
    def build_samples(self) -> SampleList:
        samples, splits, lost = {}, {}, []
        origins: dict[str, dict[str, int]] = {}
        built = self.sites_to_build(self.sites)  # a Flower node: its own site only
        for site in built:
            pairs, origins[site] = [], {}
            for images, masks, keep in self._folders(site):
                found, missing = _pairs(self.root, images, masks, keep)
                pairs += found
                lost += missing
                if found:
                    origins[site][images.parent.relative_to(self.root).as_posix()] = len(found)
            samples[site] = pairs
        report_unmatched("FedPolyp", lost, self.unmatched, "partner of the same name")
        needed = sum(f > 0 for f in self.split_fractions)
        few = [f"{site} ({len(samples[site])})" for site in built if len(samples[site]) < needed]
        if few:
            raise DataError(
                f"FedPolyp: sites {', '.join(few)} have fewer (image, mask) pairs under {self.root} than "
                f"the non-empty splits of {_OPTION}.split_fractions={self.split_fractions}; add pairs, or "
                f"leave those sites out with {_OPTION}.sites"
            )
        for site in built:
            order = site_rng(self.seed, site).permutation(len(samples[site]))  # a site's split depends on it alone
            bounds = np.cumsum([0, *split_sizes(len(samples[site]), self.split_fractions)])
            splits[site] = {split: np.sort(order[bounds[i] : bounds[i + 1]]) for i, split in enumerate(SPLITS)}
        train_transform = pair_augmentation(self.crop_size, self.augment)
        return SampleList(
            name="fed_polyp",
            task="segmentation",
            num_classes=1,
            samples=samples,
            # Segmentation has no per-sample class: the target is the mask the reader returns. These zeros only
            # give check_samples one finite value per sample.
            targets={site: torch.zeros(len(ids)) for site, ids in samples.items()},
            splits=splits,
            read=BinaryMaskImageFile(root=str(self.root), image_size=self.image_size),
            train_transform=train_transform,
            eval_transform=None,
            class_names=["polyp"],
            details={
                "root": str(self.root),
                "layout": "PraNet TrainDataset/TestDataset" if self.pranet else "one folder per site",
                "pairs_from": origins,
                "image_size": self.image_size,
                "crop_size": self.crop_size,
                "split_fractions": list(self.split_fractions),
                "mask_threshold": "grey > 127",
                "train_transform": repr(train_transform) if train_transform is not None else None,
                "unmatched_skipped": lost,
            },
        )

    def _present(self, site: str) -> bool:
        if not self.pranet:
            return (self.root / site).is_dir()
        mixed = site in _MIXED and (self.root / "TrainDataset").is_dir()
        return mixed or (self.root / "TestDataset" / site).is_dir()

    def _folders(self, site: str) -> list[tuple[Path, Path, Callable[[str], bool] | None]]:
        """(image folder, mask folder, which file names belong to ``site`` (``None``: all)) for every source."""
        if not self.pranet:
            folder = self.root / site
            return [(_first(folder, "images", "image"), _first(folder, "masks", "mask"), None)]
        folders: list[tuple[Path, Path, Callable[[str], bool] | None]] = []
        if site in _MIXED and (self.root / "TrainDataset").is_dir():
            train = self.root / "TrainDataset"
            folders.append((_first(train, "image", "images"), _first(train, "mask", "masks"), _MIXED[site]))
        test = self.root / "TestDataset" / site
        if test.is_dir():
            folders.append((_first(test, "images", "image"), _first(test, "masks", "mask"), None))
        return folders


def _first(folder: Path, *names: str) -> Path:
    """The first of ``folder/<name>`` that exists (the first name when none does)."""
    return next((folder / n for n in names if (folder / n).is_dir()), folder / names[0])


def _pairs(
    root: Path, images: Path, masks: Path, keep: Callable[[str], bool] | None
) -> tuple[list[list[str]], list[str]]:
    """[image, mask] paths (relative to ``root``) paired by name without extension, and the unmatched files."""

    def listing(folder: Path) -> dict[str, str]:
        files: dict[str, str] = {}
        if not folder.is_dir():
            return files
        for path in sorted(folder.iterdir()):
            if path.is_file() and is_image(path) and (keep is None or keep(path.stem)):
                if path.stem in files:
                    raise DataError(
                        f"{path} and {folder / files[path.stem]} share the name {path.stem!r}: a mask "
                        "could not tell which image it belongs to; remove one of them"
                    )
                files[path.stem] = path.name
        return files

    found, marks = listing(images), listing(masks)
    rel_images, rel_masks = images.relative_to(root).as_posix(), masks.relative_to(root).as_posix()
    pairs = [[f"{rel_images}/{found[s]}", f"{rel_masks}/{marks[s]}"] for s in sorted(found.keys() & marks.keys())]
    lost = [f"{rel_images}/{found[s]} (no mask)" for s in sorted(found.keys() - marks.keys())]
    lost += [f"{rel_masks}/{marks[s]} (no image)" for s in sorted(marks.keys() - found.keys())]
    return pairs, lost
