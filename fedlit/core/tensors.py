"""Walking nested tensors: the one place that searches dicts, lists and tuples for tensors.

Uploads, strategy extras, optimizer states and a client's stored state are nested containers of tensors; what is
counted as communication, what is checked finite and what is encoded for the network are found here.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch import Tensor


def named_tensors(tree: Any, prefix: str = "") -> Iterator[tuple[str, Tensor]]:
    """Every tensor of ``tree`` (a tensor, or nested mappings, lists and tuples) with its path, depth first in
    insertion order: ``a.b`` for mapping keys, ``a[0]`` for list items; the root tensor's path is ``prefix``."""
    if isinstance(tree, Tensor):
        yield prefix, tree
    elif isinstance(tree, Mapping):
        for key, value in tree.items():
            yield from named_tensors(value, f"{prefix}.{key}" if prefix else str(key))
    elif isinstance(tree, list | tuple):
        for i, item in enumerate(tree):
            yield from named_tensors(item, f"{prefix}[{i}]")


def tensors(tree: Any) -> list[Tensor]:
    """Every tensor of ``tree`` (see :func:`named_tensors`)."""
    return [t for _, t in named_tensors(tree)]


def nbytes(tree: Any) -> int:
    """Bytes of the tensors of ``tree``: what crosses the network, or what a store entry holds."""
    return sum(t.numel() * t.element_size() for t in tensors(tree))


def numel(tree: Any) -> int:
    """Scalars of the tensors of ``tree``."""
    return sum(t.numel() for t in tensors(tree))


def non_finite_name(tree: Any) -> str | None:
    """The path of the first floating tensor of ``tree`` holding NaN or Inf, or None (one reduction per floating
    tensor)."""
    for name, tensor in named_tensors(tree):
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            return name
    return None


def first_non_finite(tree: Any, what: str) -> str | None:
    """A description of the first floating tensor of ``tree`` holding NaN or Inf (``non-finite <what> 'name'``),
    or None."""
    name = non_finite_name(tree)
    return None if name is None else f"non-finite {what} {name!r}"
