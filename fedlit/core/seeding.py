"""The run's random streams: every stream (client sampling, a client's local training, its data order, a
strategy's draw) is seeded from the run's seed and the stream's name, so a run does not depend on the order in
which clients train and a resumed run continues exactly; and how many clients a round samples."""

from __future__ import annotations

import hashlib
from typing import Any

import torch


def derive_seed(*parts: Any) -> int:
    """A stable 62-bit seed from ``parts`` (independent of Python's hash randomization)."""
    return int(hashlib.sha256("/".join(map(str, parts)).encode()).hexdigest()[:15], 16)


def num_selected(clients_per_round: int | float | None, num_clients: int) -> int:
    """How many of ``num_clients`` clients train in a round under ``federation.clients_per_round`` (a count, a
    fraction rounded to the nearest count and at least 1, or None for all of them)."""
    if clients_per_round is None:
        return num_clients
    if isinstance(clients_per_round, float):
        return max(1, round(clients_per_round * num_clients))
    return clients_per_round


def manual_seed(seed: int) -> None:
    """``torch.manual_seed(seed)`` for the CPU and every accelerator already in use, at a fraction of its cost.

    ``torch.manual_seed`` also queues the seed for each accelerator not yet initialized (CUDA, XPU, MTIA), and
    queuing records a stack trace each time: about a millisecond per call, more than a small model's step, once per
    client turn. A run's device is initialized when the run is set up, before any turn, so the queued seeds were
    never read; the seeds of the generators in use are the same.
    """
    seed = int(seed)
    for backend in (torch.cuda, getattr(torch, "xpu", None), getattr(torch, "mtia", None)):
        if backend is not None and backend.is_initialized():
            backend.manual_seed_all(seed)
    torch.mps.manual_seed(seed)
    torch.default_generator.manual_seed(seed)
