"""eICU: six clinical prediction tasks per ICU stay, federated over the hospitals with the most stays.

The benchmark of Yang et al., "Towards the Practical Utility of Federated Learning in the Medical Domain" (CHIL
2023, Sec. 4-5), built on the eICU Collaborative Research Database (Pollard et al., Scientific Data 2018;
https://physionet.org/content/eicu-crd/, credentialed) as preprocessed by McDermott et al., "A Comprehensive EHR
Timeseries Pre-training Benchmark" (CHIL 2021), whose per-stay tensors the FedPxN authors cache one file per stay.

Layout of ``root`` (what the FedPxN authors' preprocessing leaves; docs/fedpxn.md says how to produce it):

- ``patient.csv`` (or eICU-CRD's ``patient.csv.gz`` as PhysioNet ships it): columns ``patientunitstayid`` and
  ``hospitalid`` (others are ignored): the hospital of every stay;
- ``cached_data/<patientunitstayid>.pt``: one ``torch.save``'d dict of tensors per stay: ``ts`` (T, S) hourly
  labs and vitals (imputed, with their measurement indicators; S = 165 in the authors' cache), ``statics`` (D,)
  demographics and admission data (D = 15), ``tasks_binary_multilabel`` (3,) = mort_24h, mort_48h and LOS (long
  stay) as 0/1 with NaN for unknown, ``disch_24h`` and ``disch_48h`` (1,) the discharge class 0..9, and ``Final
  Acuity Outcome`` (1,) the acuity class 0..11 (a negative value, e.g. int64's minimum, is unknown).

Only stays with a cached file count: a hospital's size is its number of cached stays, the order of the
authors' ``hospital_scale_info.csv``.
"""

from __future__ import annotations

import csv
import gzip
import io
import os
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from typing_extensions import override

from fedlit.core.errors import ConfigError, DataError
from fedlit.data.common.datamodule import FederatedDataModule, is_int
from fedlit.data.common.samples import SampleList
from fedlit.data.common.splits import SPLITS, check_split_fractions, stratified_split

PATIENT = "patient.csv"
CACHE = "cached_data"
URL = "https://physionet.org/content/eicu-crd/"
#: The six tasks, in target-column order, and their classes (1: binary).
TASK_CLASSES = {"mort_24h": 1, "mort_48h": 1, "LOS": 1, "disch_24h": 10, "disch_48h": 10, "acuity": 12}
TASKS = tuple(TASK_CLASSES)
#: The 30 largest hospitals in the FedPxN authors' README, largest first (their --hospital_id lists).
PAPER_HOSPITALS = (
    73, 264, 420, 243, 458, 443, 338, 252, 208, 122, 167, 199, 281, 176, 449,
    188, 416, 283, 417, 394, 411, 197, 110, 248, 300, 148, 365, 413, 183, 400,
)  # fmt: skip
_BINARY_KEY = "tasks_binary_multilabel"
_CLASS_KEYS = {"disch_24h": "disch_24h", "disch_48h": "disch_48h", "acuity": "Final Acuity Outcome"}
TOP_K = (5, 10, 20, 30)


def layout() -> str:
    """The files an eICU folder must hold, as error messages name them."""
    return (
        f"{PATIENT} (or {PATIENT}.gz, eICU-CRD's patient table) and {CACHE}/<patientunitstayid>.pt, one per stay, "
        f"as the FedPxN authors' preprocessing caches them (see docs/fedpxn.md); eICU-CRD is credentialed: {URL}"
    )


