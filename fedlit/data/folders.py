"""``SiteFolders``: an image classification data set laid out as one folder per site, read lazily from files."""

from __future__ import annotations

import difflib
import os
import warnings
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from typing_extensions import override

from fedlit.core.errors import ConfigError, DataError, InputFileError
from fedlit.data.common.datamodule import FederatedDataModule, is_int
from fedlit.data.common.samples import (
    Compose,
    ImageFile,
    Normalize,
    SampleList,
    Transform,
    TransformSpec,
    class_sort_key,
    make_transform,
    split_samples,
)
from fedlit.data.common.site_options import check_site_names, class_index, class_names_problem, site_rng, warn_labels
from fedlit.data.common.splits import SPLITS, check_split_fractions
from fedlit.data.folders_read import check_sizes, image_files, read_labels, sub_folders

_OPTION = "data.init_args"


class SiteFolders(FederatedDataModule):
    """Images in one folder per site (client); labels from class sub-folders or a labels CSV. No code needed.

    Layout (each site on its own; sites may mix the two)::

        root/<site>/<class>/<image>            class sub-folders (images may sit deeper, e.g. per patient)
        root/<site>/labels.csv + images        a CSV with a file column (paths relative to the site folder)
                                               and a label column; it wins over sub-folders when present
        root/<site>/{train,val,test}/...       the site's own splits (either layout inside each), used as they
                                               are when ``train`` and ``test`` exist (``val`` optional)

    Sites are the sub-folders of ``root`` (sorted) or ``sites``. Class names are ``class_names`` when given (class
    ``i`` is ``class_names[i]`` on every site, a site lacking a class keeps the others' numbers, and a label not in
    the list is refused naming its folder or CSV line), else the union over the sites read, sorted (numerically
    when they are numbers), so class ``i`` is the same everywhere; the manifest records them
    under ``class_names``, and every client's files per split (paths relative to ``root``). Sites without their
    own splits are split by ``split_fractions``, stratified by class, seeded by ``seed`` and the site's name (a
    site's split does not depend on the other sites). On a Flower node (:meth:`only_site`) only the node's site
    folder is listed and read: ``root`` (node config ``overrides``: ``--data.init_args.root /data``) needs to hold
    that folder only; declare ``class_names`` in the recipe so that every node numbers the classes alike.

    Images (``.png``, ``.jpg``, ``.jpeg``, ``.bmp``, ``.tif``, ``.tiff``, ``.gif``, ``.webp``) are decoded with PIL
    in the DataLoader workers, turned grey or RGB (``channels``), scaled to float [0, 1] and resized to
    ``image_size``; then ``train_transform`` (train split) or ``eval_transform`` (val and test) is applied, then
    ``(x - mean) / std`` if ``mean`` and ``std`` are given. Class counts come from the file listing alone (with
    ``image_size`` null, the images' headers are read to refuse two sizes). An unreadable folder is refused; a FIFO,
    a link that cannot be followed and a link to a folder are skipped with a warning, as are rare classes (fewer
    than 5 images) and labels that are fractional numbers; a labels CSV listing a file twice is refused.

    Args:
        root: folder holding one sub-folder per site.
        sites: the site folders to use, in this order (default: all, sorted).
        task: ``multiclass``, or ``binary`` for exactly two classes (the second in sorted order is positive).
        channels: 1 (grey) or 3 (RGB).
        image_size: side of the square images fed to the model; ``null`` keeps each image's size (they must
            then all have the same size).
        split_fractions: (train, val, test) shares for sites without their own splits.
        labels_file: name of a site's labels CSV.
        file_column: the CSV column holding image paths, relative to the site folder.
        label_column: the CSV column holding class names.
        train_transform: a torchvision transform (``class_path``/``init_args``) or a list of them, applied to
            train images (augmentation); inputs are float (C, H, W) tensors.
        eval_transform: the same for val and test images (keep it deterministic).
        mean: per-channel mean for the final normalization (e.g. ImageNet's [0.485, 0.456, 0.406]).
        std: per-channel std for the final normalization.
        class_names: the classes in number order (the label map every site uses); default: the labels read.
        batch_size: training batch size.
        eval_batch_size: val/test batch size (default ``batch_size``).
        num_workers: DataLoader worker processes reading the images.
        seed: seed of the splits.
    """

    def __init__(
        self,
        *,
        root: str | os.PathLike,
        sites: list[str] | None = None,
        task: Literal["multiclass", "binary"] = "multiclass",
        channels: Literal[1, 3] = 3,
        image_size: int | None = 224,
        split_fractions: tuple[float, float, float] = (0.6, 0.2, 0.2),
        labels_file: str = "labels.csv",
        file_column: str = "file",
        label_column: str = "label",
        train_transform: TransformSpec = None,
        eval_transform: TransformSpec = None,
        mean: list[float] | None = None,
        std: list[float] | None = None,
        class_names: list[str] | None = None,
        batch_size: int = 32,
        eval_batch_size: int | None = None,
        num_workers: int = 0,
        seed: int = 0,
    ) -> None:
        super().__init__(batch_size=batch_size, eval_batch_size=eval_batch_size, num_workers=num_workers, seed=seed)
        problems = []
        if task not in ("multiclass", "binary"):
            problems.append(f"{_OPTION}.task must be 'multiclass' or 'binary', got {task!r}")
        if channels not in (1, 3):
            problems.append(f"{_OPTION}.channels must be 1 (grey) or 3 (RGB), got {channels!r}")
        if image_size is not None and (not is_int(image_size) or image_size < 1):
            problems.append(f"{_OPTION}.image_size must be null or an integer >= 1, got {image_size!r}")
        if (mean is None) != (std is None):
            problems.append(f"{_OPTION}.mean and {_OPTION}.std go together: give both or neither")
        elif mean is not None and std is not None:
            if len(mean) != channels or len(std) != channels:
                problems.append(
                    f"{_OPTION}.mean and std need one value per channel ({channels}), got {list(mean)} and {list(std)}"
                )
            elif any(not s > 0 for s in std):
                problems.append(f"{_OPTION}.std values must be > 0, got {list(std)}")
        try:
            check_split_fractions(split_fractions, f"{_OPTION}.split_fractions")
        except ValueError as err:
            problems.append(str(err))
        if (problem := class_names_problem(class_names, task)) is not None:
            problems.append(problem)
        if problems:
            raise ConfigError("; ".join(problems))
        self.class_index = class_index(class_names)
        self.root = Path(root).expanduser()
        if not self.root.is_dir():
            raise InputFileError(
                f"{_OPTION}.root: no folder {self.root}. It must hold one sub-folder per site, each with class "
                f"sub-folders of images or a {labels_file} listing images and labels"
            )
        if sites is not None:
            check_site_names(sites)
        # Listed sites are looked for when built: a node holds its own site folder only (only_site).
        self.sites = list(sites) if sites is not None else sub_folders(self.root)
        if not self.sites:
            raise InputFileError(
                f"{_OPTION}.root: {self.root} holds no site folder; put each site's images in {self.root}/<site>/"
            )
        self.requested_task, self.channels, self.image_size = task, channels, image_size
        self.split_fractions = tuple(float(f) for f in split_fractions)
        self.labels_file, self.file_column, self.label_column = labels_file, file_column, label_column
        self.train_transform = make_transform(train_transform, f"{_OPTION}.train_transform")
        self.eval_transform = make_transform(eval_transform, f"{_OPTION}.eval_transform")
        self.mean, self.std = mean, std

    @override
    def expected_num_clients(self) -> int | None:
        """One client per site of ``sites`` (known without reading an image)."""
        return len(self.sites) if self._data is None else super().expected_num_clients()

    @override
    def client_id_source(self) -> str:
        """The site folders."""
        return f"the site folders of {self.root} ({_OPTION}.root, {_OPTION}.sites)"

    def _built_sites(self) -> list[str]:
        """The sites to build (every one of ``sites``, or the node's own), each checked to be a folder of root."""
        sites = self.sites_to_build(self.sites)
        found = sub_folders(self.root)
        unknown = [s for s in sites if s not in found]
        if unknown:
            close = difflib.get_close_matches(unknown[0], found, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ConfigError(
                f"{_OPTION}.sites: {unknown} are not folders of {self.root}; its site folders are {found}{hint}"
            )
        return sites

    @override
    def build_samples(self) -> SampleList:
        listed: dict[str, dict[str, list[tuple[str, str]]]] = {}
        self._seen: dict[str, str] = {}  # class name -> where it first appears (a class folder, a labels line)
        self._skipped: list[str] = []  # entries neither folders nor regular files, links to folders
        layouts = {}
        for site in self._built_sites():
            folder = self.root / site
            own = [s for s in SPLITS if s in sub_folders(folder)]  # refuses an unreadable site folder
            if own and not ("train" in own and "test" in own):
                raise DataError(
                    f"{folder} has {own} sub-folders but not both train and test: a site's own splits "
                    "need train/ and test/ (val/ optional); add the missing one, or rename the folders "
                    "so that the site is split by split_fractions"
                )
            if own:
                listed[site] = {s: self._list(folder / s) for s in own}
                layouts[site] = "own splits: " + ", ".join(own)
            else:
                listed[site] = {"all": self._list(folder)}
                layouts[site] = self.labels_file if (folder / self.labels_file).is_file() else "class folders"
        if self._skipped:
            shown = "; ".join(self._skipped[:10]) + (
                f"; and {len(self._skipped) - 10} more" if len(self._skipped) > 10 else ""
            )
            warnings.warn(
                f"SiteFolders ({self.root}): skipped {len(self._skipped)} entries, not read as images: {shown}; "
                "replace each by the file it stands for, or remove it",
                stacklevel=3,
            )
        read = {label for groups in listed.values() for rows in groups.values() for _, label in rows}
        class_names = self._class_names(read)
        if self.requested_task == "binary" and len(class_names) != 2:
            seen = "; ".join(f"{c!r} first at {self._seen[c]}" for c in class_names)
            raise DataError(
                f"{_OPTION}.task='binary' needs exactly 2 classes; the sites of {self.root} have "
                f"{len(class_names)}: {class_names} ({seen}). Fix the labels there, or use task: "
                "multiclass"
            )
        index = {name: i for i, name in enumerate(class_names)}
        dtype = torch.float32 if self.requested_task == "binary" else torch.int64
        samples, targets, splits = {}, {}, {}
        for site, groups in listed.items():
            rows = [row for group in groups.values() for row in group]
            samples[site] = [path for path, _ in rows]
            targets[site] = torch.tensor([index[label] for _, label in rows], dtype=dtype)
            if "all" in groups:
                splits.update(
                    split_samples(
                        {site: targets[site]},
                        self.split_fractions,
                        site_rng(self.seed, site),
                        self.requested_task,
                        f"{_OPTION}.split_fractions",
                    )
                )
            else:
                bounds = np.cumsum([0] + [len(groups.get(s, [])) for s in SPLITS])
                splits[site] = {s: np.arange(bounds[i], bounds[i + 1]) for i, s in enumerate(SPLITS)}
        counts = torch.bincount(torch.cat(list(targets.values())).long(), minlength=len(class_names)).tolist()
        warn_labels(
            f"SiteFolders ({self.root})",
            dict(zip(class_names, counts, strict=True)),
            self._seen,
            declared=self.class_index is not None,
        )
        if self.image_size is None:
            check_sizes(self.root, [path for paths in samples.values() for path in paths])
        normalize = [Normalize(self.mean, self.std)] if self.mean is not None and self.std is not None else []
        return SampleList(
            name=self.root.name,
            task=self.requested_task,
            num_classes=1 if self.requested_task == "binary" else len(class_names),
            samples=samples,
            targets=targets,
            splits=splits,
            read=ImageFile(root=str(self.root), channels=self.channels, image_size=self.image_size),
            train_transform=_chain(self.train_transform, normalize),
            eval_transform=_chain(self.eval_transform, normalize),
            class_names=class_names,
            details={
                "root": str(self.root),
                "layouts": layouts,
                "split_fractions": list(self.split_fractions),
                "channels": self.channels,
                "image_size": self.image_size,
                "train_transform": repr(self.train_transform),
                "eval_transform": repr(self.eval_transform),
            },
        )

    def _class_names(self, read: set[str]) -> list[str]:
        """The declared ``class_names`` (every label read must be one), else the labels read, sorted."""
        if self.class_index is None:
            if self.only_client is not None:
                warnings.warn(
                    f"SiteFolders ({self.root}): the classes are numbered by the labels this node reads "
                    f"({sorted(read, key=class_sort_key)[:10]}); a site lacking or adding a class numbers "
                    f"them differently. Declare them in the recipe with {_OPTION}.class_names",
                    stacklevel=4,
                )
            return sorted(read, key=class_sort_key)
        unknown = sorted(read - set(self.class_index), key=class_sort_key)
        if unknown:
            where = "; ".join(f"{c!r} first at {self._seen[c]}" for c in unknown[:5])
            raise DataError(
                f"{_OPTION}.class_names {list(self.class_index)} lacks labels of {self.root}: {where}. "
                "Fix the labels there, or add the class to class_names (in the recipe, so that every "
                "site numbers the classes alike)"
            )
        return list(self.class_index)

    @override
    def preprocessing(self, client_id: str) -> dict[str, Any]:
        """The default's record plus what the loader does to an image file: decoded with PIL, turned grey or RGB
        (``channels``), scaled to [0, 1] (8-bit / 255, 16-bit / 65535), resized to ``image_size`` (bilinear,
        antialiased), then ``(x - mean) / std`` per channel when ``mean`` and ``std`` are given. A custom
        ``eval_transform`` is recorded by its ``repr`` only."""
        return {
            **super().preprocessing(client_id),
            "normalization": {
                "kind": "image",
                "channels": self.channels,
                "size": self.image_size,
                "scale": "8-bit / 255, 16-bit / 65535",
                "mean": self.mean,
                "std": self.std,
                "eval_transform": None if self.eval_transform is None else repr(self.eval_transform),
            },
        }

    def _list(self, folder: Path) -> list[tuple[str, str]]:
        """(path relative to ``root``, class name) of every image in ``folder``, in a stable order."""
        table = folder / self.labels_file
        if table.is_file():
            return read_labels(table, self.root, self.file_column, self.label_column, self._seen)
        rows = []
        for class_dir in sub_folders(folder, self._skipped):
            files = image_files(folder / class_dir, self._skipped)
            rows += [(p.relative_to(self.root).as_posix(), class_dir) for p in files]
            if files:
                self._seen.setdefault(class_dir, str(folder / class_dir))
        if not rows:
            raise DataError(
                f"{folder} holds no image: give it class sub-folders of images ({folder}/<class>/<image>) or a "
                f"{self.labels_file} with columns {self.file_column!r} and {self.label_column!r}, or drop the "
                f"site with {_OPTION}.sites"
            )
        return rows


def _chain(transform: Transform | None, after: list[Normalize]) -> Transform | None:
    if not after:
        return transform
    return Compose([transform, *after]) if transform is not None else Compose(after)
