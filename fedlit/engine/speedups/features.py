"""Frozen features computed once (``federation.cache_features``): a frozen feature extractor's output for every
sample, computed at its first use and read back, so the clients train and evaluate their heads alone.

Where every tensor of a module's :attr:`~fedlit.module.FederatedModule.feature_extractor` (``backbone`` of
:class:`~fedlit.tasks.ClassificationModule`) is frozen, and nothing in it or in the data is random, the extractor gives
each sample the same features at every round. :class:`FeatureCache` wraps the run's data: the first time a client's
split is read, it runs the extractor once over the split (in the module's mode of that split: as in training for the
train split, evaluation mode for the others; in the run's precision) and keeps the features, on the run's device
(``memory``), and also in ``out_dir/feature_cache`` (``disk``), where a resumed run finds them again. Every loader then
gives the features (as :class:`~fedlit.module.CachedFeatures`, which the module passes through instead of running
the extractor) with the same batches, in the same order, drawing the same random numbers as the data's own loader, so
the run's random streams are unchanged.

Exactness: the evaluation splits are read in the same batches as without the cache, so their features, hence the
metrics, are the same bit for bit; a train batch is a shuffled mix of samples whose features were computed in other
batches, which a backend's kernels may round differently in the last bit (a different matrix-product blocking for
another batch size): the results then equal those of the run without the cache to float rounding.

The cache is refused, with a warning, and the run goes on without it (its results are the same, only slower), when the
module has no feature extractor, an extractor tensor trains (a ``shared`` or ``personal`` role: LoRA, a trained
backbone), a layer of the extractor is random in training (dropout or drop path with a rate above 0: a frozen
module without tensors of its own stays in train mode) or normalizes with the statistics of the batch, or the train
split's transform differs from the evaluation one (random augmentation; the data sets' transforms of
:class:`~fedlit.data.common.samples.SampleList`). A pool's transform applies to every split and must be deterministic.
"""

from __future__ import annotations

import hashlib
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset, RandomSampler, SequentialSampler
from typing_extensions import override

from fedlit.core.checkpoint_io import save_checkpoint
from fedlit.core.errors import ConfigError, broken
from fedlit.data.common.datamodule import FederatedDataModule, SplitName
from fedlit.data.common.loader import Loader
from fedlit.data.common.samples import SampleList
from fedlit.engine.loop.client import batch_statistics_layers
from fedlit.engine.loop.resume import fingerprint
from fedlit.module import CachedFeatures, FederatedModule

if TYPE_CHECKING:
    from lightning.fabric import Fabric

    from fedlit.engine.loop.run import Run

#: ``out_dir/<FOLDER>`` holds the features of ``cache_features: disk``.
FOLDER = "feature_cache"


def feature_data(run: Run) -> FeatureCache | None:
    """The run's data behind a :class:`FeatureCache` when ``federation.cache_features`` asks for one and the module
    and data allow it; None otherwise (warning why, when asked for)."""
    mode = run.settings.cache_features
    if mode == "off":
        return None
    problem = cache_problem(run.module, run.datamodule)
    if problem is not None:
        warnings.warn(
            f"federation.cache_features={mode!r} is off for this run: {problem}. The run computes the "
            "features at every pass (same results, slower); set federation.cache_features: off to silence "
            "this.",
            stacklevel=2,
        )
        return None
    if not (isinstance(run.datamodule, FederatedDataModule)):  # cache_problem refuses other data
        raise broken("cache_problem refuses other data")
    return FeatureCache(run.datamodule, run.module, run.fabric, run.out_dir / FOLDER if mode == "disk" else None)


def cache_problem(module: FederatedModule, data: Any) -> str | None:
    """Why ``module``'s feature extractor may not be computed once for ``data`` (its roles set), or None."""
    name = module.feature_extractor
    if name is None:
        return f"{type(module).__name__} declares no feature_extractor (a frozen prefix the cache could skip)"
    roles = module.parameter_roles()
    trained = [n for n in module.state_names() if n.startswith(f"{name}.") and roles[n] != "frozen"]
    if trained:
        return (
            f"{len(trained)} tensors of the {name} train ({trained[0]!r} is {roles[trained[0]]!r}): only a "
            f"{name} frozen whole gives the same features at every round"
        )
    extractor = getattr(module, name)
    modes = {m: m.training for m in module.modules()}
    module.set_train_mode()
    try:
        random = [n or name for n, m in extractor.named_modules() if m.training and _random(m)]
        batch = batch_statistics_layers(extractor)
    finally:
        _restore(modes)
    if random:
        return (
            f"the layers {random[:3]} of the {name} are random in training (dropout or drop path with a rate "
            "above 0): set their rate to 0 to cache"
        )
    if batch:
        return f"the BatchNorm layers {batch[:3]} of the {name} normalize with the statistics of the batch"
    if not isinstance(data, FederatedDataModule):
        return f"the data {type(data).__name__} is not a FederatedDataModule"
    built = data.data
    if isinstance(built, SampleList) and repr(built.train_transform) != repr(built.eval_transform):
        return (
            f"the train split's transform {built.train_transform!r} differs from the evaluation one "
            f"{built.eval_transform!r} (random augmentation gives other inputs at every pass): to cache, train "
            "on the evaluation transform (e.g. data.init_args.train_transform: null)"
        )
    return None


