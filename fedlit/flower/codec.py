"""How fedlit's tasks and replies travel in Flower messages (:class:`flwr.app.RecordDict`).

A tree (the tensors a strategy sends, its extras, a client's upload, metrics) is stored under one name as two
records:

- ``<name>``: an :class:`~flwr.app.ArrayRecord` of its tensors, keyed by their dotted path in the tree (the tensor's
  own name for a flat dict of tensors such as ``received``: ``backbone.0.weight``; ``cores.site_1.backbone.0.weight``
  for a nested extra);
- ``<name>.tree``: a :class:`~flwr.app.ConfigRecord` with ``skeleton``, the tree as JSON in which every value is
  tagged (``["t", key]`` a tensor of the ArrayRecord, ``["d", [[key, value], ...]]`` a dict with keys of any scalar
  type, ``["l", [...]]`` a list, ``["u", [...]]`` a tuple, ``["s", x]`` a JSON scalar), so a tree comes back with the
  same types, key types and order; and ``dtypes``, JSON of the torch dtype of each tensor NumPy cannot hold
  (``bfloat16``, the float8 types), which travels as the integer view of its bits.

Tensors keep their dtype, shape and values bit for bit, so the bytes fedlit counts as communication (computed from
the tensors) are the same on both sides and in simulation. Anything else in a tree (an object, a NumPy array) is
refused with the path where it was found.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, RecordDict
from torch import Tensor

from fedlit.core.tensors import nbytes as tree_nbytes

_SCALARS = (type(None), bool, int, float, str)
#: Torch dtypes NumPy lacks, sent as the integer view of their bits.
_BIT_VIEWS = {torch.bfloat16: torch.int16, torch.float8_e4m3fn: torch.uint8, torch.float8_e5m2: torch.uint8}


def put_tree(content: RecordDict, name: str, tree: Any) -> None:
    """Store ``tree`` (nested dicts, lists and tuples of tensors and JSON scalars) in ``content`` under ``name``."""
    tensors: dict[str, Tensor] = {}
    skeleton = _pack(tree, "", tensors)
    arrays, dtypes = ArrayRecord(), {}
    for key, tensor in tensors.items():
        tensor = tensor.detach().cpu()
        if tensor.dtype in _BIT_VIEWS:
            dtypes[key] = str(tensor.dtype).removeprefix("torch.")
            tensor = tensor.view(_BIT_VIEWS[tensor.dtype])
        arrays[key] = Array.from_numpy_ndarray(tensor.contiguous().numpy())
    content[name] = arrays
    content[f"{name}.tree"] = ConfigRecord({"skeleton": json.dumps(skeleton), "dtypes": json.dumps(dtypes)})


def get_tree(content: RecordDict, name: str) -> Any:
    """The tree :func:`put_tree` stored under ``name`` (tensors on the CPU)."""
    meta = content.config_records[f"{name}.tree"]
    dtypes = json.loads(str(meta["dtypes"]))
    arrays = content.array_records[name]
    tensors = {}
    for key, array in arrays.items():
        tensor = torch.from_numpy(array.numpy())
        if key in dtypes:
            tensor = tensor.view(getattr(torch, dtypes[key]))
        tensors[key] = tensor
    return _unpack(json.loads(str(meta["skeleton"])), tensors)


def tensors_nbytes(content: RecordDict, name: str) -> int:
    """Bytes of the tensors stored under ``name`` (as fedlit counts them: elements times element size)."""
    return tree_nbytes(get_tree(content, name))


def _pack(obj: Any, path: str, tensors: dict[str, Tensor]) -> Any:
    if isinstance(obj, Tensor):
        key, n = path or "_", 1
        while key in tensors:  # two paths that print alike ({1: t} and {"1": t}) still get their own keys
            key, n = f"{path}#{n}", n + 1
        tensors[key] = obj
        return ["t", key]
    if isinstance(obj, Mapping):
        items = []
        for k, v in obj.items():
            if not isinstance(k, _SCALARS):
                raise TypeError(
                    f"Cannot send a dict key of type {type(k).__name__} at {path or 'the top'!r}: "
                    "keys must be str, int, float, bool or None."
                )
            items.append([k, _pack(v, f"{path}.{k}" if path else str(k), tensors)])
        return ["d", items]
    if isinstance(obj, list | tuple):
        packed = [_pack(v, f"{path}.{i}" if path else str(i), tensors) for i, v in enumerate(obj)]
        return ["u" if isinstance(obj, tuple) else "l", packed]
    if isinstance(obj, _SCALARS):
        return ["s", obj]
    if isinstance(obj, np.generic):
        return ["s", obj.item()]
    raise TypeError(
        f"Cannot send a {type(obj).__name__} at {path or 'the top'!r}: a message carries tensors, "
        "JSON scalars and dicts, lists and tuples of them."
    )


def _unpack(node: list[Any], tensors: Mapping[str, Tensor]) -> Any:
    tag, value = node
    if tag == "t":
        return tensors[value]
    if tag == "d":
        return {_key(k): _unpack(v, tensors) for k, v in value}
    if tag == "l":
        return [_unpack(v, tensors) for v in value]
    if tag == "u":
        return tuple(_unpack(v, tensors) for v in value)
    return value


def _key(key: Any) -> Any:
    return tuple(key) if isinstance(key, list) else key
