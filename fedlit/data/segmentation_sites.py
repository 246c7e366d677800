"""Segmentation sites read from files: ``FedProstateSlices`` (Fed-Prostate) and ``FedFundus`` (Fed-Fundus).

Both keep each site as a client with its own ``train``/``test`` folders (or, with ``split_fractions``, pool a
site's two folders and split them again), and pair every image with the mask of the
same file name. Images and masks are decoded in the DataLoader workers by :class:`MaskedImageFile`, which returns
an ``(image, mask)`` pair: the sample's target is its mask, and train-time augmentation (:class:`PairRandomCrop`,
:class:`PairFlip`) crops and flips image and mask together (all three in :mod:`fedlit.data.common.segmentation_pairs`,
importable from here too). The option checks, the augmentation and the handling of unmatched files are shared with
the other segmentation sites (``FedProstateVolumes``, ``FedPolyp``).
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Literal

import numpy as np
import torch
from typing_extensions import override

from fedlit.core.errors import ConfigError, DataError
from fedlit.data.common.datamodule import FederatedDataModule
from fedlit.data.common.samples import SampleList, is_image
from fedlit.data.common.segmentation_pairs import (
    MaskedImageFile,
    PairFlip,
    PairRandomCrop,
    decode_image,
    pair_augmentation,
)
from fedlit.data.common.site_options import (
    PROSTATE_SAME_SITE,
    PROSTATE_SITES,
    find_sites,
    report_unmatched,
    segmentation_option_problems,
    site_rng,
)
from fedlit.data.common.splits import SPLITS, check_split_fractions, split_sizes

# The pair reading and augmentation live in fedlit.data.common.segmentation_pairs; their names stay importable here.
__all__ = [
    "FedFundus",
    "FedProstateSlices",
    "MaskedImageFile",
    "PairFlip",
    "PairRandomCrop",
    "decode_image",
    "pair_augmentation",
]

_OPTION = "data.init_args"


class _SegmentationSites(FederatedDataModule):
    """Sites of (image, mask) PNG pairs in their own train/test folders; subclasses fix the layout and levels."""

    dataset: str
    default_root: str
    image_dir: str  # relative to root/<site>/<split>
    mask_dir: str
    channels: int
    channel_levels: tuple[tuple[int, ...], ...]
    allowed_levels: tuple[int, ...]
    mask_names: list[str]
    source: str
    default_sites: tuple[str, ...] = ()
    same_site: dict[str, str] | None = None  # a site's other folder names (Fed-Prostate's ISBI = RUNMC)

    def __init__(
        self,
        *,
        root: str,
        image_size: int | None = 384,
        sites: list[str] | None = None,
        unmatched: Literal["error", "skip"] = "error",
        val_fraction: float = 0.0,
        split_fractions: tuple[float, float, float] | None = None,
        augment: bool = True,
        crop_size: int | None = None,
        sites_without_train: Literal["error", "evaluate"] = "error",
        batch_size: int = 8,
        eval_batch_size: int | None = None,
        num_workers: int = 0,
        seed: int = 0,
    ) -> None:
        super().__init__(batch_size=batch_size, eval_batch_size=eval_batch_size, num_workers=num_workers, seed=seed)
        problems = segmentation_option_problems(image_size, crop_size, unmatched)
        if sites_without_train not in ("error", "evaluate"):
            problems.append(f"{_OPTION}.sites_without_train must be 'error' or 'evaluate', got {sites_without_train!r}")
        if isinstance(val_fraction, bool) or not isinstance(val_fraction, int | float) or not 0 <= val_fraction < 1:
            problems.append(f"{_OPTION}.val_fraction must be in [0, 1), got {val_fraction!r}")
        if split_fractions is not None:
            try:
                check_split_fractions(split_fractions, f"{_OPTION}.split_fractions")
            except ValueError as err:
                problems.append(str(err))
            if val_fraction:
                problems.append(
                    f"{_OPTION}.val_fraction={val_fraction!r} and {_OPTION}.split_fractions are both "
                    "given; split_fractions sets the validation share itself, drop val_fraction"
                )
        if problems:
            raise ConfigError("; ".join(problems))
        self.root = Path(root).expanduser()
        layout = (
            f"{self.root}/<site>/{{train,test}}/{self.image_dir}/*.png with masks of the same name in "
            f"{self.mask_dir}/ (sites {', '.join(self.default_sites)})"
        )
        self.sites = find_sites(
            type(self).__name__,
            self.root,
            sites,
            self.default_sites,
            layout,
            self.source,
            same_site=self.same_site,
            warn_others=self.same_site is not None,
        )  # prostate
        self.image_size, self.unmatched = image_size, unmatched
        self.val_fraction, self.augment, self.crop_size = float(val_fraction), bool(augment), crop_size
        self.sites_without_train = sites_without_train
        self.split_fractions = None if split_fractions is None else tuple(float(f) for f in split_fractions)

    @override
    def expected_num_clients(self) -> int | None:
        """One client per site of ``sites`` (known without reading an image)."""
        return len(self.sites) if self._data is None else super().expected_num_clients()

    @override
    def build_samples(self) -> SampleList:
        samples, splits, unmatched = {}, {}, []
        built = self.sites_to_build(self.sites)  # a Flower node: its own site only
        for site in built:
            pairs: dict[str, list[list[str]]] = {}
            for split in ("train", "test"):
                pairs[split], lost = self._pairs(site, split)
                unmatched += lost
            samples[site] = pairs["train"] + pairs["test"]
            splits[site] = self._split(site, len(pairs["train"]), len(samples[site]))
        report_unmatched(type(self).__name__, unmatched, self.unmatched)
        untrained = [site for site in built if len(splits[site]["train"]) == 0 and len(splits[site]["test"])]
        if self.sites_without_train == "evaluate" and untrained:
            warnings.warn(
                f"{type(self).__name__}: {', '.join(untrained)} {'has' if len(untrained) == 1 else 'have'} "
                f"no (image, mask) pair to train on under {self.root}"
                f"{' after skipping the unmatched files' if unmatched else ''}: evaluated every round "
                "with the model a new client receives, never trained "
                f"({_OPTION}.sites_without_train=evaluate)",
                stacklevel=2,
            )
        evaluated = set(untrained) if self.sites_without_train == "evaluate" else set()
        empty = [
            f"{site}/{split}"
            for site in built
            for split in ("train", "test")
            if len(splits[site][split]) == 0 and not (split == "train" and site in evaluated)
        ]
        if empty:
            raise DataError(
                f"{type(self).__name__}: no (image, mask) pair in {', '.join(empty)} under {self.root}"
                f"{' after skipping the unmatched files' if unmatched else ''}; add pairs, leave "
                f"those sites out with {_OPTION}.sites, or evaluate a site that has test pairs only "
                f"with {_OPTION}.sites_without_train=evaluate"
            )
        if len(evaluated) == len(built):
            raise DataError(
                f"{type(self).__name__}: no site has an (image, mask) pair to train on under "
                f"{self.root}; add train pairs"
            )
        train_transform = pair_augmentation(self.crop_size, self.augment)
        return SampleList(
            name=self.dataset,
            task="segmentation",
            num_classes=len(self.channel_levels),
            samples=samples,
            # Segmentation has no per-sample class: the target is the mask the reader returns. These zeros only
            # give check_samples one finite value per sample.
            targets={site: torch.zeros(len(ids)) for site, ids in samples.items()},
            splits=splits,
            read=MaskedImageFile(
                root=str(self.root),
                channels=self.channels,
                channel_levels=self.channel_levels,
                allowed_levels=self.allowed_levels,
                image_size=self.image_size,
            ),
            train_transform=train_transform,
            eval_transform=None,
            class_names=list(self.mask_names),
            details={
                "root": str(self.root),
                "image_size": self.image_size,
                "mask_channels": list(self.mask_names),
                "val_fraction": self.val_fraction,
                "split": "folders" if self.split_fractions is None else "pooled and split by split_fractions",
                "split_fractions": None if self.split_fractions is None else list(self.split_fractions),
                "crop_size": self.crop_size,
                "train_transform": repr(train_transform) if train_transform is not None else None,
                "unmatched_skipped": unmatched,
            },
            evaluation_only=frozenset(evaluated),
        )

    def _split(self, site: str, n_train: int, n_all: int) -> dict[str, np.ndarray]:
        """Positions per split of a site whose first ``n_train`` of ``n_all`` pairs come from its train folder:
        the folders' split (``val_fraction`` of train moved to val), or all pooled and split by ``split_fractions``;
        drawn from the site's own generator, so a site's split depends on it alone."""
        rng = site_rng(self.seed, site)
        if self.split_fractions is None:
            order = rng.permutation(n_train)
            n_val = min(int(round(self.val_fraction * n_train)), max(n_train - 1, 0))
            return {"train": np.sort(order[n_val:]), "val": np.sort(order[:n_val]), "test": np.arange(n_train, n_all)}
        if n_all < sum(f > 0 for f in self.split_fractions):
            raise DataError(
                f"{type(self).__name__}: site {site} has {n_all} (image, mask) pairs under "
                f"{self.root / site}, fewer than the non-empty splits of {_OPTION}.split_fractions="
                f"{self.split_fractions}; add pairs or leave the site out with {_OPTION}.sites"
            )
        order, bounds = rng.permutation(n_all), np.cumsum([0, *split_sizes(n_all, self.split_fractions)])
        return {split: np.sort(order[bounds[i] : bounds[i + 1]]) for i, split in enumerate(SPLITS)}

    def _pairs(self, site: str, split: str) -> tuple[list[list[str]], list[str]]:
        """The [image, mask] paths (relative to root) matched by file name, and the unmatched files."""
        folder = self.root / site / split
        if not folder.is_dir():
            raise DataError(
                f"{folder}: missing; each site of {type(self).__name__} needs train/ and test/ folders "
                f"holding {self.image_dir}/ and {self.mask_dir}/, or leave the site out with "
                f"{_OPTION}.sites"
            )
        images, masks = (self._names(folder / d) for d in (self.image_dir, self.mask_dir))
        rel = folder.relative_to(self.root).as_posix()
        pairs = [[f"{rel}/{self.image_dir}/{n}", f"{rel}/{self.mask_dir}/{n}"] for n in sorted(images & masks)]
        lost = [f"{rel}/{self.image_dir}/{n} (no mask)" for n in sorted(images - masks)]
        lost += [f"{rel}/{self.mask_dir}/{n} (no image)" for n in sorted(masks - images)]
        return pairs, lost

    @staticmethod
    def _names(folder: Path) -> set[str]:
        if not folder.is_dir():
            return set()
        return {p.name for p in folder.iterdir() if p.is_file() and is_image(p)}


class FedProstateSlices(_SegmentationSites):
    """Fed-Prostate as 2-D slices: 6 sites of T2-weighted prostate MRI, grey images, one prostate mask channel.

    The sites (BIDMC, BMC, HK, I2CVB, RUNMC, UCL; ``ISBI`` and ``ISBI_1.5`` are read as RUNMC and BMC, the folder's
    name kept as the client id, as :class:`~fedlit.data.FedProstateVolumes` reads them) and slices are those of
    Liu et al., "Shape-aware Meta-learning for Generalizing Prostate MRI Segmentation to Unseen Domains" (SAML,
    MICCAI 2020), as distributed as PNG slices by FedDG-style repositories. Layout:
    ``root/<site>/{train,test}/{image,mask}/<name>.png``; masks are grey, level 0 = prostate and 255 = background
    (as in the fundus masks: the 0 region is the small central organ).

    Each site is a client with its own train and test folders kept; ``val_fraction`` moves a seeded share of its
    train pairs to validation. Images are (1, H, W) float in [0, 1]; masks (1, H, W) float 0/1 (prostate).

    Args:
        root: the folder holding the site folders.
        image_size: side of the square images and masks (bilinear for images, nearest for masks); null keeps it.
        sites: the sites to use, in this order (default: those of the six present under ``root``).
        unmatched: ``error`` refuses an image without a mask of the same name (or the reverse), naming every such
            file; ``skip`` leaves them out with a warning and lists them in the manifest.
        val_fraction: share of each site's train pairs used for validation, in [0, 1).
        split_fractions: null (default) keeps the site's own train and test folders; (train, val, test) shares
            pool each site's pairs of both folders and split them again (e.g. 8:2 as FedSCA does; FedDG's
            Domain2 holds 99 train and 60 test images), seeded per site by ``seed``. Not with ``val_fraction``.
        augment: random horizontal and vertical flips of train pairs (image and mask together).
        crop_size: side of a random square window cut from every train pair (after resizing, before the flips;
            e.g. 320 of 384); null = no crop. Validation and test pairs stay whole and deterministic.
        sites_without_train: a site with test pairs but no train pair (none left after ``unmatched: skip``):
            ``error`` refuses it; ``evaluate`` keeps it as an evaluation-only client (never trained, tested every
            round with the model a new client receives), with a warning naming it.
        batch_size: training batch size.
        eval_batch_size: val/test batch size (default ``batch_size``).
        num_workers: DataLoader worker processes decoding the PNGs.
        seed: seed of the validation split (and of ``split_fractions``' split).
    """

    dataset = "fed_prostate"
    default_sites = PROSTATE_SITES
    same_site = PROSTATE_SAME_SITE
    image_dir, mask_dir, channels = "image", "mask", 1
    channel_levels, allowed_levels, mask_names = ((0,),), (0, 255), ["prostate"]
    source = (
        "Get the slices of the SAML/FedDG Fed-Prostate set (Liu et al., MICCAI 2020), e.g. the ProstateSlice "
        "folder of the FedDG-style repositories (https://github.com/liuquande/FedDG-ELCFS)"
    )


class FedFundus(_SegmentationSites):
    """Fed-Fundus: 4 sites of retinal fundus images, optic disc and cup masks.

    The four domains of Liu et al., "FedDG: Federated Domain Generalization on Medical Image Segmentation via
    Episodic Learning in Continuous Frequency Space" (CVPR 2021): Drishti-GS, RIM-ONE-r3, REFUGE train, REFUGE val.
    Layout: ``root/Domain{1..4}/{train,test}/ROIs/{image,mask}/<name>.png`` (site folders named ``Site{1..4}``
    are found too, as some copies of the set name them), RGB images; masks with three equal
    channels, level 0 = cup, 128 = disc rim, 255 = background. Masks become two overlapping channels: ``disc``
    (level <= 128, the cup included) and ``cup`` (level 0). Images are (3, H, W) float in [0, 1].

    Args: as :class:`FedProstateSlices` (``image_size`` default 384; the files are 800 x 800).
    """

    dataset = "fed_fundus"
    default_sites = ("Domain1", "Domain2", "Domain3", "Domain4", "Site1", "Site2", "Site3", "Site4")
    image_dir, mask_dir, channels = "ROIs/image", "ROIs/mask", 3
    channel_levels, allowed_levels, mask_names = ((0, 128), (0,)), (0, 128, 255), ["disc", "cup"]
    source = (
        "Get FedDG's Fundus set (Liu et al., CVPR 2021; the Fundus folder of the FedDG repository, "
        "https://github.com/liuquande/FedDG-ELCFS)"
    )