class EICU(FederatedDataModule):
    """eICU stays of the ``clients_top_k`` hospitals with the most stays, one client per hospital, six targets.

    Clients ``hospital_<id>``, largest first (ties: smaller id first); with the FedPxN authors' data the order is
    ``PAPER_HOSPITALS`` (73, 264, 420, 243, 458, ...), and a warning says so when the files give other ids.
    ``hospitals`` lists the ids instead (in that order). Every hospital's stays are split by ``split_fractions``
    (plain random, by a generator of its own seeded by (``seed``, hospital id), so a hospital's split does not
    depend on which others are built); the authors' own per-hospital split files are not published.

    Inputs: float32 (``max_hours``, 1 + S + D) per stay: column 0 is 1 on the stay's hours and 0 on padding, then
    the first ``max_hours`` rows of ``ts`` (non-finite values set to 0), then ``statics`` repeated on every row
    (padding rows included), as :class:`fedlit.models.EHRTransformer` and :class:`fedlit.models.EHRGRU` read
    them. Targets: float32 (n, 6) in ``TASKS`` order (mort_24h, mort_48h, LOS: 0/1; disch_24h, disch_48h: class
    0..9; acuity: class 0..11), -1 where unknown: task ``multitask`` for :class:`fedlit.tasks.MultiTaskModule`.

    Building reads every chosen stay file once for its targets (they must be known before training); inputs are
    read again lazily, one stay per item.

    "Train on K, test on the top 5" (the paper's K = 10, 20, 30 runs): every hospital trains and is evaluated;
    the paper's numbers are the mean over the five largest (``test_hospitals`` in the manifest): read those
    columns of the run's per-client table (docs/fedpxn.md).

    Args:
        root: the folder (``patient.csv``, ``cached_data/``).
        clients_top_k: how many of the largest hospitals become clients (the paper: 5, 10, 20, 30).
        hospitals: explicit hospital ids instead of the top ``clients_top_k`` (None: the largest).
        max_hours: hours of each stay the model sees (padded or cut; the cache holds 25: the first day).
        split_fractions: (train, val, test) fractions of every hospital's stays.
        batch_size: training batch size (the authors': 256).
        eval_batch_size: val/test batch size (default ``batch_size``).
        num_workers: DataLoader worker processes.
        seed: seed of the splits.
    """

    def __init__(
        self,
        *,
        root: str | os.PathLike,
        clients_top_k: int = 5,
        hospitals: list[int] | None = None,
        max_hours: int = 25,
        split_fractions: tuple[float, float, float] = (0.8, 0.1, 0.1),
        batch_size: int = 256,
        eval_batch_size: int | None = None,
        num_workers: int = 0,
        seed: int = 0,
    ) -> None:
        super().__init__(batch_size=batch_size, eval_batch_size=eval_batch_size, num_workers=num_workers, seed=seed)
        check_split_fractions(split_fractions)
        problems = []
        if not is_int(clients_top_k) or clients_top_k < 1:
            problems.append(f"data.init_args.clients_top_k must be an integer >= 1 (the paper: 5, 10, 20, 30), "
                            f"got {clients_top_k!r}")  # fmt: skip
        if hospitals is not None and (
            not hospitals or not all(is_int(h) for h in hospitals) or len(set(hospitals)) < len(hospitals)
        ):
            problems.append(f"data.init_args.hospitals must be null or distinct hospital ids, got {hospitals!r}")
        if not is_int(max_hours) or max_hours < 1:
            problems.append(f"data.init_args.max_hours must be an integer >= 1, got {max_hours!r}")
        if problems:
            raise ConfigError("; ".join(problems))
        self.root = Path(root).expanduser()
        absent = [] if _patient_path(self.root) else [PATIENT]
        if not (self.root / CACHE).is_dir():
            absent.append(f"{CACHE}/")
        if absent:
            where = f"folder {self.root} lacks {', '.join(absent)}" if self.root.is_dir() else f"no folder {self.root}"
            raise DataError(f"data.init_args.root: {where}. It must hold {layout()}")
        self.clients_top_k = int(clients_top_k)
        self.hospitals = None if hospitals is None else [int(h) for h in hospitals]
        self.max_hours = int(max_hours)
        self.split_fractions = tuple(float(f) for f in split_fractions)

    @override
    @property
    def task(self) -> str:
        """``multitask``: the six targets of ``TASKS`` (known before the data is built)."""
        return "multitask"

    @override
    def expected_num_clients(self) -> int | None:
        return len(self.hospitals) if self.hospitals is not None else self.clients_top_k

    @override
    @classmethod
    def clients_in_options(cls, options: Mapping[str, Any]) -> int | None:
        hospitals, top_k = options.get("hospitals"), options.get("clients_top_k", 5)
        if isinstance(hospitals, list | tuple):
            return len(hospitals)
        return int(top_k) if is_int(top_k) else None

    @override
    def build_samples(self) -> SampleList:
        stays = read_hospitals(_patient_path(self.root) or self.root / PATIENT)
        cached = {int(p.stem) for p in (self.root / CACHE).glob("*.pt") if p.stem.isdigit()}
        by_hospital: dict[int, list[int]] = {}
        for stay, hospital in stays.items():
            if stay in cached:
                by_hospital.setdefault(hospital, []).append(stay)
        if self.hospitals is not None:
            unknown = [h for h in self.hospitals if h not in by_hospital]
            if unknown:
                raise DataError(
                    f"data.init_args.hospitals: {unknown} have no stay in {self.root / CACHE} "
                    f"(hospitals with stays: {len(by_hospital)}, largest {rank_hospitals(by_hospital)[:5]})"
                )
            chosen = list(self.hospitals)
        else:
            ranked = rank_hospitals(by_hospital)
            if len(ranked) < self.clients_top_k:
                raise DataError(
                    f"data.init_args.clients_top_k={self.clients_top_k} but {self.root} has cached stays of only "
                    f"{len(ranked)} hospitals ({ranked}); lower clients_top_k or add the missing stays"
                )
            chosen = ranked[: self.clients_top_k]
            paper = list(PAPER_HOSPITALS[: len(chosen)])
            if chosen[: len(paper)] != paper:  # beyond the paper's 30 there is nothing to compare
                warnings.warn(
                    f"EICU: the {len(chosen)} largest hospitals of {self.root} are {chosen}, not the FedPxN paper's "
                    f"{paper}: other stays than the authors' cache; set data.init_args.hospitals to use theirs",
                    stacklevel=2,
                )
        read = StayTensor(str(self.root / CACHE), self.max_hours)
        samples, targets, splits, widths = {}, {}, {}, None
        for hospital in chosen:
            client = f"hospital_{hospital}"
            ids = sorted(by_hospital[hospital])
            rows = []
            for stay in ids:
                labels, shape = read_labels(self.root / CACHE / f"{stay}.pt")
                if widths is None:
                    widths = shape
                elif shape != widths:
                    raise DataError(
                        f"{self.root / CACHE / f'{stay}.pt'}: ts has {shape[0]} features and statics {shape[1]}, "
                        f"but the first stay read has {widths[0]} and {widths[1]}; every stay must come from one "
                        "preprocessing run"
                    )
                rows.append(labels)
            needed = sum(f > 0 for f in self.split_fractions)
            if len(ids) < needed:
                raise DataError(
                    f"{client} has {len(ids)} cached stays, fewer than the {needed} non-empty splits of "
                    f"data.init_args.split_fractions={self.split_fractions}"
                )
            rng = np.random.default_rng([int(self.seed), hospital])
            parts = stratified_split(np.arange(len(ids)), np.zeros(len(ids)), self.split_fractions, rng)
            samples[client], targets[client] = ids, torch.tensor(np.asarray(rows), dtype=torch.float32)
            splits[client] = dict(zip(SPLITS, parts, strict=True))
        series, statics = widths if widths is not None else (0, 0)
        return SampleList(
            name="eicu",
            task="multitask",
            num_classes=len(TASKS),
            samples=samples,
            targets=targets,
            splits=splits,
            read=read,
            partitioner="Natural(hospitalid)",
            class_names=list(TASKS),
            details={
                "root": str(self.root),
                "tasks": TASK_CLASSES,
                "series_features": series,
                "static_features": statics,
                "max_hours": self.max_hours,
                "split_fractions": list(self.split_fractions),
                "test_hospitals": [f"hospital_{h}" for h in chosen[:5]],
                "stays": {f"hospital_{h}": len(by_hospital[h]) for h in chosen},
            },
        )


