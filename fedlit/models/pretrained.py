"""Reading local weight files and loading them into a built backbone, by name or by position, never silently.

A checkpoint is data, never code: `.pth/.pt/.bin/.ckpt` files are read with `torch.load(weights_only=True)`
and `.safetensors` with safetensors. Every tensor that is not loaded, on either side, ends up in the
`LoadReport`; a shape mismatch is an error.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
from torch import Tensor, nn

from fedlit.core.errors import ConfigError, InputFileError

__all__ = ["CHECKPOINT_SUFFIXES", "LoadReport", "load_checkpoint", "read_state_dict"]

CHECKPOINT_SUFFIXES = (".pth", ".pt", ".bin", ".ckpt", ".safetensors")
"""File suffixes `read_state_dict` accepts."""

# Keys under which training frameworks nest the model's state dict (Lightning, DeiT/MAE, plain scripts).
_NESTED_KEYS = ("state_dict", "model", "model_state_dict", "module")
# Top-level classifier names of timm, torchvision and efficientnet_pytorch checkpoints.
_CLASSIFIER = re.compile(r"^(_fc|fc|classifier|head|heads|last_linear)(\.|$)")
_COUNTER = "num_batches_tracked"
_MAX_LISTED = 10


@dataclass
class LoadReport:
    """What `load_checkpoint` did with each tensor.

    Attributes:
        path: The file read.
        key_mapping: How checkpoint tensors were matched to the model's (`"name"` or `"position"`).
        loaded: Model key -> checkpoint key, for every tensor copied into the model.
        missing: Model keys that got no tensor: they keep their initial (random) values.
        unexpected: Checkpoint keys that were not used (other than a classifier).
        dropped_classifier: Checkpoint classifier keys that the headless model lacks.
    """

    path: Path
    key_mapping: str
    loaded: dict[str, str] = field(default_factory=dict)
    missing: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    dropped_classifier: list[str] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        """True when every model tensor was loaded and every checkpoint tensor used."""
        return not (self.missing or self.unexpected or self.dropped_classifier)

    def summary(self) -> str:
        """A multi-line account of what was loaded and, in full, of every key that was not."""
        lines = [f"loaded {len(self.loaded)} tensors from {self.path} by {self.key_mapping}"]
        if self.dropped_classifier:
            lines.append(
                f"dropped the checkpoint's classifier ({len(self.dropped_classifier)} tensors, the backbone "
                f"is headless): {', '.join(self.dropped_classifier)}"
            )
        if self.missing:
            lines.append(
                f"{len(self.missing)} model tensors are not in the checkpoint and stay randomly initialized: "
                f"{', '.join(self.missing)}"
            )
        if self.unexpected:
            lines.append(f"{len(self.unexpected)} checkpoint tensors were not used: {', '.join(self.unexpected)}")
        return "\n".join(lines)


def read_state_dict(path: str | Path) -> dict[str, Tensor]:
    """Read a state dict from a local file, without running any code stored in it.

    A state dict nested under `state_dict`, `model`, `model_state_dict` or `module` (Lightning, MAE/DeiT
    checkpoints) is taken from there, and a `module.` prefix on every key (DistributedDataParallel) is
    removed.

    Args:
        path: A `.pth`, `.pt`, `.bin`, `.ckpt` or `.safetensors` file.

    Returns:
        Key -> tensor, in the file's order.

    Raises:
        FileNotFoundError: If `path` is not a file.
        ValueError: If the suffix is not supported or the file holds no state dict of tensors.
    """
    path = Path(path).expanduser()
    if not path.is_file():
        raise InputFileError(f"no checkpoint file at {path.resolve()}")
    if path.suffix not in CHECKPOINT_SUFFIXES:
        raise ConfigError(f"{path}: unsupported suffix {path.suffix!r}; expected one of {CHECKPOINT_SUFFIXES}")
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        obj: object = load_file(str(path), device="cpu")
    else:
        try:
            obj = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as error:  # noqa: BLE001 - re-raised with the reason a checkpoint may not load
            raise ConfigError(
                f"{path} could not be read with torch.load(weights_only=True): fedlit never unpickles code, "
                f"so a checkpoint must hold tensors only (save `model.state_dict()`). Reason: {error}"
            ) from error
    return _as_state_dict(obj, path)


def _as_state_dict(obj: object, path: Path) -> dict[str, Tensor]:
    if not isinstance(obj, Mapping):
        raise ConfigError(f"{path} holds a {type(obj).__name__}, not a state dict")
    mapping: Mapping[str, Any] = obj
    if not all(isinstance(value, Tensor) for value in mapping.values()):
        nested = next((k for k in _NESTED_KEYS if isinstance(mapping.get(k), Mapping)), None)
        if nested is None:
            raise ConfigError(
                f"{path} is not a state dict of tensors and has none nested under {_NESTED_KEYS}; "
                f"its top-level keys are {list(mapping)[:_MAX_LISTED]}"
            )
        mapping = mapping[nested]
    not_tensors = [k for k, v in mapping.items() if not isinstance(v, Tensor)]
    if not_tensors:
        raise ConfigError(f"{path}: entries that are not tensors: {not_tensors[:_MAX_LISTED]}")
    state = dict(mapping)
    if state and all(k.startswith("module.") for k in state):
        state = {k.removeprefix("module."): v for k, v in state.items()}
    return state


def load_checkpoint(
    model: nn.Module, path: str | Path, *, key_mapping: Literal["name", "position"] = "name"
) -> LoadReport:
    """Copy a checkpoint's tensors into `model` in place and report what was and was not loaded.

    With `key_mapping="name"`, tensors go to the model keys of the same name. With `"position"`, the i-th
    checkpoint tensor goes to the i-th model tensor (`state_dict()` order), for checkpoints saved by another
    implementation of the same architecture (e.g. `efficientnet_pytorch` weights into timm's EfficientNet);
    BatchNorm `num_batches_tracked` counters are paired among themselves, so a checkpoint without them still
    lines up. Classifier tensors the headless model lacks (`_fc.*`, `fc.*`, `classifier.*`, `head.*`) are
    dropped: by name when they are unexpected keys, by position when they trail the checkpoint.

    Args:
        model: The module to load into.
        path: The weight file (see `read_state_dict`).
        key_mapping: `"name"` or `"position"`.

    Returns:
        The report; nothing is left out of it.

    Raises:
        ValueError: On any shape mismatch (all of them listed), or an unknown `key_mapping`.
    """
    path = Path(path).expanduser()
    checkpoint = read_state_dict(path)
    target = model.state_dict()
    if key_mapping == "name":
        report, pairs = _match_by_name(target, checkpoint, path)
    elif key_mapping == "position":
        report, pairs = _match_by_position(target, checkpoint, path)
    else:
        raise ConfigError(f"key_mapping={key_mapping!r} is not one of 'name', 'position'")
    mismatches = [
        f"{model_key} {tuple(target[model_key].shape)} <- {ckpt_key} {tuple(checkpoint[ckpt_key].shape)}"
        for model_key, ckpt_key in pairs.items()
        if target[model_key].shape != checkpoint[ckpt_key].shape
    ]
    if mismatches:
        hint = " (is it the same architecture, with the same model_args?)" if key_mapping == "position" else ""
        raise ConfigError(
            f"{path}: {len(mismatches)} tensors have another shape than the model's{hint}: "
            + "; ".join(mismatches[:_MAX_LISTED])
            + (f"; and {len(mismatches) - _MAX_LISTED} more" if len(mismatches) > _MAX_LISTED else "")
        )
    model.load_state_dict({model_key: checkpoint[ckpt_key] for model_key, ckpt_key in pairs.items()}, strict=False)
    report.loaded = pairs
    return report


def _split_unused(unused: list[str], report: LoadReport) -> None:
    report.dropped_classifier = [k for k in unused if _CLASSIFIER.match(k)]
    report.unexpected = [k for k in unused if not _CLASSIFIER.match(k)]


def _match_by_name(
    target: dict[str, Tensor], checkpoint: dict[str, Tensor], path: Path
) -> tuple[LoadReport, dict[str, str]]:
    report = LoadReport(path=path, key_mapping="name")
    pairs = {key: key for key in target if key in checkpoint}
    report.missing = [key for key in target if key not in checkpoint]
    _split_unused([key for key in checkpoint if key not in target], report)
    return report, pairs


def _match_by_position(
    target: dict[str, Tensor], checkpoint: dict[str, Tensor], path: Path
) -> tuple[LoadReport, dict[str, str]]:
    report = LoadReport(path=path, key_mapping="position")
    pairs: dict[str, str] = {}
    missing: list[str] = []
    unused: list[str] = []
    # Counters are paired apart from the weights so that a checkpoint saved without them still lines up.
    for is_counter in (False, True):
        model_keys = [k for k in target if k.endswith(_COUNTER) == is_counter]
        ckpt_keys = [k for k in checkpoint if k.endswith(_COUNTER) == is_counter]
        pairs.update(zip(model_keys, ckpt_keys, strict=False))
        missing += model_keys[len(ckpt_keys) :]
        unused += ckpt_keys[len(model_keys) :]
    # Keep the model's order in the report.
    report.missing = [key for key in target if key in set(missing)]
    _split_unused(unused, report)
    return report, pairs
