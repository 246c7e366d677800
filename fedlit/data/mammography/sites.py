"""``Mammograms``: screening mammograms from the RSNA, CBIS-DDSM and CMMD DICOM trees as federated clients, split
by patient, with generated images joining a client's training split only."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from typing_extensions import override

from fedlit.core.errors import ConfigError, DataError
from fedlit.data.common.datamodule import FederatedDataModule, is_int
from fedlit.data.common.samples import Compose, Normalize, SampleList, TransformSpec, make_transform
from fedlit.data.common.site_options import site_rng
from fedlit.data.common.splits import SPLITS, stratified_split
from fedlit.data.mammography import cbis_ddsm, cmmd, rsna
from fedlit.data.mammography.dicom import MammogramFile, pydicom_module
from fedlit.data.mammography.records import CLASS_NAMES, Mammogram, missing_root
from fedlit.data.mammography.synthetic import check_synthetic_clients, synthetic_records

_OPTION = "data.init_args"


class Mammograms(FederatedDataModule):
    """Mammograms as a binary task (0 normal or benign, 1 cancer), one client per site, from up to three sources.

    - RSNA Screening Mammography (``rsna_root``: ``train.csv`` + ``train_images/``): one client per value of
      ``rsna_site_column`` (any column of ``train.csv``) among ``rsna_sites``, named ``<column>_<value>``
      (``machine_id_49``, ``site_id_1``);
    - CBIS-DDSM (``cbis_ddsm_root``): one client ``cbis_ddsm`` (benign findings as class 0);
    - CMMD (``cmmd_root``): one client ``cmmd`` (benign findings as class 0).

    Each client's patients are split by ``split_fractions`` (train, val, test), stratified by whether the patient
    has a cancer image, seeded by ``seed`` and the client's name: a patient's images never span two splits. With a
    test fraction of 0 (the default 85/15 of the breast case study) the test split *is* the validation split, as
    in the study, which reports its validation split: read such runs at their last round, not at the best
    validation round (``details.test`` in the manifest says which). ``synthetic`` names, per client, a folder of
    generated images (``normal/``, ``cancer/``) added to its training split only, listed in the manifest.

    Images are read as in :mod:`fedlit.data.mammography.dicom` (VOI LUT / window, ``MONOCHROME1`` inverted,
    [0, 1]), resized to ``image_size`` squared, repeated to ``channels``, then ``train_transform`` or
    ``eval_transform``, then ``(x - mean) / std``.

    Args:
        rsna_root: the RSNA competition folder, or null.
        rsna_site_column: the ``train.csv`` column whose values are the clients.
        rsna_sites: the values to keep, in this order (default: all, sorted as text).
        cbis_ddsm_root: the CBIS-DDSM collection folder (CSVs beside the case folders), or null.
        cbis_ddsm_tables: the CBIS-DDSM CSVs to read (default: the four published ones present).
        cmmd_root: the CMMD collection folder (clinical table beside the patient folders), or null.
        cmmd_table: the CMMD clinical table, ``.xlsx`` (needs openpyxl) or its ``.csv`` export.
        synthetic: client id -> folder of generated images for its training split.
        split_fractions: (train, val, test) shares of each client's patients; test 0: test = val.
        channels: 1 (grey) or 3 (grey repeated, for ImageNet backbones).
        image_size: side of the square the images are resized to.
        window: apply each DICOM's VOI LUT / window before scaling.
        train_transform: torchvision transform(s) for train images (augmentation).
        eval_transform: the same for val and test images.
        mean: per-channel mean of the final normalization.
        std: per-channel std of the final normalization.
        batch_size: training batch size.
        eval_batch_size: val/test batch size (default ``batch_size``).
        num_workers: DataLoader worker processes.
        seed: seed of the splits.
    """

    def __init__(
        self,
        *,
        rsna_root: str | os.PathLike | None = None,
        rsna_site_column: str = "machine_id",
        rsna_sites: list[int | str] | None = None,
        cbis_ddsm_root: str | os.PathLike | None = None,
        cbis_ddsm_tables: list[str] | None = None,
        cmmd_root: str | os.PathLike | None = None,
        cmmd_table: str = cmmd.TABLE,
        synthetic: dict[str, str] | None = None,
        split_fractions: tuple[float, float, float] = (0.85, 0.15, 0.0),
        channels: Literal[1, 3] = 3,
        image_size: int = 256,
        window: bool = True,
        train_transform: TransformSpec = None,
        eval_transform: TransformSpec = None,
        mean: list[float] | None = None,
        std: list[float] | None = None,
        batch_size: int = 32,
        eval_batch_size: int | None = None,
        num_workers: int = 0,
        seed: int = 0,
    ) -> None:
        super().__init__(batch_size=batch_size, eval_batch_size=eval_batch_size, num_workers=num_workers, seed=seed)
        problems = []
        if rsna_root is None and cbis_ddsm_root is None and cmmd_root is None:
            problems.append(f"give at least one of {_OPTION}.rsna_root, cbis_ddsm_root and cmmd_root")
        fractions = tuple(split_fractions)
        if len(fractions) != 3 or any(not f >= 0 for f in fractions) or abs(sum(fractions) - 1) > 1e-6:
            problems.append(f"{_OPTION}.split_fractions must be three shares >= 0 summing to 1, got {fractions}")
        elif fractions[0] <= 0 or fractions[1] + fractions[2] <= 0:
            problems.append(f"{_OPTION}.split_fractions needs train > 0 and val or test > 0, got {fractions}")
        if channels not in (1, 3):
            problems.append(f"{_OPTION}.channels must be 1 or 3, got {channels!r}")
        if not is_int(image_size) or image_size < 8:
            problems.append(f"{_OPTION}.image_size must be an integer >= 8, got {image_size!r}")
        if (mean is None) != (std is None) or (mean is not None and std is not None and len(mean) != len(std)):
            problems.append(f"{_OPTION}.mean and std go together, one value per channel each")
        if problems:
            raise ConfigError("; ".join(problems))
        pydicom_module()  # a missing pydicom is named before any file is listed
        for option, root, source in (
            ("rsna_root", rsna_root, rsna),
            ("cbis_ddsm_root", cbis_ddsm_root, cbis_ddsm),
            ("cmmd_root", cmmd_root, cmmd),
        ):  # when built, before the model loads its weights: a missing download is named at once
            if root is not None and not Path(root).expanduser().is_dir():
                raise missing_root(
                    f"{_OPTION}.{option}", Path(root).expanduser(), source.NAME, source.LAYOUT, source.PAGE
                )
        self.rsna_root = None if rsna_root is None else Path(rsna_root).expanduser()
        self.rsna_site_column = rsna_site_column
        self.rsna_sites = None if rsna_sites is None else [str(s) for s in rsna_sites]
        self.cbis_ddsm_root = None if cbis_ddsm_root is None else Path(cbis_ddsm_root).expanduser()
        self.cbis_ddsm_tables = cbis_ddsm_tables
        self.cmmd_root = None if cmmd_root is None else Path(cmmd_root).expanduser()
        self.cmmd_table = cmmd_table
        self.synthetic = dict(synthetic or {})
        self.split_fractions = tuple(float(f) for f in fractions)
        self.channels, self.image_size, self.window = channels, image_size, window
        self.train_transform = make_transform(train_transform, f"{_OPTION}.train_transform")
        self.eval_transform = make_transform(eval_transform, f"{_OPTION}.eval_transform")
        self.normalize = Normalize(mean, std) if mean is not None and std is not None else None

    @override
    def expected_num_clients(self) -> int | None:
        """The RSNA sites listed plus one client per other source; None when the RSNA sites are not listed."""
        if self._data is not None or (self.rsna_root is not None and self.rsna_sites is None):
            return super().expected_num_clients()
        rsna_sites = len(self.rsna_sites or []) if self.rsna_root is not None else 0
        return rsna_sites + (self.cbis_ddsm_root is not None) + (self.cmmd_root is not None)

    @override
    def client_id_source(self) -> str:
        return f"the sources' sites ({_OPTION}.rsna_site_column and rsna_sites; cbis_ddsm; cmmd)"

    def _records(self) -> tuple[dict[str, str], list[Mammogram]]:
        roots: dict[str, str] = {}
        records: list[Mammogram] = []
        if self.rsna_root is not None:
            roots[rsna.KEY] = str(self.rsna_root)
            records += rsna.rsna_records(self.rsna_root, self.rsna_site_column, self.rsna_sites)
        if self.cbis_ddsm_root is not None:
            roots[cbis_ddsm.KEY] = str(self.cbis_ddsm_root)
            records += cbis_ddsm.cbis_ddsm_records(self.cbis_ddsm_root, self.cbis_ddsm_tables)
        if self.cmmd_root is not None:
            roots[cmmd.KEY] = str(self.cmmd_root)
            records += cmmd.cmmd_records(self.cmmd_root, self.cmmd_table)
        return roots, records

    @override
    def build_samples(self) -> SampleList:
        roots, records = self._records()
        order = list(dict.fromkeys(r.client for r in records))
        if self.rsna_sites is not None:  # the RSNA clients in the order of rsna_sites
            named = [f"{self.rsna_site_column}_{s}" for s in self.rsna_sites]
            order = [c for c in named if c in order] + [c for c in order if c not in named]
        check_synthetic_clients(self.synthetic, order)
        clients = self.sites_to_build(order, f"{_OPTION}.rsna_sites")
        synthetic_roots, generated = synthetic_records(self.synthetic, clients)
        roots.update(synthetic_roots)
        samples, targets, splits, added = {}, {}, {}, {}
        for client in clients:
            own = [r for r in records if r.client == client]
            extra = [r for r in generated if r.client == client]
            parts = self._patient_split(client, own)
            samples[client] = [r.identity for r in own + extra]
            targets[client] = torch.tensor([r.label for r in own + extra], dtype=torch.float32)
            parts["train"] = np.concatenate([parts["train"], np.arange(len(own), len(own) + len(extra))])
            splits[client] = parts
            if extra:
                added[client] = {
                    "folder": roots[extra[0].identity.partition("/")[0]],
                    "images": len(extra),
                    "per_class": [sum(r.label == k for r in extra) for k in (0, 1)],
                }
        test = "held out" if self.split_fractions[2] > 0 else "the validation split (test fraction 0)"
        return SampleList(
            name="mammograms",
            task="binary",
            num_classes=1,
            samples=samples,
            targets=targets,
            splits=splits,
            read=MammogramFile(roots, self.channels, self.image_size, self.window),
            train_transform=self._chain(self.train_transform),
            eval_transform=self._chain(self.eval_transform),
            partitioner=f"Natural(rsna: {self.rsna_site_column}; cbis_ddsm; cmmd)",
            class_names=list(CLASS_NAMES),
            details={
                "roots": {k: v for k, v in roots.items()},
                "rsna_site_column": self.rsna_site_column,
                "split": "by patient, stratified by whether the patient has a cancer image",
                "split_fractions": list(self.split_fractions),
                "test": test,
                "synthetic": added,
                "channels": self.channels,
                "image_size": self.image_size,
                "window": self.window,
            },
        )

    def _patient_split(self, client: str, own: list[Mammogram]) -> dict[str, np.ndarray]:
        """Positions of ``own`` per split: its patients split by ``split_fractions``, stratified by cancer."""
        patients = sorted({r.patient for r in own})
        index = {p: i for i, p in enumerate(patients)}
        sick = np.zeros(len(patients), dtype=np.int64)
        for r in own:
            sick[index[r.patient]] |= r.label
        needed = sum(f > 0 for f in self.split_fractions)
        if len(patients) < needed:
            raise DataError(
                f"client {client!r} has {len(patients)} patients, fewer than the {needed} splits of "
                f"{_OPTION}.split_fractions={self.split_fractions}; add patients to that site or drop it"
            )
        parts = stratified_split(np.arange(len(patients)), sick, self.split_fractions, site_rng(self.seed, client))
        of_patient = np.array([index[r.patient] for r in own], dtype=np.int64)
        split = {name: np.flatnonzero(np.isin(of_patient, part)) for name, part in zip(SPLITS, parts, strict=True)}
        if self.split_fractions[2] == 0:
            split["test"] = split["val"].copy()
        return split

    def _chain(self, transform: Any) -> Any:
        if self.normalize is None:
            return transform
        return Compose([transform, self.normalize]) if transform is not None else self.normalize

    @override
    def preprocessing(self, client_id: str) -> dict[str, Any]:
        """The default's record plus what the reader does to a DICOM (see :mod:`fedlit.data.mammography.dicom`)."""
        return {
            **super().preprocessing(client_id),
            "normalization": {
                "kind": "image",
                "dicom": "modality LUT, VOI LUT / first window" if self.window else "modality LUT",
                "scale": "per-image min-max to [0, 1], MONOCHROME1 inverted",
                "channels": self.channels,
                "size": self.image_size,
                "mean": None if self.normalize is None else self.normalize.mean,
                "std": None if self.normalize is None else self.normalize.std,
            },
        }