def _random(module: nn.Module) -> bool:
    """Whether ``module``, in train mode, is a dropout-like layer with a rate above 0 (or an unknown rate)."""
    if "drop" not in type(module).__name__.lower():
        return False
    rates = [
        getattr(module, a)
        for a in ("p", "drop_prob", "drop_rate", "rate")
        if isinstance(getattr(module, a, None), int | float)
    ]
    return not rates or any(r > 0 for r in rates)


def _restore(modes: dict[nn.Module, bool]) -> None:
    for module, training in modes.items():
        module.training = training


class FeatureCache:
    """The run's data, its loaders giving the features of the module's frozen extractor (see the module docstring).

    Everything but the loaders is the wrapped data's (``num_examples``, ``class_counts``, ``batch_size``...).

    Args:
        data: The run's data.
        module: The live module, its roles set; its extractor wholly frozen (:func:`cache_problem`).
        fabric: The run's Fabric: the device and precision the features are computed in.
        folder: Where the features are also written and read back (``cache_features: disk``), or None.
    """

    def __init__(
        self, data: FederatedDataModule, module: FederatedModule, fabric: Fabric, folder: Path | None = None
    ) -> None:
        self.data, self.module, self.fabric, self.folder = data, module, fabric, folder
        self._cached: dict[tuple[str, str], tuple[Tensor, Tensor]] = {}
        self._fingerprint: str | None = None
        #: How many splits had their features computed (not read from the disk) in this process.
        self.computed = 0

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name == "data":
            raise AttributeError(name)
        return getattr(self.data, name)

    @property
    def client_ids(self) -> list[str]:
        return self.data.client_ids

    @property
    def train_client_ids(self) -> list[str]:
        return self.data.train_client_ids

    def setup(self) -> None:
        self.data.setup()

    def num_examples(self, client_id: str, split: str) -> int:
        return self.data.num_examples(client_id, cast(SplitName, split))  # the loop asks for its three splits

    def class_counts(self) -> dict[str, dict[str, list[int]]] | None:
        return self.data.class_counts()

    def manifest(self) -> dict[str, Any]:
        return self.data.manifest()

    def train_dataloader(self, client_id: str, generator: torch.Generator) -> DataLoader:
        """The features of ``client_id``'s train split, in the batches and order of the data's own loader."""
        return self._loader(client_id, "train", self.data.train_dataloader(client_id, generator))

    def val_dataloader(self, client_id: str) -> DataLoader | None:
        loader = self.data.val_dataloader(client_id)
        return None if loader is None else self._loader(client_id, "val", loader)

    def test_dataloader(self, client_id: str) -> DataLoader | None:
        loader = self.data.test_dataloader(client_id)
        return None if loader is None else self._loader(client_id, "test", loader)

    def _loader(self, client_id: str, split: str, loader: DataLoader) -> DataLoader:
        """A loader over the cached features that batches, shuffles and draws random numbers as ``loader``."""
        sampler = loader.sampler
        plain = (
            type(sampler) in (RandomSampler, SequentialSampler)
            and loader.batch_size is not None
            and not (isinstance(sampler, RandomSampler) and (sampler.replacement or sampler._num_samples is not None))
        )
        if not plain:
            raise ConfigError(
                f"federation.cache_features: {type(self.data).__name__}'s {split} loader samples in a "
                "way the cache cannot repeat (a custom sampler); set federation.cache_features: off."
            )
        features, targets = self._features(client_id, split, loader)
        return DataLoader(
            _FeatureSubset(features, targets),
            batch_size=loader.batch_size,
            shuffle=isinstance(sampler, RandomSampler),
            generator=loader.generator,
            drop_last=loader.drop_last,
            # torch types collate_fn as taking a list of samples; __getitems__ gives it one tuple.
            collate_fn=_collate,  # type: ignore[arg-type]
        )

    def _features(self, client_id: str, split: str, loader: DataLoader) -> tuple[Tensor, Tensor]:
        key = (client_id, split)
        if key not in self._cached:
            path = None if self.folder is None else self._path(client_id, split)
            if path is not None and path.is_file():
                saved = torch.load(path, map_location="cpu", weights_only=True)
                self._cached[key] = saved["features"].to(self.fabric.device), saved["targets"]
            else:
                self._cached[key] = self._compute(split, loader)
                self.computed += 1
                if path is not None:
                    features, targets = self._cached[key]
                    save_checkpoint(path, {"features": features.cpu(), "targets": targets})
        return self._cached[key]

    def _compute(self, split: str, loader: DataLoader) -> tuple[Tensor, Tensor]:
        """The extractor's output for every sample of ``loader``'s data set, in order, and their targets."""
        module, fabric = self.module, self.fabric
        precision = fabric.strategy.precision
        name = module.feature_extractor
        if not (name is not None):
            raise broken("cache_problem refuses a module without one")
        extractor = getattr(module, name)
        # Its own generator: the run's global random stream stays as the uncached run leaves it.
        reader = Loader(  # a worker's DataError reaches the user with its own message, as in training
            loader.dataset,
            batch_size=loader.batch_size,
            shuffle=False,
            num_workers=loader.num_workers,
            collate_fn=loader.collate_fn,
            generator=torch.Generator(),
        )
        modes = {m: m.training for m in module.modules()}
        if split == "train":  # the modes of training (a frozen module in eval mode), as the turn sets them
            module.set_train_mode()
        else:
            module.eval()
        features, targets = [], []
        try:
            with torch.no_grad():
                for batch in reader:
                    if not (isinstance(batch, list | tuple) and len(batch) == 2 and isinstance(batch[1], Tensor)):
                        raise ConfigError(
                            f"federation.cache_features: {type(self.data).__name__}'s batches are not "
                            "(inputs, targets) pairs; set federation.cache_features: off."
                        )
                    inputs = precision.convert_input(fabric.to_device(batch[0]))
                    with fabric.autocast():
                        out = extractor(inputs)
                    if not isinstance(out, Tensor):
                        raise ConfigError(
                            f"federation.cache_features: model.{name} returns a "
                            f"{type(out).__name__}, not a tensor; set federation.cache_features: off."
                        )
                    features.append(out.detach())
                    targets.append(batch[1])
        finally:
            _restore(modes)
        return torch.cat(features), torch.cat(targets)

    def _path(self, client_id: str, split: str) -> Path:
        """The file of a client's split, named by what its features depend on: the extractor (class, tensors), the
        precision, the split's transform and samples."""
        if not (self.folder is not None):
            raise broken("only a disk cache has files")
        if self._fingerprint is None:
            name = self.module.feature_extractor
            if not (name is not None):
                raise broken("cache_problem refuses a module without one")
            frozen = {n: t for n, t in self.module.named_tensors("frozen").items() if n.startswith(f"{name}.")}
            self._fingerprint = f"{type(getattr(self.module, name)).__qualname__}:{fingerprint(frozen)}"
        built = self.data.data
        indices = [int(i) for i in built.splits[client_id][split]]
        digest = hashlib.sha256(
            "\n".join(
                [
                    self._fingerprint,
                    type(self.fabric.strategy.precision).__name__,
                    repr(self.fabric.device),
                    type(self.data).__qualname__,
                    built.name,
                    repr(indices),
                ]
            ).encode()
        )
        if isinstance(built, SampleList):  # the files' names (their contents are taken to stay as they are)
            digest.update(repr(built.train_transform if split == "train" else built.eval_transform).encode())
            digest.update("\n".join(str(s) for s in built.samples[client_id]).encode())
        else:  # the samples themselves: a pool generated with another seed may give the same indices
            digest.update(repr(built.transform).encode())
            digest.update(fingerprint({"inputs": built.inputs[torch.as_tensor(indices, dtype=torch.int64)]}).encode())
        return self.folder / client_id / f"{split}-{digest.hexdigest()[:24]}.pt"


class _FeatureSubset(Dataset):
    """Cached features and targets, read a batch at a time."""

    def __init__(self, features: Tensor, targets: Tensor) -> None:
        self.features, self.targets = features, targets

    def __len__(self) -> int:
        return len(self.targets)

    def __getitems__(self, positions: list[int]) -> tuple[Tensor, Tensor]:
        rows = torch.as_tensor(positions, dtype=torch.int64)
        return self.features[rows.to(self.features.device)], self.targets[rows]

    @override
    def __getitem__(self, position: int) -> tuple[Tensor, Tensor]:
        return self.features[position], self.targets[position]


def _collate(batch: tuple[Tensor, Tensor]) -> list[Tensor]:
    """``[features, targets]``, as the data's loaders collate ``(input, target)`` samples."""
    features, targets = batch
    return [features.as_subclass(CachedFeatures), targets]
