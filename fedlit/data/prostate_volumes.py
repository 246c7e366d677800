"""``FedProstateVolumes``: Fed-Prostate read from the SAML NIfTI volumes, one 2-D slice per sample.

Liu, Dou, Heng, "Shape-aware Meta-learning for Generalizing Prostate MRI Segmentation to Unseen Domains",
MICCAI 2020 (https://liuquande.github.io/SAML/): T2-weighted prostate MRI of six sites, one folder per site,
``CaseXX.nii.gz`` with its ``CaseXX_segmentation.nii.gz`` (some sites spell it ``_Segmentation``).

The preprocessing of the federated prostate benchmarks built on these volumes: keep the axial slices whose mask
holds foreground, clip each volume at its own 99th percentile, scale it to [0, 1], resize the slices to 384 x 384
(image bilinear, mask nearest), split every site 8:2 by case. Only the mask volumes are read when the data set is
built (to find the slices with foreground); the image volumes are read by the DataLoader workers when a slice is
asked for, and kept in a small per-worker cache.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from typing_extensions import override

from fedlit.core.errors import ConfigError, DataError
from fedlit.data.common.datamodule import FederatedDataModule, is_int
from fedlit.data.common.samples import SampleList
from fedlit.data.common.segmentation_pairs import pair_augmentation
from fedlit.data.common.site_options import (
    PROSTATE_SAME_SITE,
    PROSTATE_SITES,
    find_sites,
    report_unmatched,
    segmentation_option_problems,
    site_rng,
)
from fedlit.data.common.splits import SPLITS, check_split_fractions, split_sizes

_OPTION = "data.init_args"
# CaseXX.nii.gz (image) and CaseXX_segmentation.nii.gz / CaseXX_Segmentation.nii.gz (mask); .nii too.
_VOLUME = re.compile(r"^(?P<case>.+?)(?P<mask>_segmentation)?\.nii(\.gz)?$", re.IGNORECASE)
_SOURCE = (
    'Get the SAML multi-site prostate MRI volumes (Liu, Dou, Heng, "Shape-aware Meta-learning for '
    'Generalizing Prostate MRI Segmentation to Unseen Domains", MICCAI 2020) from '
    "https://liuquande.github.io/SAML/ and point root at the folder holding the site folders"
)


def normalize_volume(volume: np.ndarray) -> np.ndarray:
    """Clip ``volume`` at its 99th percentile (NumPy's linear interpolation) and scale it to [0, 1] by its
    minimum and that percentile: ``(min(v, p99) - min) / (p99 - min)``; a constant volume gives zeros."""
    volume = np.asarray(volume, dtype=np.float32)
    high, low = np.float32(np.percentile(volume, 99)), volume.min()
    if not high > low:
        return np.zeros_like(volume)
    return (np.minimum(volume, high) - low) / (high - low)


def read_volume(path: Path) -> Any:
    """``nibabel.load(path)`` (the header only; the voxels are read on demand), errors naming the file.

    Raises:
        DataError: when the file is missing or is not a NIfTI volume nibabel can read.
    """
    import nibabel

    try:
        return nibabel.load(path)
    except FileNotFoundError:
        raise DataError(f"{path}: file not found (it was listed when the data set was built); restore it") from None
    except (nibabel.filebasedimages.ImageFileError, OSError, EOFError, ValueError) as err:
        raise DataError(f"{path}: cannot be read as a NIfTI volume ({type(err).__name__}: {err}); replace it") from None


def voxels(path: Path, dtype: type = np.float32) -> np.ndarray:
    """The 3-D voxel array of the NIfTI file ``path`` (axes x, y, slice), trailing singleton axes dropped.

    Raises:
        DataError: naming the file when it cannot be read or is not 3-D.
    """
    image = read_volume(path)
    try:
        data: np.ndarray = np.asarray(image.dataobj, dtype=dtype)
    except (OSError, EOFError, ValueError, MemoryError) as err:
        raise DataError(f"{path}: its voxels cannot be read ({type(err).__name__}: {err}); replace it") from None
    while data.ndim > 3 and data.shape[-1] == 1:
        data = data[..., 0]
    if data.ndim != 3:
        raise DataError(f"{path}: a volume of shape {data.shape}, not 3-D (x, y, slice); give one 3-D volume per file")
    return data


class VolumeSlice:
    """Reads an ``[image, mask, slice]`` identity (paths relative to ``root``) as an ``(image, mask)`` pair.

    The image volume is normalized by :func:`normalize_volume` (so the percentile is the whole volume's) and
    the slice taken along the volume's third axis, transposed to (rows = y, columns = x) as SimpleITK and the
    PNG slices of the same data lay it out. The image is (1, H, W) float32 in [0, 1] (bilinear, antialiased
    resize to ``image_size``), the mask (1, H, W) float32, 1 where the label is not 0 (nearest-neighbour
    resize). The last ``cache_size`` cases read stay in memory, per process: each DataLoader worker gets its own
    empty cache (the cache is not pickled).

    Raises:
        DataError: naming the file when a volume cannot be read, image and mask differ in shape, or the slice
            is out of range.
    """

    def __init__(self, root: str, image_size: int | None = 384, cache_size: int = 16) -> None:
        self.root, self.image_size, self.cache_size = root, image_size, cache_size
        self._cache: OrderedDict[tuple[str, str], tuple[np.ndarray, np.ndarray]] = OrderedDict()

    def __call__(self, identity: list[Any] | tuple[str, str, int]) -> tuple[torch.Tensor, torch.Tensor]:
        from torchvision.transforms.v2 import InterpolationMode
        from torchvision.transforms.v2 import functional as TF

        image_rel, mask_rel, index = identity
        volume, labels = self._case(image_rel, mask_rel)
        if not 0 <= int(index) < volume.shape[2]:
            raise DataError(
                f"{Path(self.root) / image_rel}: slice {index} is out of range (the volume has "
                f"{volume.shape[2]}); the file changed since the data set was built, rebuild it"
            )
        image = torch.from_numpy(np.ascontiguousarray(volume[:, :, int(index)].T))[None]
        mask = torch.from_numpy(np.ascontiguousarray(labels[:, :, int(index)].T))[None].float()
        if self.image_size is not None and tuple(image.shape[-2:]) != (self.image_size, self.image_size):
            size = [self.image_size, self.image_size]
            image = TF.resize(image, size, antialias=True).clamp_(0.0, 1.0)
            mask = TF.resize(mask, size, interpolation=InterpolationMode.NEAREST)
        return image.contiguous(), mask.contiguous()

    def _case(self, image_rel: str, mask_rel: str) -> tuple[np.ndarray, np.ndarray]:
        key = (image_rel, mask_rel)
        if key in self._cache:
            self._cache.move_to_end(key)
            return self._cache[key]
        image_path, mask_path = Path(self.root) / image_rel, Path(self.root) / mask_rel
        volume = normalize_volume(voxels(image_path))
        labels = voxels(mask_path, np.float32) != 0
        if volume.shape != labels.shape:
            raise DataError(
                f"{mask_path}: a volume of shape {labels.shape} but its image {image_path} has "
                f"{volume.shape}; they must match voxel for voxel"
            )
        self._cache[key] = (volume, labels)
        while len(self._cache) > self.cache_size:
            self._cache.popitem(last=False)
        return volume, labels

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_cache": OrderedDict()}  # workers start empty; volumes never travel in pickles

    @override
    def __repr__(self) -> str:
        return f"VolumeSlice(root={self.root!r}, image_size={self.image_size}, cache_size={self.cache_size})"


class FedProstateVolumes(FederatedDataModule):
    """Fed-Prostate from the SAML volumes: 6 sites of T2-weighted MRI, one sample per slice with prostate.

    Layout (the SAML download; ``CaseXX_Segmentation.nii.gz`` is accepted too, ``.nii`` as well)::

        root/<site>/CaseXX.nii.gz                  the T2 volume (x, y, slice)
        root/<site>/CaseXX_segmentation.nii.gz     its label volume (0 = background, any other label = prostate)

    Sites are BIDMC, BMC, HK, I2CVB, RUNMC and UCL (those present, or ``sites``). The SAML download names two
    folders by the NCI-ISBI 2013 challenge they come from, ``ISBI`` (= RUNMC) and ``ISBI_1.5`` (= BMC): both names
    are read, and the client id is the folder's name (``ISBI``). One site under both names is refused; other
    folders under ``root`` are named in a warning (they are not read). Every site is a client; its
    cases are split (train, val, test) by ``split_fractions`` (8:0:2 by default), seeded by ``seed``, whole
    cases only: the slices of one case never fall in two splits. Only the slices whose mask holds foreground
    are kept. Each image volume is clipped at its 99th percentile and scaled to [0, 1]
    (:func:`normalize_volume`); slices are resized to ``image_size`` (image bilinear, mask nearest). Images are
    (1, H, W) float in [0, 1], masks (1, H, W) float 0/1 (prostate).

    The mask volumes are read once when the data set is built; the image volumes are read in the DataLoader
    workers, the last ``cache_size`` cases kept per worker (a 384 x 384 x 30 case takes about 20 MB). The
    manifest lists every slice as ``[image file, mask file, slice index]`` and, under ``details.cases``, the case
    files of every client per split with their slice and foreground pixel counts (at the files' resolution).

    Args:
        root: the folder holding the site folders.
        sites: the sites to use, in this order (default: those of the six present under ``root``, under either
            name, in the order BIDMC, BMC, HK, I2CVB, RUNMC, UCL).
        image_size: side of the square slices (bilinear for images, nearest for masks); null keeps each
            volume's in-plane size (batches then need volumes of one size).
        split_fractions: (train, val, test) shares of each site's cases.
        unmatched: ``error`` refuses a case volume without its segmentation (or the reverse), naming every such
            file; ``skip`` leaves them out with a warning and lists them in the manifest.
        augment: random horizontal and vertical flips of train slices (image and mask together).
        crop_size: side of a random square window cut from every train slice (after resizing, before the
            flips; e.g. 320 of 384); null = no crop. Validation and test slices stay whole.
        cache_size: cases (image and mask volumes) kept in memory by each DataLoader worker.
        batch_size: training batch size.
        eval_batch_size: val/test batch size (default ``batch_size``).
        num_workers: DataLoader worker processes reading the volumes.
        seed: seed of the case split.
    """

    default_sites = PROSTATE_SITES

    def __init__(
        self,
        *,
        root: str,
        sites: list[str] | None = None,
        image_size: int | None = 384,
        split_fractions: tuple[float, float, float] = (0.8, 0.0, 0.2),
        unmatched: Literal["error", "skip"] = "error",
        augment: bool = True,
        crop_size: int | None = None,
        cache_size: int = 16,
        batch_size: int = 8,
        eval_batch_size: int | None = None,
        num_workers: int = 0,
        seed: int = 0,
    ) -> None:
        super().__init__(batch_size=batch_size, eval_batch_size=eval_batch_size, num_workers=num_workers, seed=seed)
        problems = segmentation_option_problems(image_size, crop_size, unmatched)
        if not is_int(cache_size) or cache_size < 1:
            problems.append(f"{_OPTION}.cache_size must be an integer >= 1, got {cache_size!r}")
        try:
            check_split_fractions(split_fractions, f"{_OPTION}.split_fractions")
        except ValueError as err:
            problems.append(str(err))
        if problems:
            raise ConfigError("; ".join(problems))
        self.root = Path(root).expanduser()
        layout = (
            f"{self.root}/<site>/CaseXX.nii.gz with CaseXX_segmentation.nii.gz beside it (sites "
            f"{', '.join(self.default_sites)})"
        )
        self.sites = find_sites(
            "FedProstateVolumes",
            self.root,
            sites,
            self.default_sites,
            layout,
            _SOURCE,
            same_site=PROSTATE_SAME_SITE,
            warn_others=True,
        )
        self.image_size, self.unmatched, self.augment, self.crop_size = image_size, unmatched, bool(augment), crop_size
        self.split_fractions = tuple(float(f) for f in split_fractions)
        self.cache_size = cache_size

    @override
    def expected_num_clients(self) -> int | None:
        """One client per site of ``sites`` (known without reading an image)."""
        return len(self.sites) if self._data is None else super().expected_num_clients()

    @override
    def build_samples(self) -> SampleList:
        listed, lost = {}, []
        built = self.sites_to_build(self.sites)  # a Flower node: its own site only
        for site in built:
            listed[site], missing = self._cases(site)
            lost += missing
        report_unmatched(
            "FedProstateVolumes",
            lost,
            self.unmatched,
            "partner (a CaseXX.nii.gz needs its CaseXX_segmentation.nii.gz and the reverse)",
        )
        samples: dict[str, list[Any]] = {}
        splits: dict[str, dict[str, np.ndarray]] = {}
        cases: dict[str, dict[str, list[dict[str, Any]]]] = {}
        for site, pairs in listed.items():
            if len(pairs) < sum(f > 0 for f in self.split_fractions):
                raise DataError(
                    f"FedProstateVolumes: site {site} has {len(pairs)} matched cases under "
                    f"{self.root / site}, fewer than the non-empty splits of {_OPTION}.split_fractions="
                    f"{self.split_fractions}; add cases or leave the site out with {_OPTION}.sites"
                )
            order = site_rng(self.seed, site).permutation(len(pairs))  # a site's split depends on it alone
            bounds = np.cumsum([0, *split_sizes(len(pairs), self.split_fractions)])
            split_of = {int(case): split for i, split in enumerate(SPLITS) for case in order[bounds[i] : bounds[i + 1]]}
            samples[site] = []
            positions: dict[str, list[int]] = {split: [] for split in SPLITS}
            cases[site] = {split: [] for split in SPLITS}
            for case, (image_rel, mask_rel) in enumerate(pairs):
                kept, foreground = self._slices(image_rel, mask_rel)
                split = split_of[case]
                positions[split] += range(len(samples[site]), len(samples[site]) + len(kept))
                samples[site] += [[image_rel, mask_rel, k] for k in kept]
                cases[site][split].append(
                    {"image": image_rel, "mask": mask_rel, "slices": len(kept), "foreground_pixels": foreground}
                )
            splits[site] = {split: np.asarray(positions[split], dtype=np.int64) for split in SPLITS}
        empty = [f"{site}/{split}" for site in built for split in ("train", "test") if not len(splits[site][split])]
        if empty:
            raise DataError(
                f"FedProstateVolumes: no slice with prostate in {', '.join(empty)} under {self.root}; "
                f"add cases with segmentations, or leave those sites out with {_OPTION}.sites"
            )
        train_transform = pair_augmentation(self.crop_size, self.augment)
        return SampleList(
            name="fed_prostate_volumes",
            task="segmentation",
            num_classes=1,
            samples=samples,
            # Segmentation has no per-sample class: the target is the mask the reader returns. These zeros only
            # give check_samples one finite value per sample.
            targets={site: torch.zeros(len(ids)) for site, ids in samples.items()},
            splits=splits,
            read=VolumeSlice(root=str(self.root), image_size=self.image_size, cache_size=self.cache_size),
            train_transform=train_transform,
            eval_transform=None,
            class_names=["prostate"],
            details={
                "root": str(self.root),
                "image_size": self.image_size,
                "crop_size": self.crop_size,
                "split_fractions": list(self.split_fractions),
                "split_unit": "case",
                "normalization": "per volume: clip at the 99th percentile, scale (v - min) / (p99 - min)",
                "mask_channels": ["prostate"],
                "train_transform": repr(train_transform) if train_transform is not None else None,
                "unmatched_skipped": lost,
                "cases": cases,
            },
        )

    def _cases(self, site: str) -> tuple[list[tuple[str, str]], list[str]]:
        """The (image, mask) paths (relative to root) of each case, sorted by case name, and the unmatched files."""
        images: dict[str, str] = {}
        masks: dict[str, str] = {}
        for path in sorted((self.root / site).iterdir()):
            match = _VOLUME.match(path.name) if path.is_file() else None
            if match is not None:
                (masks if match["mask"] else images)[match["case"]] = f"{site}/{path.name}"
        pairs = [(images[c], masks[c]) for c in sorted(images.keys() & masks.keys())]
        lost = [f"{images[c]} (no segmentation)" for c in sorted(images.keys() - masks.keys())]
        lost += [f"{masks[c]} (no image)" for c in sorted(masks.keys() - images.keys())]
        return pairs, lost

    def _slices(self, image_rel: str, mask_rel: str) -> tuple[list[int], int]:
        """The slices of a mask volume that hold foreground, and its number of foreground voxels; the image's
        header (not its voxels) is read to check that both volumes have one shape."""
        labels = voxels(self.root / mask_rel) != 0
        shape = tuple(read_volume(self.root / image_rel).shape)
        while len(shape) > 3 and shape[-1] == 1:
            shape = shape[:-1]
        if shape != labels.shape:
            raise DataError(
                f"{self.root / mask_rel}: a volume of shape {labels.shape} but its image "
                f"{self.root / image_rel} has {shape}; they must match voxel for voxel"
            )
        per_slice = labels.sum(axis=(0, 1))
        return [int(k) for k in np.flatnonzero(per_slice)], int(per_slice.sum())
