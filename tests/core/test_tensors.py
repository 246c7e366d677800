"""``DigestMemo``: a tensor is hashed again exactly when it may hold other values."""

from __future__ import annotations

import gc

import torch

from fedlit.core.tensors import DigestMemo, digest


def test_a_tensor_is_hashed_again_only_when_changed_or_given_other_memory() -> None:
    memo = DigestMemo()
    t = torch.zeros(4)
    first = digest({"t": t}, memo)
    assert digest({"t": t, "again": t}, memo) != first and memo.hashed == 1  # another tree, t read from the memo
    assert digest({"t": t}, memo) == first and memo.hashed == 1
    t.add_(1.0)  # in place: its version moves
    assert digest({"t": t}, memo) != first and memo.hashed == 2
    t.data = torch.zeros(4)  # other memory, same version: the values are those of the first call again
    assert digest({"t": t}, memo) == first and memo.hashed == 3
    t.data = t.data.view(2, 2)  # the same memory, another shape
    assert digest({"t": t}, memo) != first and memo.hashed == 4
    del t
    gc.collect()
    assert memo._kept == {}  # a freed tensor leaves the memo
