"""Loading an original SAM or MedSAM checkpoint into :class:`fedlit.models.SamAdapter`'s network, and resizing
SAM's position tables to another image size.

Tensors are copied by key and shape; ``pos_embed`` and the relative position tables of global-attention blocks
are interpolated to the built size. Every key not loaded is reported. A file whose keys match too few of the
image encoder's tensors (``min_loaded``, all of them by default) is refused: its adapters would train on a
randomly initialized frozen encoder. The refusal names the prefix (``sam.``, ``module.``, ``model.``...) whose
removal or addition would make the keys match, when there is one.
"""

from __future__ import annotations

import math
import warnings
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, cast

from torch import Tensor, nn
from torch.nn import functional as F

from fedlit.core.errors import CheckpointError, ConfigError
from fedlit.models.sam.variants import VARIANTS

if TYPE_CHECKING:
    from segment_anything.modeling import ImageEncoderViT

__all__ = ["SamLoadReport", "key_prefix_fix", "load_sam_checkpoint", "resize_pos_embed", "resize_rel_pos"]

OPTION = "model.init_args.network.init_args"
GET_WEIGHTS = (
    "SAM: https://github.com/facebookresearch/segment-anything (e.g. sam_vit_b_01ec64.pth for variant vit_b); "
    "MedSAM: https://github.com/bowang-lab/MedSAM (medsam_vit_b.pth, variant vit_b). Download the file on a "
    "machine with internet access, put it on this machine (e.g. under checkpoints/) and give its path"
)
_LISTED = 5


def resize_pos_embed(pos_embed: Tensor, grid: tuple[int, int]) -> Tensor:
    """SAM's (1, h, w, C) absolute position embedding resized (bicubic) to ``grid``."""
    if tuple(pos_embed.shape[1:3]) == tuple(grid):
        return pos_embed
    resized = F.interpolate(pos_embed.permute(0, 3, 1, 2), size=tuple(grid), mode="bicubic", align_corners=False)
    return resized.permute(0, 2, 3, 1)


def resize_rel_pos(table: Tensor, length: int) -> Tensor:
    """A (L, head_dim) relative position table resized (linear, as SAM's ``get_rel_pos``) to ``length`` rows."""
    return F.interpolate(table.T.unsqueeze(0), size=length, mode="linear", align_corners=False)[0].T


@dataclass
class SamLoadReport:
    """What loading a SAM checkpoint did with each tensor.

    Attributes:
        path: The file read.
        loaded: Model keys that received the file's tensor.
        resized: Model key -> (file shape, model shape) for the tensors interpolated on the way (``pos_embed``,
            relative position tables of global-attention blocks).
        missing_adapters: Adapter tensors the file lacks: they keep their initialization (expected with SAM).
        missing: Other model keys not in the file: they keep their initialization.
        unexpected: File keys that were not used.
    """

    path: Path
    loaded: list[str] = field(default_factory=list)
    resized: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] = field(default_factory=dict)
    missing_adapters: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        """True when every model tensor was loaded and every file tensor used."""
        return not (self.missing_adapters or self.missing or self.unexpected)

    def summary(self) -> str:
        """One line per kind of tensor; every non-adapter key not loaded is named."""
        lines = [f"loaded {len(self.loaded)} tensors from {self.path}"]
        if self.resized:
            lines.append(
                f"interpolated {len(self.resized)} to the built image size: "
                + ", ".join(f"{k} {old} -> {new}" for k, (old, new) in self.resized.items())
            )
        if self.missing_adapters:
            lines.append(f"{len(self.missing_adapters)} adapter tensors kept at initialization (not in the file)")
        if self.missing:
            lines.append(
                f"{len(self.missing)} model tensors not in the file keep their initialization: "
                + ", ".join(self.missing)
            )
        if self.unexpected:
            lines.append(f"{len(self.unexpected)} tensors of the file were not used: " + ", ".join(self.unexpected))
        return "\n".join(lines)