def rank_hospitals(stays: Mapping[int, list[int]]) -> list[int]:
    """Hospital ids by number of stays, largest first; ties by the smaller id."""
    return sorted(stays, key=lambda h: (-len(stays[h]), h))


def _patient_path(root: Path) -> Path | None:
    for name in (PATIENT, f"{PATIENT}.gz"):
        if (root / name).is_file():
            return root / name
    return None


def read_hospitals(path: Path) -> dict[int, int]:
    """``patientunitstayid`` -> ``hospitalid`` from eICU-CRD's patient table (``.csv`` or ``.csv.gz``).

    Raises:
        DataError: naming the file when a column is missing or a line's ids are not integers.
    """
    try:
        raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
        reader = csv.DictReader(io.StringIO(raw.decode("utf-8"), newline=""))
        columns = reader.fieldnames or []
        lacking = [c for c in ("patientunitstayid", "hospitalid") if c not in columns]
        if lacking:
            raise DataError(f"{path}: no column {lacking} (columns: {columns}); it must be eICU-CRD's patient table "
                            f"({URL})")  # fmt: skip
        out = {}
        for row in reader:
            try:
                out[int(row["patientunitstayid"])] = int(row["hospitalid"])
            except (TypeError, ValueError):
                raise DataError(
                    f"{path}, line {reader.line_num}: patientunitstayid {row['patientunitstayid']!r} and hospitalid "
                    f"{row['hospitalid']!r} must be integers"
                ) from None
    except (UnicodeDecodeError, gzip.BadGzipFile, EOFError, csv.Error) as err:
        raise DataError(f"{path} is not a readable CSV file ({type(err).__name__}: {err}); {layout()}") from None
    if not out:
        raise DataError(f"{path} lists no stay; {layout()}")
    return out


