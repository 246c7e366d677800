"""Mixed precision (``federation.precision``: ``16-mixed``, ``bf16-mixed``): a run trains as in float32 (autocast
computes in 16 bits, the weights, the server state and the store stay float32, on the devices of the placement
rule) and resumes exactly. On the CPU, Lightning runs ``16-mixed`` as bfloat16; under the ``gpu`` marker (``make
test-gpu``) both run on CUDA (the ``accelerator`` fixture), ``16-mixed`` in float16 with a gradient scaler."""

from __future__ import annotations

import pytest
import torch

from fedlit import FedAvg
from fedlit.core.tensors import tensors
from tests.conftest import make_federation

CKPT = ("checkpoints", "last.ckpt")


@pytest.mark.parametrize("precision", ["bf16-mixed", "16-mixed"])
def test_a_mixed_precision_run_trains_as_float32_and_resumes_exactly(tmp_path, precision, accelerator):
    full = make_federation(tmp_path / "32", FedAvg(), rounds=2, accelerator=accelerator).fit()
    straight = make_federation(tmp_path / "mixed", FedAvg(), rounds=2, accelerator=accelerator, precision=precision)
    mixed = straight.fit()
    assert mixed["last"]["round"] == 2
    for name, value in full["last"]["summary"].items():
        if name.startswith("loss"):  # 16-bit products: the same losses to a few per cent
            assert mixed["last"]["summary"][name] == pytest.approx(value, rel=0.05), name
    held = {"strategy": straight.strategy.state_dict(), "store": straight.store.state_dict()}
    assert {t.dtype for t in tensors(held) if t.is_floating_point()} == {torch.float32}
    assert {t.device.type for t in tensors(held)} == {"cpu"}  # the store's device, whatever the run's
    assert {p.dtype for p in straight.module.parameters()} == {torch.float32}
    assert {p.device.type for p in straight.module.parameters()} == {accelerator}

    make_federation(tmp_path / "resumed", FedAvg(), rounds=1, accelerator=accelerator, precision=precision).fit()
    torch.manual_seed(1234)
    again = make_federation(tmp_path / "resumed", FedAvg(), rounds=2, accelerator=accelerator, precision=precision)
    resumed = again.fit(ckpt_path=tmp_path.joinpath("resumed", *CKPT))
    assert resumed["last"] == mixed["last"] and resumed.get("best") == mixed.get("best")
    for name, tensor in straight.strategy.global_state.items():
        assert torch.equal(again.strategy.global_state[name], tensor), name
