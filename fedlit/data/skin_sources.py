"""``SkinSources``: the FedPxN paper's five-source skin cancer benchmark, read from the publishers' files."""

from __future__ import annotations

import difflib
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import torch
from typing_extensions import override

from fedlit.core.errors import ConfigError, InputFileError
from fedlit.data.common.datamodule import FederatedDataModule, is_int
from fedlit.data.common.samples import Compose, ImageFile, Normalize, SampleList, Transform, split_samples
from fedlit.data.common.site_options import site_rng
from fedlit.data.common.splits import check_split_fractions
from fedlit.data.skin_read import (
    CLASS_NAMES,
    FLAMBY,
    FLAMBY_SPLIT,
    ISIC,
    ISIC_SITES,
    ISIC_TRUTH,
    PAGES,
    SITES,
    Sources,
    ham_metadata,
    read_derm7pt,
    read_flamby,
    read_ham,
    read_isic,
    read_pad,
    sources_layout,
)

_OPTION = "data.init_args"
Layout = Literal["auto", "sources", "flamby"]


class SkinSources(FederatedDataModule):
    """Skin lesion images of five sources, one client each, labelled with the 8 classes of ISIC 2019.

    The skin cancer benchmark of Yang et al., "Towards the Practical Utility of Federated Learning in the Medical
    Domain" (CHIL 2023, Sec. 4-5; the FedPxN paper), as its authors' preprocessing builds it:

    - ``barcelona``: the ISIC 2019 training images of BCN_20000 (``lesion_id`` BCN_...), i.e. ISIC 2019 less the
      HAM10000 images and the few of other origins (MSK);
    - ``rosendahl`` and ``vienna``: HAM10000 split by its ``dataset`` column, ``rosendahl`` alone, and
      ``vidir_modern``, ``vidir_molemax`` and ``vienna_dias`` together;
    - ``pad_ufes_20``: PAD-UFES-20 (smartphone photographs), ACK -> AK, NEV -> NV, SEK -> BKL;
    - ``derm7pt``: Derm7pt's dermoscopic images (``derm``), nevi -> NV, melanomas -> MEL, seborrheic keratosis ->
      BKL, vascular lesion -> VASC; lentigo, melanosis and miscellaneous have no class and are left out.

    Classes: MEL, NV, BCC, AK, BKL, DF, VASC, SCC (targets 0..7 in that order on every site; a site lacking a class
    keeps the others' numbers). A row whose diagnosis maps to no class is left out and counted, per file and
    reason, in the manifest's ``details.left_out``.

    Layout under ``root`` (each site reads its own folders only; ``layout`` applies to the three ISIC sites)::

        ISIC_2019/ISIC_2019_Training_GroundTruth.csv, ISIC_2019_Training_Metadata.csv, ISIC_2019_Training_Input/
        HAM10000/HAM10000_metadata.csv (or HAM10000_metadata), HAM10000_images_part_1/, HAM10000_images_part_2/
        PAD-UFES-20/metadata.csv and its images at any depth (images/imgs_part_1/ ...)
        Derm7pt/meta/meta.csv, Derm7pt/images/ (the release_v0 folder of the zip, renamed)
        fed_isic2019/train_test_split, fed_isic2019/ISIC_2019_Training_Input_preprocessed/   (layout: flamby)

    ``layout: flamby`` reads barcelona (FLamby center 0), rosendahl (3) and vienna (1, 2, 5) from FLamby's
    Fed-ISIC2019 instead: its ``train_test_split`` CSV (copied from FLamby's repository) and the images its
    preprocessing resized; FLamby's MSK center (4) is left out and its train/test folds are not used. ``auto``
    takes the publishers' layout when ``ISIC_2019/`` or ``HAM10000/`` holds its CSV, else FLamby's.

    Splits: each site 7:1.5:1.5 (``split_fractions``) train/val/test, stratified by class, seeded by ``seed`` and
    the site's name. Images are decoded as RGB, resized to ``image_size`` squared (bilinear, antialiased; the
    authors' 256x256), scaled to [0, 1]; with ``augment`` the train images are flipped horizontally and vertically
    (p = 0.5 each), rotated by up to 20 degrees and colour-jittered (brightness 32/255, saturation 0.5), the
    authors' augmentation (applied after the resize, theirs before it); then ``(x - mean) / std`` when given (the
    authors normalize with mean 0, std 1: none).

    Args:
        root: the folder holding the sources' folders (above).
        sites: the sites to use, in this order (default: all five).
        layout: ``sources`` (the publishers' files), ``flamby`` (FLamby's Fed-ISIC2019 for the ISIC sites) or
            ``auto``.
        image_size: side of the square images fed to the model.
        augment: flip, rotate and colour-jitter the train images (above).
        mean: per-channel mean of the final normalization (e.g. ImageNet's [0.485, 0.456, 0.406]).
        std: per-channel std of the final normalization.
        split_fractions: (train, val, test) shares of every site.
        batch_size: training batch size (the paper's 128).
        eval_batch_size: val/test batch size (default ``batch_size``).
        num_workers: DataLoader worker processes reading the images.
        seed: seed of the splits.
    """

    def __init__(
        self,
        *,
        root: str | os.PathLike,
        sites: list[str] | None = None,
        layout: Layout = "auto",
        image_size: int = 256,
        augment: bool = True,
        mean: list[float] | None = None,
        std: list[float] | None = None,
        split_fractions: tuple[float, float, float] = (0.7, 0.15, 0.15),
        batch_size: int = 128,
        eval_batch_size: int | None = None,
        num_workers: int = 0,
        seed: int = 0,
    ) -> None:
        super().__init__(batch_size=batch_size, eval_batch_size=eval_batch_size, num_workers=num_workers, seed=seed)
        sites = list(SITES) if sites is None else sites
        problems = _site_problems(sites)
        if layout not in ("auto", "sources", "flamby"):
            problems.append(f"{_OPTION}.layout must be one of ['auto', 'sources', 'flamby'], got {layout!r}")
        if not is_int(image_size) or image_size < 1:
            problems.append(f"{_OPTION}.image_size must be an integer >= 1, got {image_size!r}")
        if not isinstance(augment, bool):
            problems.append(f"{_OPTION}.augment must be true or false, got {augment!r}")
        if (mean is None) != (std is None):
            problems.append(f"{_OPTION}.mean and {_OPTION}.std go together: give both or neither")
        elif mean is not None and std is not None and (len(mean) != 3 or len(std) != 3 or min(std) <= 0):
            problems.append(f"{_OPTION}.mean and std need 3 values each (RGB), std > 0; got {mean} and {std}")
        try:
            check_split_fractions(split_fractions, f"{_OPTION}.split_fractions")
        except ValueError as err:
            problems.append(str(err))
        if problems:
            raise ConfigError("; ".join(problems))
        self.root = Path(root).expanduser()
        if not self.root.is_dir():
            raise InputFileError(
                f"{_OPTION}.root: no folder {self.root}. It must hold {sources_layout(sites)}; put each source's "
                "folder there as its publisher ships it"
            )
        self.sites, self.layout, self.image_size, self.augment = list(sites), layout, int(image_size), augment
        self.mean, self.std = mean, std
        self.split_fractions = tuple(float(f) for f in split_fractions)

    @override
    def expected_num_clients(self) -> int | None:
        """One client per site of ``sites``."""
        return len(self.sites) if self._data is None else super().expected_num_clients()

    @override
    @classmethod
    def clients_in_options(cls, options: Mapping[str, Any]) -> int | None:
        """The length of ``sites``, or the five sites when it is not given."""
        sites = options.get("sites")
        return len(SITES) if sites is None else super().clients_in_options(options)

    @override
    def client_id_source(self) -> str:
        """The sites."""
        return f"{_OPTION}.sites ({list(SITES)})"

    def resolved_layout(self, sites: list[str]) -> Literal["sources", "flamby"]:
        """The layout the ISIC sites are read from (``auto`` resolved from the files under ``root``).

        Raises:
            InputFileError: with ``auto``, naming both layouts' files when neither is there.
        """
        if self.layout != "auto":
            return self.layout
        if not set(sites) & set(ISIC_SITES):
            return "sources"
        if (self.root / ISIC / ISIC_TRUTH).is_file() or ham_metadata(self.root).is_file():
            return "sources"
        if (self.root / FLAMBY / FLAMBY_SPLIT).is_file():
            return "flamby"
        raise InputFileError(
            f"{_OPTION}.root: {self.root} holds neither {self.root / ISIC / ISIC_TRUTH} (ISIC 2019, "
            f"{PAGES[ISIC]}) nor {self.root / FLAMBY / FLAMBY_SPLIT} (FLamby's Fed-ISIC2019, {PAGES[FLAMBY]}), "
            f"which sites {sorted(set(sites) & set(ISIC_SITES))} need. It must hold {sources_layout(sites)}"
        )

    @override
    def build_samples(self) -> SampleList:
        sites = self.sites_to_build(self.sites)
        layout = self.resolved_layout(sites)
        found = Sources()
        isic = set(sites) & set(ISIC_SITES)
        if isic and layout == "flamby":
            read_flamby(self.root, isic, found)
        elif isic:
            if "barcelona" in isic:
                read_isic(self.root, found)
            if isic - {"barcelona"}:
                read_ham(self.root, isic, found)
        if "pad_ufes_20" in sites:
            read_pad(self.root, found)
        if "derm7pt" in sites:
            read_derm7pt(self.root, found)
        index = {name: i for i, name in enumerate(CLASS_NAMES)}
        samples = {site: [identity for identity, _ in found.rows.get(site, [])] for site in sites}
        targets = {
            site: torch.tensor([index[label] for _, label in found.rows.get(site, [])], dtype=torch.int64)
            for site in sites
        }
        splits = {}
        for site in sites:  # each site by its own generator: a node holding one site splits it alike
            splits.update(
                split_samples(
                    {site: targets[site]},
                    self.split_fractions,
                    site_rng(self.seed, site),
                    "multiclass",
                    f"{_OPTION}.split_fractions",
                )
            )
        return SampleList(
            name="skin_sources",
            task="multiclass",
            num_classes=len(CLASS_NAMES),
            samples=samples,
            targets=targets,
            splits=splits,
            read=ImageFile(root=str(self.root), channels=3, image_size=self.image_size),
            train_transform=self._transform(train=True),
            eval_transform=self._transform(train=False),
            partitioner="Natural() (one client per source)",
            class_names=list(CLASS_NAMES),
            details={
                "root": str(self.root),
                "layout": layout,
                "left_out": found.left_out,
                "split_fractions": list(self.split_fractions),
                "image_size": self.image_size,
                "augment": self.augment,
                "mean": self.mean,
                "std": self.std,
            },
        )

    def _transform(self, *, train: bool) -> Transform | None:
        parts: list[Any] = []
        if train and self.augment:
            from torchvision.transforms import v2

            parts += [
                v2.RandomHorizontalFlip(),
                v2.RandomVerticalFlip(),
                v2.RandomRotation(20),
                v2.ColorJitter(brightness=32 / 255, saturation=0.5),
            ]
        if self.mean is not None and self.std is not None:
            parts.append(Normalize(self.mean, self.std))
        return Compose(parts) if parts else None

    @override
    def preprocessing(self, client_id: str) -> dict[str, Any]:
        """The default's record plus what the loader does to an image file: decoded with PIL as RGB, scaled to
        [0, 1], resized to ``image_size`` squared (bilinear, antialiased), then ``(x - mean) / std`` when given."""
        return {
            **super().preprocessing(client_id),
            "normalization": {
                "kind": "image",
                "channels": 3,
                "size": self.image_size,
                "scale": "8-bit / 255",
                "mean": self.mean,
                "std": self.std,
            },
        }


def _site_problems(sites: object) -> list[str]:
    if not isinstance(sites, list | tuple) or not sites:
        return [f"{_OPTION}.sites must be a non-empty list of sites of {list(SITES)}, got {sites!r}"]
    problems = []
    for site in sites:
        if site not in SITES:
            close = difflib.get_close_matches(str(site), SITES, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            problems.append(f"{_OPTION}.sites: {site!r} is not one of {list(SITES)}{hint}")
    if len(set(sites)) < len(sites):
        problems.append(f"{_OPTION}.sites lists a site twice: {list(sites)}")
    return problems