def _load(path: Path) -> dict[str, Any]:
    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise DataError(
            f"{path}: stay file not found (it was listed when the data set was built); {layout()}"
        ) from None
    except Exception as err:  # a truncated or foreign file: torch raises many types
        raise DataError(f"{path} is not a torch-saved stay ({type(err).__name__}: {err}); {layout()}") from None
    lacking = [k for k in ("ts", "statics", _BINARY_KEY, *_CLASS_KEYS.values()) if not isinstance(data, dict)
               or not isinstance(data.get(k), torch.Tensor)]  # fmt: skip
    if lacking:
        raise DataError(f"{path}: no tensor {lacking} in the stay's dict; {layout()}")
    return data


def read_labels(path: Path) -> tuple[list[float], tuple[int, int]]:
    """The six targets of one stay file in ``TASKS`` order (-1: unknown) and its (series, statics) widths.

    Raises:
        DataError: naming the file when a key is missing, a shape is wrong or a class is out of range.
    """
    data = _load(path)
    binary = data[_BINARY_KEY].float().reshape(-1)
    ts, statics = data["ts"], data["statics"].reshape(-1)
    if binary.numel() != 3 or ts.dim() != 2:
        raise DataError(f"{path}: {_BINARY_KEY} must hold 3 values and ts be (hours, features); got shapes "
                        f"{tuple(binary.shape)} and {tuple(ts.shape)}")  # fmt: skip
    labels = [float(v) if v == v else -1.0 for v in binary.tolist()]
    if any(v not in (0.0, 1.0, -1.0) for v in labels):
        raise DataError(f"{path}: {_BINARY_KEY} {binary.tolist()} must be 0, 1 or NaN (mort_24h, mort_48h, LOS)")
    for task, key in _CLASS_KEYS.items():
        value = data[key].reshape(-1)
        if value.numel() != 1:
            raise DataError(f"{path}: {key!r} must hold one class, got shape {tuple(data[key].shape)}")
        number = float(value.item())
        if number != number or number < 0:
            labels.append(-1.0)
        elif number != int(number) or number >= TASK_CLASSES[task]:
            raise DataError(f"{path}: {key!r} is {number}, not a class 0..{TASK_CLASSES[task] - 1} (or < 0: unknown)")
        else:
            labels.append(number)
    return labels, (int(ts.shape[1]), int(statics.numel()))


@dataclass(frozen=True)
class StayTensor:
    """Reads ``<root>/<stay>.pt`` as the float32 (``max_hours``, 1 + S + D) input of :class:`EICU` (mask column,
    the first ``max_hours`` hours of ``ts`` zero-padded, ``statics`` on every row).

    Raises:
        DataError: naming the file when it is missing or not a stay dict.
    """

    root: str
    max_hours: int

    def __call__(self, stay: int) -> torch.Tensor:
        data = _load(Path(self.root) / f"{stay}.pt")
        return pack_stay(data["ts"], data["statics"], self.max_hours)


def pack_stay(ts: torch.Tensor, statics: torch.Tensor, max_hours: int) -> torch.Tensor:
    """(``max_hours``, 1 + S + D): mask, ``ts`` (T, S) cut or zero-padded to ``max_hours`` rows with non-finite
    values set to 0, and ``statics`` (D,) on every row."""
    ts = torch.nan_to_num(ts.float(), nan=0.0, posinf=0.0, neginf=0.0)[:max_hours]
    statics = torch.nan_to_num(statics.float().reshape(-1), nan=0.0, posinf=0.0, neginf=0.0)
    out = torch.zeros(max_hours, 1 + ts.shape[1] + statics.numel())
    out[: len(ts), 0] = 1.0
    out[: len(ts), 1 : 1 + ts.shape[1]] = ts
    out[:, 1 + ts.shape[1] :] = statics
    return out


def mean_over_hospitals(clients: Mapping[str, Mapping[str, float]], hospitals: list[str], metric: str) -> float:
    """The mean of ``metric`` over ``hospitals`` (e.g. the manifest's ``test_hospitals``) in a results.json section's
    ``clients`` (``results["best"]["clients"]``): the paper's "train on K, test on the top 5" figure. NaN values
    (undefined AUROC) are left out, as the report's means leave them out; NaN when none is defined."""
    values = [float(clients[h][metric]) for h in hospitals if h in clients and metric in clients[h]]
    defined = [v for v in values if v == v]
    return sum(defined) / len(defined) if defined else float("nan")