def key_prefix_fix(file_keys: list[str], model_keys: set[str]) -> tuple[str, str] | None:
    """The prefix that makes most of ``file_keys`` match ``model_keys``: ``("strip", "sam.")`` when the file's
    keys carry it (``sam.image_encoder.x`` for ``image_encoder.x``), ``("add", "image_encoder.")`` when they lack
    it (``blocks.0.x``); None when no prefix makes a key match. A prefix ends at a dot."""
    votes: Counter[tuple[str, str]] = Counter()
    by_suffix: dict[str, str] = {}
    for key in model_keys:
        parts = key.split(".")
        for i in range(1, len(parts)):
            by_suffix.setdefault(".".join(parts[i:]), ".".join(parts[:i]) + ".")
    for key in file_keys:
        parts = key.split(".")
        stripped = next((i for i in range(1, len(parts)) if ".".join(parts[i:]) in model_keys), None)
        if stripped is not None:
            votes["strip", ".".join(parts[:stripped]) + "."] += 1
        elif key in by_suffix:
            votes["add", by_suffix[key]] += 1
    return votes.most_common(1)[0][0] if votes else None


def load_sam_checkpoint(
    net: nn.Module, path: str | Path, *, min_loaded: float = 1.0, key_prefix: str = ""
) -> SamLoadReport:
    """Copy an original SAM/MedSAM state dict into ``net`` (a ``SamAdapterNet``) by key and shape, interpolating
    ``pos_embed`` and the global-attention relative position tables to the built size, and warn about every key
    not loaded.

    Args:
        net: The built network.
        path: The ``.pth`` file.
        min_loaded: The share of the image encoder's tensors (adapters left out) that must load.
        key_prefix: Removed from the start of every file key that has it before matching (e.g. ``sam.``).

    Raises:
        ConfigError: The file does not exist.
        CheckpointError: It cannot be read, a shape differs in a way interpolation cannot explain, or fewer than
            ``min_loaded`` of the image encoder's tensors are in it.
    """
    from fedlit.models.pretrained import read_state_dict

    path = Path(path).expanduser()
    if not path.is_file():
        raise ConfigError(
            f"{OPTION}.checkpoint={str(path)!r}: no such file ({path.resolve()}). Get SAM or MedSAM "
            f"weights: {GET_WEIGHTS} as {OPTION}.checkpoint; or set it to null (random weights)."
        )
    try:
        state = read_state_dict(path)
    except ValueError as error:
        raise CheckpointError(f"{OPTION}.checkpoint: {error}") from error
    if key_prefix:
        state = {k.removeprefix(key_prefix): v for k, v in state.items()}
    target = net.state_dict()
    report, chosen = _match(net, state, target, path)
    _check_encoder_share(report, target, min_loaded, path)
    net.load_state_dict(chosen, strict=False)
    if not report.complete:
        warnings.warn(f"SamAdapter checkpoint: {report.summary()}", stacklevel=2)
    return report


def _match(
    net: nn.Module, state: dict[str, Tensor], target: dict[str, Tensor], path: Path
) -> tuple[SamLoadReport, dict[str, Tensor]]:
    """The report and the tensors to load (resized where needed); raises on a shape no resizing explains."""
    encoder = cast("ImageEncoderViT", net.image_encoder)  # net is a SamAdapterNet
    global_blocks = {f"image_encoder.blocks.{i}.attn." for i, b in enumerate(encoder.blocks) if b.window_size == 0}
    report = SamLoadReport(path=path)
    chosen: dict[str, Tensor] = {}
    mismatches = []
    for key, tensor in state.items():
        if key not in target:
            report.unexpected.append(key)
            continue
        want = target[key].shape
        if tensor.shape != want:
            resizable_grid = (
                key == "image_encoder.pos_embed"
                and tensor.ndim == 4
                and tensor.shape[-1] == want[-1]
                and tensor.shape[0] == 1
            )
            resizable_table = (
                key.endswith(("rel_pos_h", "rel_pos_w"))
                and key.removesuffix(key.split(".")[-1]) in global_blocks
                and tensor.ndim == 2
                and tensor.shape[1] == want[1]
            )
            if resizable_grid:
                tensor = resize_pos_embed(tensor.float(), (want[1], want[2])).to(tensor.dtype)
            elif resizable_table:
                tensor = resize_rel_pos(tensor.float(), want[0]).to(tensor.dtype)
            else:
                mismatches.append(f"{key}: {tuple(tensor.shape)} in the file, {tuple(want)} in the model")
                continue
            report.resized[key] = (tuple(state[key].shape), tuple(want))
        chosen[key] = tensor
    if mismatches:
        _refuse_shapes(net, state, mismatches, path)
    report.loaded = list(chosen)
    for key in target:
        if key not in chosen:
            (report.missing_adapters if "_Adapter." in key else report.missing).append(key)
    return report, chosen


