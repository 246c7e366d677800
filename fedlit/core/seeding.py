"""The run's random streams: every stream (client sampling, a client's local training, its data order, a
strategy's draw) is seeded from the run's seed and the stream's name, so a run does not depend on the order in
which clients train and a resumed run continues exactly."""

from __future__ import annotations

import hashlib
from typing import Any


def derive_seed(*parts: Any) -> int:
    """A stable 62-bit seed from ``parts`` (independent of Python's hash randomization)."""
    return int(hashlib.sha256("/".join(map(str, parts)).encode()).hexdigest()[:15], 16)
