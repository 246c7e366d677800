"""MedMNIST v2 images (any subset) partitioned into clients, with the FHBench protocol."""

from __future__ import annotations

import os
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
import torch.nn.functional as F
from typing_extensions import override

from fedlit.core.errors import ConfigError, DataError, InputFileError
from fedlit.data.common.datamodule import FederatedDataModule
from fedlit.data.common.partition import Dirichlet, Partitioner
from fedlit.data.common.pool import PartitionedData, TaskType
from fedlit.data.common.splits import check_split_fractions, split_clients

_SPLITS = ("train", "val", "test")
_KEYS = tuple(f"{split}_{kind}" for split in _SPLITS for kind in ("images", "labels"))
_ZENODO = "https://zenodo.org/records/10519652"
_TASKS = ("auto", "multiclass", "binary", "multilabel")


@dataclass(frozen=True)
class MedMNISTTransform:
    """Turns a uint8 batch (B, C, H, W) into float32: scale to [0, 1], set channels, resize, normalize."""

    channels: int
    image_size: int | None
    normalize: bool

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        x = images.float() / 255.0
        if self.channels == 3 and x.shape[1] == 1:
            x = x.expand(-1, 3, -1, -1)
        elif self.channels == 1 and x.shape[1] == 3:
            # ITU-R BT.601 luma, the usual RGB -> grey weights.
            x = (x * torch.tensor([0.299, 0.587, 0.114]).view(1, 3, 1, 1)).sum(dim=1, keepdim=True)
        if self.image_size is not None and x.shape[-1] != self.image_size:
            x = F.interpolate(x, size=(self.image_size, self.image_size), mode="bilinear", antialias=True)
        return (x - 0.5) / 0.5 if self.normalize else x


