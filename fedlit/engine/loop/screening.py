"""What the server checks before it aggregates an upload and before it publishes a round.

A client checks its own loss and upload (:mod:`fedlit.engine.loop.client`), but the server cannot trust that: a faulty
or malicious client, a codec, a callback may hand it anything. So the server screens each update itself:

- every floating tensor of its state and extras is finite (else it is *quarantined*, as a client's own check does);
- the update's size: the L2 norm of ``state - sent`` over the floating shared tensors it uploaded, where ``sent`` is
  what the server sent that client this round, is at most ``federation.max_update_norm`` (an absolute bound, off by
  default, as the norm bounds of Flower's and NVFlare's update filters) and at most
  ``federation.max_update_ratio`` times ``max(1, ||sent||)`` (a relative bound, 1000 by default: no round of
  training moves a model a thousand times its own size, while a scaled or corrupted upload does). An update over a
  bound is *rejected*: left out of the round with a warning and recorded in the faults.

Then, after :meth:`~fedlit.strategies.base.Strategy.aggregate` and ``on_after_aggregate``, every floating tensor of
the strategy's server state must be finite; otherwise the round is not committed: nothing of it is logged,
evaluated or saved, and the run stops with its last good checkpoint.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from fedlit.core.tensors import first_non_finite
from fedlit.strategies.base import ClientUpdate


def screen_update(
    update: ClientUpdate, sent: Mapping[str, Tensor], max_norm: float | None, max_ratio: float | None
) -> tuple[str, str] | None:
    """``(kind, detail)`` of what is wrong with ``update`` (``non-finite`` or ``rejected``), or None."""
    bad = first_non_finite(update.state, "uploaded tensor") or first_non_finite(update.extras, "uploaded extra")
    if bad is not None:
        return "non-finite", f"{bad} (found by the server)"
    if max_norm is None and max_ratio is None:
        return None
    names = [n for n, t in update.state.items() if t.is_floating_point() and n in sent]
    if not names:
        return None
    delta = math.sqrt(
        sum(float((update.state[n].double() - sent[n].to(update.state[n].device).double()).pow(2).sum()) for n in names)
    )
    if max_norm is not None and delta > max_norm:
        return "rejected", f"update norm {delta:.3g} over federation.max_update_norm={max_norm:g}"
    size = math.sqrt(sum(float(sent[n].double().pow(2).sum()) for n in names))
    if max_ratio is not None and delta > max_ratio * max(1.0, size):
        return "rejected", (
            f"update norm {delta:.3g} is over federation.max_update_ratio={max_ratio:g} times the "
            f"size of what it was sent ({size:.3g})"
        )
    return None


def non_finite_server_state(state: Any) -> str | None:
    """A description of the first non-finite floating tensor of the strategy's server state, or None."""
    with torch.no_grad():
        return first_non_finite(state, "server tensor")
