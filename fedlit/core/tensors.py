"""Walking nested tensors: the one place that searches dicts, lists and tuples for tensors.

Uploads, strategy extras, optimizer states and a client's stored state are nested containers of tensors; what is
counted as communication, what is checked finite and what is encoded for the network are found here.
"""

from __future__ import annotations

import hashlib
import weakref
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np
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


def raw_bytes(tensor: Tensor) -> np.ndarray:
    """The bytes of ``tensor``'s values (any dtype), on the CPU, in row-major order, as a uint8 array."""
    return tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy()


class DigestMemo:
    """Tensors' digests kept across :func:`digest` calls, by tensor object: a tensor neither changed in place (its
    ``_version``) nor given other memory (``.data =``, moved to a device: its data pointer, shape, strides) is hashed
    once, however many calls read it (a frozen backbone once per run); a changed or new tensor is hashed again. An
    entry goes when its tensor is freed (a weak reference). Writes that bypass torch's version counter (through a
    NumPy view of the tensor) are not seen: hash such tensors with a memo of their own.

    Attributes:
        hashed: how many tensors were hashed (not found in the memo).
    """

    def __init__(self) -> None:
        self._kept: dict[int, tuple[weakref.ref[Tensor], tuple[Any, ...], bytes]] = {}
        self.hashed = 0

    def get(self, tensor: Tensor) -> bytes:
        """The digest of ``tensor``'s dtype, shape and values; hashed only when the memo cannot vouch for it."""
        key = id(tensor)
        state = (tensor._version, tensor.device, tensor.data_ptr(), tuple(tensor.shape), tensor.stride())
        kept = self._kept.get(key)
        if kept is not None and kept[0]() is tensor and kept[1] == state:
            return kept[2]
        inner = hashlib.blake2b(f"T{tensor.dtype}{tuple(tensor.shape)}".encode(), digest_size=16)
        inner.update(raw_bytes(tensor))  # type: ignore[arg-type]  # numpy stubs: ndarray is a Buffer on 3.12+ only
        self.hashed += 1
        kept_digest = inner.digest()
        self._kept[key] = (weakref.ref(tensor, self._forget(key)), state, kept_digest)
        return kept_digest

    def _forget(self, key: int) -> Callable[[weakref.ref[Tensor]], None]:
        owner = weakref.ref(self)  # the callback must not keep the memo alive

        def forget(ref: weakref.ref[Tensor]) -> None:
            memo = owner()
            if memo is not None and key in memo._kept and memo._kept[key][0] is ref:
                del memo._kept[key]

        return forget


def digest(tree: Any, memo: DigestMemo | None = None) -> bytes | None:
    """A BLAKE2b digest of ``tree`` (tensors, arrays, numbers, strings, None and their dicts, lists and tuples):
    equal values give equal digests (dtypes and shapes included); None for a tree holding anything else. ``memo``
    keeps tensors' digests across calls (:class:`DigestMemo`: a tensor given to many calls is hashed once while it
    is unchanged)."""
    hasher = hashlib.blake2b(digest_size=16)
    if not _feed(hasher, tree, memo if memo is not None else DigestMemo()):
        return None
    return hasher.digest()


def _feed(hasher: Any, value: Any, memo: DigestMemo) -> bool:
    if isinstance(value, Tensor):
        hasher.update(memo.get(value))
        return True
    if isinstance(value, np.ndarray):
        hasher.update(f"A{value.dtype}{value.shape}".encode())
        hasher.update(np.ascontiguousarray(value).tobytes())
        return True
    if isinstance(value, Mapping):
        hasher.update(b"{")
        for key in sorted(value, key=repr):
            hasher.update(repr(key).encode())
            if not _feed(hasher, value[key], memo):
                return False
        hasher.update(b"}")
        return True
    if isinstance(value, list | tuple):
        hasher.update(b"[" if isinstance(value, list) else b"(")
        for item in value:
            if not _feed(hasher, item, memo):
                return False
        hasher.update(b"]")
        return True
    if value is None or isinstance(value, bool | int | float | str | bytes):
        hasher.update(f"{type(value).__name__}:{value!r}".encode())
        return True
    return False