class MedMNIST(FederatedDataModule):
    """A MedMNIST v2 ``.npz`` (PneumoniaMNIST, OrganAMNIST, ChestMNIST...) split into ``num_clients`` clients.

    Source: Yang et al., "MedMNIST v2", Scientific Data 2023; files at https://zenodo.org/records/10519652
    (``<flag>.npz``, or ``<flag>_{64,128,224}.npz`` for larger images). License: CC BY 4.0 (the MedMNIST
    data sets; some source sets are more restrictive, see medmnist.com).

    Protocol (FHBench): the official train, val and test splits are pooled (pool rows: train, then val, then
    test; ``manifest()["details"]["pool"]`` gives the ranges), the pool is partitioned into clients by
    ``partitioner`` (default Dir(0.5); FHBench uses Dir(0.1) and 20 clients), and each client is split into
    train/val/test by ``split_fractions`` (4:3:3), stratified by label. Images (pixels 0..255, whole numbers in any
    numeric dtype; others are refused) are kept as uint8 and turned into float32 batches when read:
    (x / 255 - 0.5) / 0.5 if ``normalize``. For multilabel sets (ChestMNIST)
    partitions and strata use each image's rarest positive label (an extra "none" class for all-negative).

    The file is checked when the data is built: an unreadable archive (truncated, not a zip, a missing key, an
    array of Python objects), non-finite pixels or labels, labels that are negative or not whole numbers, and
    binary or multilabel labels other than 0/1 are refused naming the file, the key and the first bad index.

    Args:
        path: the ``.npz`` file (keys ``{train,val,test}_{images,labels}``).
        num_clients: number of clients; ids ``client_0``, ``client_1``, ...
        partitioner: how the pool is split into clients (default ``Dirichlet(alpha=0.5)``).
        split_fractions: (train, val, test) fractions of every client; val may be 0 (no validation split).
        task: ``"auto"`` infers it from the labels: one column -> multiclass with max + 1 classes, several ->
            multilabel. ``"binary"`` needs one 0/1 column and gives float targets.
        channels: output channels: ``None`` keeps the file's, 3 repeats grey images, 1 turns RGB into grey.
        image_size: resize to this height and width (bilinear), ``None`` keeps the file's size.
        normalize: map [0, 1] to [-1, 1].
        batch_size: training batch size.
        eval_batch_size: val/test batch size (default ``batch_size``).
        num_workers: DataLoader worker processes.
        seed: seed of the partition and the splits.
    """

    def __init__(
        self,
        *,
        path: str | os.PathLike,
        num_clients: int = 10,
        partitioner: Partitioner | None = None,
        split_fractions: tuple[float, float, float] = (0.4, 0.3, 0.3),
        task: Literal["auto", "multiclass", "binary", "multilabel"] = "auto",
        channels: int | None = None,
        image_size: int | None = None,
        normalize: bool = True,
        batch_size: int = 32,
        eval_batch_size: int | None = None,
        num_workers: int = 0,
        seed: int = 0,
    ) -> None:
        super().__init__(batch_size=batch_size, eval_batch_size=eval_batch_size, num_workers=num_workers, seed=seed)
        check_split_fractions(split_fractions)
        problems = []
        if isinstance(num_clients, bool) or not isinstance(num_clients, int) or num_clients < 1:
            problems.append(f"data.init_args.num_clients must be an integer >= 1, got {num_clients!r}")
        if partitioner is not None and not isinstance(partitioner, Partitioner):
            problems.append(
                f"data.init_args.partitioner must be a Partitioner (IID, Dirichlet, Pathological, Shards), "
                f"got {partitioner!r}"
            )
        if task not in _TASKS:
            problems.append(f"data.init_args.task must be one of {list(_TASKS)}, got {task!r}")
        if channels not in (None, 1, 3):
            problems.append(f"data.init_args.channels must be null, 1 or 3, got {channels!r}")
        if image_size is not None and (not isinstance(image_size, int) or image_size < 1):
            problems.append(f"data.init_args.image_size must be null or an integer >= 1, got {image_size!r}")
        if problems:
            raise ConfigError("; ".join(problems))
        self.path = Path(path).expanduser()
        if not self.path.is_file():
            raise InputFileError(_missing_file_message(self.path))
        self.num_clients = num_clients
        self.partitioner: Partitioner = partitioner if partitioner is not None else Dirichlet(alpha=0.5)
        self.split_fractions = tuple(float(f) for f in split_fractions)
        self.requested_task = task
        self.channels = channels
        self.image_size = image_size
        self.normalize = normalize

    @override
    def build(self) -> PartitionedData:
        arrays = _load(self.path)
        for split in _SPLITS:
            n_images, n_labels = len(arrays[f"{split}_images"]), len(arrays[f"{split}_labels"])
            if n_images != n_labels:
                raise DataError(
                    f"{self.path}: {split}_images has {n_images} images but {split}_labels has {n_labels} "
                    f"labels; the file is damaged: download it again from {_ZENODO}"
                )
        # whole numbers in 0..255 (checked when read): the same pixels as uint8, a quarter or eighth the memory
        images = np.concatenate([arrays[f"{s}_images"] for s in _SPLITS]).astype(np.uint8, copy=False)
        labels = np.concatenate(
            [
                a.reshape(len(a), a.shape[1] if a.ndim == 2 else 1)  # (N,) -> (N, 1), even N = 0
                for a in (arrays[f"{s}_labels"] for s in _SPLITS)
            ]
        )
        sizes = [len(arrays[f"{s}_labels"]) for s in _SPLITS]
        if images.ndim not in (3, 4) or (images.ndim == 4 and images.shape[-1] not in (1, 3)):
            raise DataError(f"{self.path}: images must be (N, H, W) or (N, H, W, 3), got {images.shape}")
        task, num_classes, targets, strata = self._resolve_task(labels, sizes)

        inputs = (
            torch.from_numpy(images).unsqueeze(1) if images.ndim == 3 else torch.from_numpy(images).permute(0, 3, 1, 2)
        )
        part_rng, split_rng = np.random.default_rng(self.seed).spawn(2)
        parts = self.partitioner(strata, self.num_clients, part_rng)
        client_ids = [f"client_{i}" for i in range(self.num_clients)]
        bounds = np.cumsum([0, *sizes])
        return PartitionedData(
            name=self.path.stem,
            task=task,
            num_classes=num_classes,
            inputs=inputs.contiguous(),
            targets=targets,
            splits=split_clients(parts, strata, self.split_fractions, split_rng, client_ids),
            partitioner=repr(self.partitioner),
            transform=MedMNISTTransform(
                channels=self.channels or inputs.shape[1],
                image_size=self.image_size,
                normalize=self.normalize,
            ),
            details={
                "path": str(self.path),
                "pool": {s: [int(bounds[i]), int(bounds[i + 1])] for i, s in enumerate(_SPLITS)},
                "split_fractions": list(self.split_fractions),
            },
        )

    @override
    def preprocessing(self, client_id: str) -> dict[str, Any]:
        """The default's record plus what the loader does to a MedMNIST uint8 image: / 255, grey repeated to RGB
        or RGB turned grey (BT.601 luma) for ``channels``, resized to ``image_size`` (bilinear, antialiased), then
        ``(x - 0.5) / 0.5`` per channel with ``normalize``."""
        base = super().preprocessing(client_id)
        channels = int(base["input"]["channels"])  # the file's, unless ``channels`` set them
        return {
            **base,
            "normalization": {
                "kind": "image",
                "channels": channels,
                "size": self.image_size,
                "scale": "uint8 / 255",
                "mean": [0.5] * channels if self.normalize else None,
                "std": [0.5] * channels if self.normalize else None,
            },
        }

    def _resolve_task(self, labels: np.ndarray, sizes: list[int]) -> tuple[TaskType, int, torch.Tensor, np.ndarray]:
        """Task, class count, target tensor and one stratum label per sample (for partition and splits);
        ``labels`` are the pooled (N, L) labels, ``sizes`` the samples of each official split in the pool."""
        single = labels.shape[1] == 1
        task = self.requested_task
        if task == "auto":
            task = "multiclass" if single else "multilabel"
        if single == (task == "multilabel"):
            raise DataError(
                f"data.init_args.task={self.requested_task!r} does not fit labels of shape {labels.shape} in "
                f"{self.path}: multiclass and binary need one label column, multilabel several; use task: "
                "auto"
            )
        if task in ("binary", "multilabel"):
            bad = ~np.isin(labels, (0, 1))
            if bad.any():
                row, column = np.argwhere(bad)[0]
                key, index = _locate(int(row), sizes)
                where = f"{key}[{index}]" if single else f"{key}[{index}, {column}]"
                fix = "use task: multiclass" if task == "binary" else "binarize the labels"
                raise DataError(
                    f"data.init_args.task={task!r} needs 0/1 labels; {self.path}: {where} is "
                    f"{labels[row, column].item()} (labels present: {np.unique(labels).tolist()}): {fix}"
                )
        if task == "multilabel":
            # Rarest positive label first, so that rare findings drive the partition; L = "no finding".
            frequency = labels.sum(axis=0)
            rank = np.where(labels > 0, frequency[None, :], np.inf)
            strata = np.where(np.isinf(rank.min(axis=1)), labels.shape[1], rank.argmin(axis=1))
            return "multilabel", labels.shape[1], torch.from_numpy(labels.astype(np.float32)), strata
        flat = labels[:, 0].astype(np.int64)
        if task == "binary":
            return "binary", 1, torch.from_numpy(flat.astype(np.float32)), flat
        return "multiclass", int(flat.max()) + 1, torch.from_numpy(flat), flat


