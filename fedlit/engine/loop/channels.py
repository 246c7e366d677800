"""The images' channels against the model's input channels, checked when a run is set up.

A grey data set (PneumoniaMNIST, a folder of grey PNGs) given to a model built for RGB (``in_channels: 3``), or
the reverse, would otherwise fail inside the first convolution of the first training step, with a message about
weight shapes. The data's channels are read from one evaluation sample (no random transform, so no random number
is drawn); the model's from the first module, in registration order, that is a convolution (its ``in_channels``)
or that declares an integer ``in_channels`` itself (a network that adapts its input, like ``SamAdapter``, which
repeats grey images to RGB).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from torch import Tensor, nn

from fedlit.data.common.datamodule import FederatedDataModule

if TYPE_CHECKING:
    from fedlit.engine.loop.run import Run


def channel_problem(run: Run) -> str | None:
    """What is wrong when the data's images do not have the channels the model expects (None when they do, or
    when either is unknown: the data is not images, or the model has no convolution nor ``in_channels``)."""
    expected = model_in_channels(run.module)
    if expected is None or not isinstance(run.datamodule, FederatedDataModule):
        return None
    image = _first_tensor(_one_sample(run.datamodule))
    if image is None or image.dim() != expected[1]:
        return None
    found = int(image.shape[0])
    if found == expected[0]:
        return None
    model_option = _option(run.config.get("model"), "model", ("in_channels", "in_chans")) or ("the model's in_channels")
    data_option = "data.init_args.channels" if hasattr(run.datamodule, "channels") else None
    fix = (
        f"set {data_option}: {expected[0]} (grey is repeated to RGB, RGB made grey) or {model_option}: {found}"
        if data_option and expected[0] in (1, 3)
        else f"set {model_option}: {found}"
    )
    return (
        f"the data gives {found}-channel images ({type(run.datamodule).__name__}"
        f"{f', {data_option}' if data_option else ''}) but the model expects {expected[0]} input channels "
        f"({model_option}); {fix}"
    )


def model_in_channels(module: nn.Module) -> tuple[int, int] | None:
    """The input channels the model expects and the number of dimensions of one input sample (3 for images:
    channels, height, width), or None when it has no convolution nor a module declaring ``in_channels``."""
    for sub in module.modules():
        if isinstance(sub, nn.modules.conv._ConvNd):
            if isinstance(sub.weight, nn.parameter.UninitializedParameter):  # a lazy convolution: any channels
                return None
            return int(sub.in_channels), sub.weight.dim() - 1
        declared = getattr(sub, "in_channels", None)
        if isinstance(declared, int) and not isinstance(declared, bool) and declared > 0:
            return declared, 3
    return None


def _one_sample(data: FederatedDataModule) -> Any:
    """One evaluation sample of the first client that has one (its input and target), or None."""
    for client_id in data.client_ids:
        for split in ("test", "val", "train"):
            if data.num_examples(client_id, split) > 0:
                loader = (
                    data.val_dataloader(client_id)
                    if split == "val"
                    else (data.test_dataloader(client_id) if split == "test" else None)
                )
                if loader is not None:
                    return loader.dataset[0]
    return None


def _first_tensor(sample: Any) -> Tensor | None:
    if isinstance(sample, Tensor):
        return sample
    items = sample.values() if isinstance(sample, Mapping) else sample if isinstance(sample, list | tuple) else ()
    for item in items:
        if (found := _first_tensor(item)) is not None:
            return found
    return None


def _option(section: Any, prefix: str, names: tuple[str, ...]) -> str | None:
    """The dotted key, under ``prefix``, of the first option named one of ``names`` in a recipe section."""
    if isinstance(section, Mapping):
        for key, value in section.items():
            if key in names and isinstance(value, int):
                return f"{prefix}.{key}"
            if (found := _option(value, f"{prefix}.{key}", names)) is not None:
                return found
    return None
