"""Normalization as a choice: BatchNorm, GroupNorm or LayerNorm layers for fedlit's backbones.

The FedPxN paper (Yang et al., "Towards the Practical Utility of Federated Learning in the Medical Domain", CHIL
2023, Sec. 4-5) compares each federated strategy with the normalization layers of its models swapped: batch
normalization, group normalization and layer normalization. :func:`norm_layer` builds the layer a backbone asks for
by name, :func:`swap_norms` replaces the BatchNorm layers of a model built elsewhere (torchvision's EfficientNet),
and :func:`check_norm` names a wrong option. Whatever the kind, the layers are normalization layers to
:func:`fedlit.core.roles.is_norm_module`, so FedBN, SiloBN and FedPxN keep them local.

Kinds (``norm``):

- ``batch``: ``BatchNorm1d``/``BatchNorm2d`` (running statistics are buffers);
- ``group``: ``GroupNorm(groups, channels)``, over the channel axis 1 of (N, C, ...) inputs; ``groups`` must
  divide every layer's channels;
- ``layer``: LayerNorm over the channels: ``nn.LayerNorm`` on (N, C) features, ``GroupNorm(1, C)`` on (N, C, L)
  and (N, C, H, W) maps (one group normalizes every channel and position of a sample, as LayerNorm over (C, L)
  does, with one affine weight per channel);
- ``none``: ``nn.Identity``.
"""

from __future__ import annotations

from typing import Literal, get_args

import torch
from torch import nn

NormKind = Literal["batch", "group", "layer", "none"]
NORM_KINDS: tuple[str, ...] = get_args(NormKind)


def check_norm(norm: object, groups: object = 32, channels: list[int] | tuple[int, ...] = ()) -> list[str]:
    """The problems of a ``norm``/``groups`` pair for layers of ``channels``, as option messages (empty: none)."""
    if norm not in NORM_KINDS:
        return [f"norm must be one of {list(NORM_KINDS)}, got {norm!r}"]
    if norm != "group":
        return []
    if isinstance(groups, bool) or not isinstance(groups, int) or groups < 1:
        return [f"groups must be an integer >= 1, got {groups!r}"]
    bad = sorted({c for c in channels if c % groups})
    if bad:
        return [f"groups={groups} must divide the channels of every normalized layer; {bad} are not multiples"]
    return []


def norm_layer(
    norm: NormKind, channels: int, *, dims: Literal[0, 1, 2] = 2, groups: int = 32, eps: float = 1e-5
) -> nn.Module:
    """A normalization layer of kind ``norm`` for ``channels`` channels.

    Args:
        norm: ``batch``, ``group``, ``layer`` or ``none`` (module docstring).
        channels: Number of channels (features) it normalizes.
        dims: Spatial dimensions of its input: 0 for (N, C) features, 1 for (N, C, L), 2 for (N, C, H, W).
        groups: Groups of ``group`` (ignored otherwise).
        eps: Added to the variance (torch's default 1e-5 for every kind).

    Raises:
        ValueError: For an unknown ``norm``, or ``groups`` that is not an integer >= 1 dividing ``channels``.
    """
    problems = check_norm(norm, groups, [channels])
    if problems:
        raise ValueError("; ".join(problems))
    if norm == "none":
        return nn.Identity()
    if norm == "group":
        return nn.GroupNorm(groups, channels, eps=eps)
    if norm == "layer":
        return nn.LayerNorm(channels, eps=eps) if dims == 0 else nn.GroupNorm(1, channels, eps=eps)
    return nn.BatchNorm2d(channels, eps=eps) if dims == 2 else nn.BatchNorm1d(channels, eps=eps)


def swap_norms(model: nn.Module, norm: NormKind, *, groups: int = 32) -> nn.Module:
    """Replace every BatchNorm layer of ``model`` (in place) by a fresh layer of kind ``norm``; returns ``model``.

    The new layer normalizes the same channels (``num_features``) with the same ``eps``, on the old layer's device
    and dtype; ``batch`` leaves the model as it is. A pretrained BatchNorm's affine weights are kept when the new
    layer has the same shapes (GroupNorm, LayerNorm on channels): the FedPxN paper trains its GroupNorm models from
    those weights too.

    Raises:
        ValueError: For an unknown ``norm`` or ``groups`` below 1; naming the first layer (its qualified name in
            ``model``) whose channels ``groups`` does not divide, before any layer is replaced.
    """
    problems = check_norm(norm, groups)
    if problems:
        raise ValueError("; ".join(problems))
    if norm == "batch":
        return model
    found = [
        (f"{name}.{child_name}" if name else child_name, module, child_name, child)
        for name, module in model.named_modules()
        for child_name, child in module.named_children()
        if isinstance(child, nn.modules.batchnorm._BatchNorm)
    ]
    for where, _, _, child in found:
        if norm == "group" and child.num_features % groups:
            raise ValueError(f"groups={groups} does not divide the {child.num_features} channels of {where}")
    for _, module, child_name, child in found:
        dims: Literal[0, 1, 2] = 2 if isinstance(child, nn.BatchNorm2d) else 1
        new = norm_layer(norm, child.num_features, dims=dims, groups=groups, eps=child.eps)
        like: torch.Tensor | None = next(iter(child.parameters()), None)
        if like is None:
            like = next(iter(child.buffers()), None)
        if like is not None:
            new = new.to(device=like.device, dtype=like.dtype if like.is_floating_point() else None)
        if child.affine and isinstance(new, nn.GroupNorm | nn.LayerNorm) and new.weight is not None:
            with torch.no_grad():
                new.weight.copy_(child.weight)
                new.bias.copy_(child.bias)
        setattr(module, child_name, new)
    return model