def _load(path: Path) -> dict[str, np.ndarray]:
    """The six arrays of a MedMNIST ``.npz``, read without unpickling anything.

    Raises:
        DataError: naming the file (and the key) when the file is not a readable ``.npz``, lacks a key, or
            holds an array that is not plain numbers.
    """
    download = _download_hint(path)
    try:
        archive = np.load(path)
    except (zipfile.BadZipFile, EOFError, OSError, ValueError) as err:
        # NumPy's message for a file that is neither a zip nor a .npy talks about pickles: not our advice.
        why = f"{type(err).__name__}: {err}"
        if isinstance(err, ValueError):
            why = "it starts neither like a zip archive nor like a .npy array"
        raise DataError(
            f"{path} (data.init_args.path) is not a readable .npz archive ({why}); the file is truncated or "
            f"is not a MedMNIST file: {download}"
        ) from None
    if not isinstance(archive, np.lib.npyio.NpzFile):
        raise DataError(
            f"{path} (data.init_args.path) holds a single .npy array, not a .npz archive with the keys "
            f"{list(_KEYS)}: {download}"
        )
    arrays = {}
    with archive:
        missing = [key for key in _KEYS if key not in archive.files]
        if missing:
            raise DataError(
                f"{path} (data.init_args.path) lacks keys {missing}; it has {sorted(archive.files)}. A MedMNIST "
                f".npz has {list(_KEYS)}: {download}"
            )
        for key in _KEYS:
            try:
                arrays[key] = archive[key]
            except ValueError as err:
                if "pickle" not in str(err) and "Object arrays" not in str(err):
                    raise DataError(f"{path}: key {key!r} cannot be read ({err}); {download}") from None
                raise DataError(
                    f"{path}: key {key!r} holds Python objects (an object array), which fedlit does not load: a "
                    f"MedMNIST file holds plain numeric arrays; {download}, or save the arrays again as numbers "
                    "(e.g. images.astype(np.uint8))"
                ) from None
            except (zipfile.BadZipFile, EOFError, OSError, zlib.error) as err:
                raise DataError(
                    f"{path}: key {key!r} cannot be read ({type(err).__name__}: {err}); the file is damaged: {download}"
                ) from None
            _check_values(path, key, arrays[key])
    _check_shapes(path, arrays)
    return arrays


