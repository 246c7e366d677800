"""The file-backed path of ``FederatedDataModule``: per client, a list of samples read lazily.

A data set that cannot (or should not) sit in memory as one tensor pool implements ``build_samples()`` and
returns a :class:`SampleList`: per client, the *identities* of its samples (file paths relative to a root, or
indices into a ``torch.utils.data.Dataset``), their targets, and its train/val/test split. Inputs are read one
sample at a time by ``read`` inside the DataLoader workers; targets are known up front, so class counts and the
manifest never touch an input. Train and evaluation batches go through separate transforms.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch
from torch import nn
from torch.utils.data import Dataset
from typing_extensions import override

from fedlit.core.errors import ConfigError, DataError
from fedlit.data.common.splits import SPLITS, split_problems, stratified_split

CLASSIFICATION = ("multiclass", "binary", "multilabel")
IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".tif", ".tiff", ".gif", ".webp")
Transform = Callable[[torch.Tensor], torch.Tensor]
# identity -> input, or -> an (input, target) pair (segmentation), which the transforms then take and give jointly.
Reader = Callable[[Any], torch.Tensor | tuple[torch.Tensor, torch.Tensor]]
# What a recipe gives as a transform: one torchvision transform (an nn.Module, as class_path/init_args), or a
# list of them applied in order.
TransformSpec = nn.Module | list[nn.Module] | None


@dataclass(frozen=True)
class SampleList:
    """What a file-backed data set builds once: every client's samples, targets and splits.

    Attributes:
        name: data set name, recorded in the manifest.
        task: the task the targets serve; ``"multiclass"`` (int64 targets (n,)), ``"binary"`` (float32 0/1 (n,))
            and ``"multilabel"`` (float32 (n, L)) are checked and give class counts; any other name (a
            regression or survival task) is passed through unchecked.
        num_classes: classes (multiclass), 1 (binary), labels (multilabel) or outputs (other tasks).
        samples: client id -> identities of its samples, in a stable order: JSON values (file paths relative to
            the data set's root, or dataset indices) that ``read`` turns into an input; recorded in the manifest.
        targets: client id -> targets of its samples, first dimension = ``len(samples[client])``.
        splits: client id -> split name -> sorted positions into ``samples[client]``; every client has all
            three splits (an empty ``val`` means no validation split).
        read: identity -> input tensor; must be picklable (it runs in DataLoader workers) and should raise
            ``DataError`` naming the file when a sample cannot be read. A reader may instead return an
            ``(input, target)`` pair (segmentation: an image and its mask); the transforms then get and return the
            pair (so flips apply to both), and ``targets`` only serve the checks.
        train_transform: applied to each input of a train split (augmentation); ``None`` = none.
        eval_transform: applied to each input of a val or test split (deterministic); ``None`` = none.
        partitioner: how clients were formed, recorded in the manifest.
        class_names: name of each class index, recorded in the manifest (``None`` when unnamed).
        details: extra JSON-serializable facts for the manifest (root folder, options).
        evaluation_only: clients that never train: their train split may be empty; every round evaluates them
            with what the strategy sends a client that has not trained (the global model for most strategies),
            as a site that only tests a model built elsewhere would. Recorded in the manifest.
    """

    name: str
    task: str
    num_classes: int
    samples: dict[str, list[Any]]
    targets: dict[str, torch.Tensor]
    splits: dict[str, dict[str, np.ndarray]]
    read: Reader
    train_transform: Transform | None = None
    eval_transform: Transform | None = None
    partitioner: str = "Natural()"
    class_names: list[str] | None = None
    details: dict[str, Any] = field(default_factory=dict)
    evaluation_only: frozenset[str] = frozenset()


class SampleSubset(Dataset):
    """The samples of one client's split: ``read(identity)``, then ``transform``, paired with the target (or, when
    ``read`` returns an ``(input, target)`` pair, that pair through ``transform``)."""

    def __init__(
        self,
        identities: Sequence[Any],
        targets: torch.Tensor,
        positions: np.ndarray,
        read: Reader,
        transform: Transform | None = None,
    ) -> None:
        self.identities = [identities[int(i)] for i in positions]
        self.targets = targets[torch.as_tensor(np.asarray(positions, dtype=np.int64))]
        self.read = read
        self.transform = transform

    def __len__(self) -> int:
        return len(self.identities)

    @override
    def __getitem__(self, position: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.read(self.identities[position])
        if isinstance(x, tuple):  # the reader gives (input, target), e.g. an image and its mask: transformed together
            return cast(Any, self.transform)(x) if self.transform is not None else x  # a joint transform
        if self.transform is not None:
            x = self.transform(x)
        return x, self.targets[position]


class Compose(nn.Module):
    """Applies ``transforms`` in order (an ``nn.Module`` so it pickles into workers and prints its parts)."""

    def __init__(self, transforms: Sequence[Callable[[Any], Any]]) -> None:
        super().__init__()
        self.transforms = list(transforms)

    @override
    def forward(self, x: Any) -> Any:
        for transform in self.transforms:
            x = transform(x)
        return x

    @override
    def __repr__(self) -> str:
        return f"Compose({self.transforms!r})"


class Normalize(nn.Module):
    """(x - mean) / std per channel, for (C, H, W) or (B, C, H, W) float images."""

    def __init__(self, mean: Sequence[float], std: Sequence[float]) -> None:
        super().__init__()
        self.mean, self.std = [float(m) for m in mean], [float(s) for s in std]

    @override
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = (-1, 1, 1)
        return (x - torch.tensor(self.mean).view(shape)) / torch.tensor(self.std).view(shape)


def make_transform(spec: Any, option: str) -> Transform | None:
    """One callable from a recipe's transform: ``None``, a callable, or a list of callables (composed).

    Raises:
        ValueError: naming ``option`` when ``spec`` (or an entry of it) is not callable.
    """
    if spec is None:
        return None
    parts = list(spec) if isinstance(spec, list | tuple) else [spec]
    bad = [repr(p) for p in parts if not callable(p)]
    if bad:
        raise ConfigError(
            f"{option} must be a transform (e.g. class_path: torchvision.transforms.v2.RandomHorizontalFlip) or a "
            f"list of them; {', '.join(bad)} is not callable"
        )
    return parts[0] if len(parts) == 1 else Compose(parts)


@dataclass(frozen=True)
class ImageFile:
    """Reads ``root / identity`` as a float32 (channels, H, W) image in [0, 1], resized to ``image_size``.

    Grey images are repeated to 3 channels and colour images turned grey (ITU-R BT.601 luma, PIL's ``"L"``) as
    ``channels`` asks. 8-bit images are divided by 255, 16-bit grey ones (PIL modes ``I;16``, ``I``) by 65535;
    float images (mode ``F``) are kept as they are. Resizing is bilinear with antialiasing, to ``image_size`` x
    ``image_size``.

    Raises:
        DataError: naming the file when it is missing or is not an image PIL can decode.
    """

    root: str
    channels: int = 3
    image_size: int | None = None

    def __call__(self, identity: str) -> torch.Tensor:
        from PIL import Image
        from torchvision.transforms.v2 import functional as TF

        path = Path(self.root) / identity
        try:
            with Image.open(path) as image:
                if image.mode.startswith(("I", "F")):  # 16/32-bit integer or float grey: PIL's "L" would clip
                    scale = 65535.0 if image.mode.startswith("I") else 1.0
                    grey = torch.from_numpy(np.asarray(image, dtype=np.float32) / scale)[None]
                    return self._resize(grey.expand(self.channels, -1, -1))
                image = image.convert("L" if self.channels == 1 else "RGB")
        except FileNotFoundError:
            raise DataError(
                f"{path}: image file not found (it was listed when the data set was built); "
                "restore it, or rebuild the run's data without it"
            ) from None
        except image_errors() as err:
            raise unreadable_image(path, err, "replace the file or remove it from the data set") from None
        return self._resize(TF.pil_to_tensor(image).float().div_(255.0))

    def _resize(self, x: torch.Tensor) -> torch.Tensor:
        from torchvision.transforms.v2 import functional as TF

        if self.image_size is not None and tuple(x.shape[-2:]) != (self.image_size, self.image_size):
            x = TF.resize(x.contiguous(), [self.image_size, self.image_size], antialias=True)
        return x.contiguous()

    def missing(self, identities: Sequence[str]) -> list[str]:
        """The identities whose file does not exist under ``root``."""
        return [i for i in identities if not (Path(self.root) / i).is_file()]


def image_errors() -> tuple[type[BaseException], ...]:
    """What PIL raises for an image file it cannot open or decode (a damaged, truncated or oversized one)."""
    import struct
    import zlib

    from PIL import Image

    return (
        OSError,
        ValueError,
        SyntaxError,
        EOFError,
        struct.error,
        zlib.error,
        Image.DecompressionBombError,
        Image.DecompressionBombWarning,
    )  # the warning is raised only where warnings are made errors


def unreadable_image(path: Path, error: BaseException, fix: str = "replace it") -> DataError:
    """The error for an image file PIL cannot read (``error``, one of :func:`image_errors`), naming the file."""
    from PIL import Image

    if isinstance(error, Image.DecompressionBombError | Image.DecompressionBombWarning):
        return DataError(
            f"{path}: refused as a possible decompression bomb: {error} PIL's limit is PIL.Image.MAX_IMAGE_PIXELS "
            f"({Image.MAX_IMAGE_PIXELS} pixels; over twice that is an error). If the file is trusted, raise it "
            "(PIL.Image.MAX_IMAGE_PIXELS = None lifts it) in code imported before the data is read, e.g. the module "
            f"of your model or data class; else {fix}"
        )
    return DataError(f"{path}: cannot be read as an image ({type(error).__name__}: {error}); {fix}")


def split_samples(
    targets: dict[str, torch.Tensor],
    fractions: Sequence[float],
    rng: np.random.Generator,
    task: str,
    option: str = "data.init_args.split_fractions",
) -> dict[str, dict[str, np.ndarray]]:
    """Split every client's samples into train/val/test positions by ``fractions``, seeded by ``rng``.

    Stratified by class for multiclass and binary targets, by the first positive label for multilabel ones, by the
    event flag for survival ones, plain random otherwise (see :func:`fedlit.data.common.splits.stratified_split`). The
    same ``rng`` state gives the same splits.

    Raises:
        DataError: naming the client when it has fewer samples than the splits it must fill.
    """
    needed = sum(f > 0 for f in fractions)
    splits = {}
    for client_id, y in targets.items():
        if len(y) < needed:
            raise DataError(
                f"client {client_id!r} has {len(y)} samples, fewer than the {needed} non-empty splits of "
                f"{option}={tuple(fractions)}: add samples to that site or drop it"
            )
        parts = stratified_split(np.arange(len(y)), strata(y, task), fractions, rng)
        splits[client_id] = dict(zip(SPLITS, parts, strict=True))
    return splits


def strata(targets: torch.Tensor, task: str) -> np.ndarray:
    """One integer per sample to stratify on: the class, the first positive label (L if none), the event flag
    (survival targets (N, 2): time, event), or 0."""
    if task in ("multiclass", "binary"):
        return targets.long().reshape(len(targets)).numpy()
    if task == "survival":
        return (targets[:, 1] > 0.5).long().numpy()
    if task == "multilabel":
        positive = targets.reshape(len(targets), -1) > 0
        first = positive.float().argmax(dim=1)
        return torch.where(positive.any(dim=1), first, positive.shape[1]).numpy()
    return np.zeros(len(targets), dtype=np.int64)


def check_samples(data: SampleList, owner: str) -> None:
    """Refuse a sample list no client could train or be evaluated on (every problem listed).

    Checks: targets as many as samples, finite; multiclass targets integers in ``[0, num_classes)``; binary and
    multilabel targets 0/1; every client with train, val and test positions in range and non-empty train and
    test splits; for :class:`ImageFile` readers, every listed file exists (the first few missing ones named).

    Raises:
        DataError: naming ``owner`` (the data set class), the client and the sample.
    """
    where = f"{owner} ({data.name})"
    problems = []
    if not data.samples:
        problems.append(f"{where} builds no client: it lists no samples")
    for client_id, identities in data.samples.items():
        y = data.targets.get(client_id)
        splits = data.splits.get(client_id, {})
        if y is None or len(y) != len(identities):
            problems.append(
                f"{where}: client {client_id!r} has {len(identities)} samples but "
                f"{'no' if y is None else len(y)} targets"
            )
            continue
        problems += _target_problems(where, client_id, identities, y, data.task, data.num_classes)
        problems += split_problems(
            where,
            client_id,
            splits,
            len(identities),
            unit="position",
            fix="add samples to that site or change split_fractions",
            train_required=client_id not in data.evaluation_only,
        )
        if isinstance(data.read, ImageFile):
            absent = data.read.missing(identities)
            if absent:
                shown = ", ".join(str(Path(data.read.root) / a) for a in absent[:3])
                problems.append(
                    f"client {client_id!r}: {len(absent)} listed files do not exist ({shown}"
                    f"{', ...' if len(absent) > 3 else ''}); restore them or drop them from the list"
                )
    if data.samples and not set(data.samples) - set(data.evaluation_only):
        problems.append(
            f"{where}: every client is evaluation-only ({sorted(data.evaluation_only)}); at least one client must train"
        )
    extra = sorted(set(data.splits) - set(data.samples))
    if extra:
        problems.append(f"{where}: splits name clients without samples: {extra}")
    if problems:
        raise DataError("; ".join(problems))


def _target_problems(
    where: str, client_id: str, identities: Sequence[Hashable], y: torch.Tensor, task: str, num_classes: int
) -> list[str]:
    def first(bad: torch.Tensor) -> str:
        i = int(bad.reshape(len(y), -1).any(dim=1).nonzero()[0, 0])
        return f"sample {identities[i]!r} of client {client_id!r} has target {y[i].tolist()}"

    if y.is_floating_point() and not torch.isfinite(y).all():
        return [f"{where}: {first(~torch.isfinite(y))}, not finite; fix or drop it"]
    if task == "multiclass":
        if y.is_floating_point() or y.dtype == torch.bool:
            return [
                f"{where}: multiclass targets must be integers (int64), got {y.dtype} for client "
                f"{client_id!r}; convert them with .long(), or declare the task binary or multilabel"
            ]
        bad = (y < 0) | (y >= num_classes)
        if bad.any():
            return [
                f"{where}: {first(bad)}, outside the {num_classes} classes 0..{num_classes - 1} "
                f"({int(bad.sum())} such targets); fix the labels or raise num_classes"
            ]
    if task in ("binary", "multilabel"):
        bad = (y != 0) & (y != 1)
        if bad.any():
            return [
                f"{where}: {task} targets must be 0 or 1: {first(bad)} ({int(bad.sum())} such values); "
                "binarize the labels or use the multiclass task"
            ]
    return []


def class_sort_key(name: str) -> tuple[int, float, str]:
    """Sort class names numerically when they are numbers ("2" before "10"), else alphabetically."""
    try:
        return (0, float(name), name)
    except ValueError:
        return (1, 0.0, name)


def is_image(path: str | os.PathLike) -> bool:
    """Whether ``path`` has an image file extension (``IMAGE_EXTENSIONS``, any case)."""
    return Path(path).suffix.lower() in IMAGE_EXTENSIONS
