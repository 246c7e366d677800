"""Building a model only to measure it: weight files are not read.

``fedlit cost`` and ``fedlit fit --dry_run`` build the model, its roles and the strategy to count parameters and
bytes, before any data or checkpoint is needed. Inside :func:`skip_weight_loading`, backbones that load a weight
file from a local path (a SAM checkpoint, for instance) keep their initialization instead, so the costs of a
recipe can be read before its checkpoint is downloaded. Tensor shapes do not depend on the file, so the counts
are the same.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["skip_weight_loading", "weight_loading_enabled"]

_SKIPPING = 0


@contextmanager
def skip_weight_loading() -> Iterator[None]:
    """Within the block, :func:`weight_loading_enabled` is False (nestable)."""
    global _SKIPPING
    _SKIPPING += 1
    try:
        yield
    finally:
        _SKIPPING -= 1


def weight_loading_enabled() -> bool:
    """False inside :func:`skip_weight_loading`: a backbone should then skip reading its weight file."""
    return _SKIPPING == 0