def _check_encoder_share(report: SamLoadReport, target: dict[str, Tensor], min_loaded: float, path: Path) -> None:
    """Refuse a file that gives fewer than ``min_loaded`` of the image encoder's (non-adapter) tensors."""
    encoder = [k for k in target if k.startswith("image_encoder.") and "_Adapter." not in k]
    loaded = set(report.loaded)
    found = sum(k in loaded for k in encoder)
    needed = math.ceil(min_loaded * len(encoder) - 1e-9)
    if found >= needed:
        return
    fix = key_prefix_fix(report.unexpected, set(target))
    if fix is not None and fix[0] == "strip":
        how = (
            f"the file's keys carry the prefix {fix[1]!r}: set {OPTION}.checkpoint_key_prefix: '{fix[1]}' "
            "(or re-save the file without it)"
        )
    elif fix is not None:
        how = (
            f"the file's keys lack the prefix {fix[1]!r} (a part saved on its own?): re-save it with "
            f"{fix[1]!r} before every key"
        )
    else:
        how = (
            "give an original SAM or MedSAM checkpoint of the model's variant (keys image_encoder.*, "
            "prompt_encoder.*, mask_decoder.*: sam_vit_b_01ec64.pth, medsam_vit_b.pth)"
        )
    raise CheckpointError(
        f"{path}: only {found} of the image encoder's {len(encoder)} tensors are in the file ({OPTION}.min_loaded="
        f"{min_loaded} needs {needed}), so the adapters would train on a randomly initialized frozen encoder. "
        f"First unmatched file keys: {report.unexpected[:_LISTED]}; first encoder keys not found: "
        f"{[k for k in encoder if k not in loaded][:_LISTED]}. Fix: {how}; or lower {OPTION}.min_loaded."
    )


def _refuse_shapes(net: nn.Module, state: dict[str, Tensor], mismatches: list[str], path: Path) -> None:
    encoder = cast("ImageEncoderViT", net.image_encoder)  # net is a SamAdapterNet
    width, depth = encoder.pos_embed.shape[-1], len(encoder.blocks)
    variant = next((name for name, v in VARIANTS.items() if (v.width, v.depth) == (width, depth)), "?")
    embed = state.get("image_encoder.patch_embed.proj.weight")
    guess = next((name for name, v in VARIANTS.items() if embed is not None and v.width == embed.shape[0]), None)
    fix = (
        f"the file looks like variant {guess!r}: set {OPTION}.variant: {guess}"
        if guess not in (None, variant)
        else f"set {OPTION}.variant to the file's SAM variant (vit_b, vit_l or vit_h), or give a checkpoint "
        "saved from SAM's own layout"
    )
    raise CheckpointError(
        f"{path}: {len(mismatches)} tensors have a shape that interpolation cannot explain "
        f"(model variant {variant!r}): "
        + "; ".join(mismatches[:10])
        + ("; ..." if len(mismatches) > 10 else "")
        + f". Fix: {fix}."
    )
