"""The codec: trees of tensors and scalars survive a Flower RecordDict bit for bit, types and order included."""

from __future__ import annotations

import math

import pytest
import torch

pytest.importorskip("flwr.app", reason="flwr is not installed (pip install 'fedlit[flower]'): no Flower deployment")

from flwr.app import RecordDict  # noqa: E402

from fedlit.flower.codec import get_tree, put_tree, tensors_nbytes  # noqa: E402


def _roundtrip(tree):
    content = RecordDict()
    put_tree(content, "x", tree)
    return content, get_tree(content, "x")


def test_tensors_keep_dtype_shape_and_bits():
    tensors = {
        "w": torch.randn(3, 4).t(),
        "bf": torch.tensor([1.5, -2.25, 3e-3], dtype=torch.bfloat16),
        "half": torch.tensor([65504.0], dtype=torch.float16),
        "n": torch.tensor(7, dtype=torch.int64),
        "mask": torch.tensor([True, False]),
        "nan": torch.tensor([math.nan, math.inf]),
    }
    content, back = _roundtrip(tensors)
    assert list(back) == list(tensors)
    for name, tensor in tensors.items():
        assert back[name].dtype == tensor.dtype and back[name].shape == tensor.shape, name
        assert torch.equal(
            back[name].view(torch.uint8) if tensor.is_floating_point() else back[name],
            tensor.contiguous().view(torch.uint8) if tensor.is_floating_point() else tensor,
        ), name
    # 12 float32 + 3 bfloat16 + 1 float16 + 1 int64 + 2 bool + 2 float32
    assert tensors_nbytes(content, "x") == 12 * 4 + 3 * 2 + 2 + 8 + 2 + 2 * 4
    assert list(content["x"].keys()) == list(tensors)  # a flat dict of tensors: keyed by tensor name


def test_nested_extras_keep_types_and_keys():
    extras = {
        "cores": {"site_1": {"a.weight": torch.ones(2)}},
        "blocks": [0, 2],
        "pair": (1, "b"),
        3: {"l": 0.25, "none": None, "flag": True},
        "1": torch.zeros(1),
        1: torch.ones(1),
    }
    content, back = _roundtrip(extras)
    assert set(content["x"].keys()) == {"cores.site_1.a.weight", "1", "1#1"}
    assert back["blocks"] == [0, 2] and back["pair"] == (1, "b") and back[3] == {"l": 0.25, "none": None, "flag": True}
    assert torch.equal(back["cores"]["site_1"]["a.weight"], torch.ones(2))
    assert torch.equal(back["1"], torch.zeros(1)) and torch.equal(back[1], torch.ones(1))
    assert _roundtrip(None)[1] is None and _roundtrip({})[1] == {}


def test_an_object_is_refused_with_its_path():
    with pytest.raises(TypeError, match="Cannot send a object at 'a.0'"):
        put_tree(RecordDict(), "x", {"a": [object()]})
