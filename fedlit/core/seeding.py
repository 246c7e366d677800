"""The run's random streams: every stream (client sampling, a client's local training, its data order, a
strategy's draw) is seeded from the run's seed and the stream's name, so a run does not depend on the order in
which clients train and a resumed run continues exactly; and how many clients a round samples."""

from __future__ import annotations

import hashlib
from typing import Any


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
