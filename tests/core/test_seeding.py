"""fedlit.core.seeding.manual_seed: torch.manual_seed's streams, without queuing seeds for unused accelerators."""

from __future__ import annotations

import traceback

import pytest
import torch

from fedlit.core.seeding import manual_seed


def test_manual_seed_gives_torch_manual_seed_s_cpu_stream():
    torch.manual_seed(123)
    expected = torch.rand(5)
    torch.manual_seed(0)
    manual_seed(123)
    assert torch.equal(torch.rand(5), expected)


@pytest.mark.skipif(torch.cuda.is_initialized(), reason="CUDA is in use in this process: its seed is set at once")
def test_manual_seed_records_no_stack_trace(monkeypatch):
    """torch.manual_seed queues its seed for each accelerator not yet initialized with a stack trace, about a
    millisecond: more than a small model's step, at every client turn."""
    traces = []
    monkeypatch.setattr(traceback, "format_stack", lambda *a, **k: traces.append(1) or [])
    manual_seed(5)
    assert traces == []
    torch.manual_seed(5)
    assert traces  # what the test guards against: PyTorch's own call does record one
