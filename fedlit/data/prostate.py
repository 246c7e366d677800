"""Fed-Prostate in whichever of its two published layouts the root holds: SAML volumes or per-slice PNGs."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Literal

from typing_extensions import override

from fedlit.core.errors import ConfigError, DataError
from fedlit.data.common.datamodule import FederatedDataModule
from fedlit.data.common.samples import SampleList
from fedlit.data.prostate_volumes import FedProstateVolumes
from fedlit.data.segmentation_sites import FedProstateSlices

_OPTION = "data.init_args"
_LAYOUTS = ("auto", "volumes", "slices")


def detect_layout(root: Path, sites: tuple[str, ...] = FedProstateVolumes.default_sites) -> str | None:
    """``slices`` when a site folder holds ``train/image/``, ``volumes`` when one holds ``Case*.nii[.gz]``, else
    None."""
    folders = [root / s for s in sites if (root / s).is_dir()]
    if any((f / "train" / "image").is_dir() for f in folders):
        return "slices"
    if any(next(f.glob("Case*.nii*"), None) is not None for f in folders):
        return "volumes"
    return None


class FedProstate(FederatedDataModule):
    """Fed-Prostate (6 sites of T2-weighted prostate MRI: BIDMC, BMC (SAML: ISBI_1.5), HK, I2CVB, RUNMC (SAML: ISBI),
    UCL; Liu, Dou, Heng, "Shape-aware Meta-learning for Generalizing Prostate MRI Segmentation to Unseen Domains",
    MICCAI 2020) read from either layout, found under ``root``:

    - ``volumes`` (the SAML download): ``root/<site>/CaseXX.nii.gz`` + ``CaseXX_segmentation.nii.gz``, read by
      :class:`FedProstateVolumes` (foreground slices, 99th-percentile clipping, [0, 1], cases split by
      ``split_fractions``);
    - ``slices`` (per-slice PNGs, as FedDG-style repositories share them):
      ``root/<site>/{train,test}/{image,mask}/*.png``, read by :class:`FedProstateSlices` (the folders fix the
      train/test split; ``split_fractions``' val share of the train+val shares moves train pairs to validation).

    ``layout: auto`` picks the one the root holds, so a recipe runs on either download. The other arguments are
    those of the two classes; ``cache_size`` applies to volumes, ``sites_without_train`` to slices.
    """

    def __init__(
        self,
        *,
        root: str,
        layout: Literal["auto", "volumes", "slices"] = "auto",
        sites: list[str] | None = None,
        image_size: int | None = 384,
        crop_size: int | None = None,
        split_fractions: tuple[float, float, float] = (0.8, 0.0, 0.2),
        unmatched: Literal["error", "skip"] = "error",
        sites_without_train: Literal["error", "evaluate"] = "error",
        augment: bool = True,
        cache_size: int = 16,
        batch_size: int = 8,
        eval_batch_size: int | None = None,
        num_workers: int = 0,
        seed: int = 0,
    ) -> None:
        super().__init__(batch_size=batch_size, eval_batch_size=eval_batch_size, num_workers=num_workers, seed=seed)
        if layout not in _LAYOUTS:
            raise ConfigError(f"{_OPTION}.layout must be one of {list(_LAYOUTS)}, got {layout!r}")
        path = Path(root).expanduser()
        found = detect_layout(path, tuple(sites) if sites else FedProstateVolumes.default_sites)
        if layout == "auto" and found is None:
            where = f"no folder {path}" if not path.is_dir() else f"{path} holds neither layout"
            raise DataError(
                f"{_OPTION}.root: {where}. FedProstate expects the SAML volumes "
                f"({path}/<site>/CaseXX.nii.gz with CaseXX_segmentation.nii.gz beside it) or per-slice PNGs "
                f"({path}/<site>/{{train,test}}/{{image,mask}}/*.png), sites "
                f"{', '.join(FedProstateVolumes.default_sites)}. Get the volumes from https://liuquande.github.io/"
                "SAML/ (Liu et al., MICCAI 2020) or the slices from FedDG-style repositories "
                "(https://github.com/liuquande/FedDG-ELCFS), then point data.init_args.root at the folder."
            )
        self.layout = found if layout == "auto" else layout
        loader: dict[str, Any] = dict(
            batch_size=batch_size, eval_batch_size=eval_batch_size, num_workers=num_workers, seed=seed
        )
        common: dict[str, Any] = dict(
            root=root,
            sites=sites,
            image_size=image_size,
            crop_size=crop_size,
            unmatched=unmatched,
            augment=augment,
            **loader,
        )
        if self.layout == "volumes":
            self.reader: FederatedDataModule = FedProstateVolumes(
                split_fractions=split_fractions, cache_size=cache_size, **common
            )
        else:
            train, val = float(split_fractions[0]), float(split_fractions[1])
            self.reader = FedProstateSlices(
                val_fraction=val / (train + val) if train + val > 0 else 0.0,
                sites_without_train=sites_without_train,
                **common,
            )

    @override
    def expected_num_clients(self) -> int | None:
        """The detected layout's sites (known without reading an image)."""
        return self.reader.expected_num_clients() if self._data is None else super().expected_num_clients()

    @override
    def build_samples(self) -> SampleList:
        """The samples of the detected layout's reader."""
        samples = self.reader.build_samples()
        return dataclasses.replace(samples, details={**samples.details, "layout": self.layout})