def _check_shapes(path: Path, arrays: dict[str, np.ndarray]) -> None:
    """Refuse arrays of the wrong number of dimensions, or splits whose images (or labels) differ in shape."""
    for key, array in arrays.items():
        images = key.endswith("_images")
        if images and not (array.ndim == 3 or (array.ndim == 4 and array.shape[-1] in (1, 3))):
            expected = "(N, H, W) for grey images or (N, H, W, 3) for colour ones"
        elif not images and array.ndim not in (1, 2):
            expected = "(N,) or (N, L): one row of L labels per image"
        else:
            continue
        raise DataError(
            f"{path}: array {key!r} has shape {array.shape}; a MedMNIST file holds {expected}. "
            f"Save it again in that shape, or {_download_hint(path)}"
        )
    for kind in ("images", "labels"):
        # labels (N,) are (N, 1)
        shapes = {key: arrays[key].shape[1:] or (1,) for key in (f"{s}_{kind}" for s in _SPLITS)}
        if len(set(shapes.values())) > 1:
            shown = ", ".join(f"{key} {('N', *shape)}" for key, shape in shapes.items())
            raise DataError(
                f"{path}: the splits' {kind} differ in shape ({shown}); every split must have the same "
                f"{'image size and channels' if kind == 'images' else 'labels per image'}. "
                f"Fix the file or {_download_hint(path)}"
            )


def _check_values(path: Path, key: str, array: np.ndarray) -> None:
    """Refuse an array of ``key`` that is not numeric, holds NaN/Inf, (images) pixels outside 0..255 or fractional
    ones, or (labels) negative or fractional values."""
    if not (np.issubdtype(array.dtype, np.number) or array.dtype == np.bool_):
        raise DataError(f"{path}: key {key!r} must hold numbers, got dtype {array.dtype}: {_download_hint(path)}")
    floating = np.issubdtype(array.dtype, np.floating)
    checks = [(floating, lambda a: ~np.isfinite(a), "not a finite number")]
    if key.endswith("_images"):  # pixels as MedMNIST stores them: uint8, read as x / 255
        checks += [
            (
                True,
                lambda a: (a < 0) | (a > 255),
                "outside the pixel range 0..255 (MedMNIST images are uint8; rescale to 0..255 and save as np.uint8)",
            ),
            (
                floating,
                lambda a: np.isfinite(a) & (a != np.round(a)),
                "not a whole number: pixels are uint8 0..255 "
                "(an array scaled to [0, 1]? save (images * 255)"
                ".round().astype(np.uint8))",
            ),
        ]
    if key.endswith("_labels"):
        checks += [
            (True, lambda a: a < 0, "a negative label (labels are class numbers 0, 1, ...)"),
            (floating, lambda a: np.isfinite(a) & (a != np.round(a)), "not a whole number (labels are class numbers)"),
        ]
    for applies, find, what in checks:
        if not applies:
            continue
        with np.errstate(invalid="ignore"):
            bad = find(array)
        if bad.any():
            index = tuple(int(i) for i in np.argwhere(bad)[0])
            raise DataError(
                f"{path}: {key}[{', '.join(map(str, index))}] is {array[index].item()}, {what}; "
                f"{int(bad.sum())} such values in {key}. Fix the file or {_download_hint(path)}"
            )


def _download_hint(path: Path) -> str:
    return f"download {path.stem}.npz again from {_ZENODO}"


def _locate(row: int, sizes: list[int]) -> tuple[str, int]:
    """The labels key and the index in it of pool row ``row`` (pool rows: train, then val, then test)."""
    ends = np.cumsum(sizes)
    split = int(np.searchsorted(ends, row, side="right"))
    return f"{_SPLITS[split]}_labels", row - (int(ends[split - 1]) if split else 0)


def _missing_file_message(path: Path) -> str:
    found = sorted(p.name for p in path.glob("*.npz")) if path.is_dir() else []
    if path.is_dir():
        hint = f"it is a folder; give the .npz file inside it ({found or 'none found'})"
    else:
        hint = (
            f"download {path.stem if path.suffix == '.npz' else '<flag>'}.npz from https://zenodo.org/records/10519652"
        )
    return f"data.init_args.path: no MedMNIST .npz file at {path}: {hint}"
