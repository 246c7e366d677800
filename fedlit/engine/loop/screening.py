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

Then the round's updates are screened together (:func:`screen_round`):

- a client's weight: its ``num_examples`` over itself plus the train sizes of the round's other selected clients (as
  their data declared them) is at most ``federation.max_client_weight`` (a share, off by default), else the update is
  rejected: a node that claims 10^9 examples cannot make the new model its own;
- the norm bounds of Sun, Kairouz, Suresh, McMahan, "Can you really backdoor federated learning?" (arXiv 2019): an
  update over ``federation.max_update_norm``, or over ``federation.max_update_norm_vs_median`` times the median
  norm of the round's *other* updates (the median of the others: with two clients the round's own median is their
  mean, which no update ever exceeds twice), is rejected, or with ``federation.update_norm_action: clip`` scaled down
  to the bound (``sent + delta * bound / ||delta||``) and kept, recorded as ``clipped``. The others' median is
  that of the norms before any is clipped against it, so the result does not depend on the clients' order. A round
  of one update, or whose other updates are all zero, is not checked against the median.

Then, after :meth:`~fedlit.strategies.base.Strategy.aggregate` and ``on_after_aggregate``, every floating tensor of
the strategy's server state must be finite; otherwise the round is not committed: nothing of it is logged,
evaluated or saved, and the run stops with its last good checkpoint.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from fedlit.core.tensors import first_non_finite
from fedlit.strategies.base import ClientUpdate

if TYPE_CHECKING:
    from fedlit.engine.loop.settings import Settings


def screen_update(
    update: ClientUpdate, sent: Mapping[str, Tensor], max_norm: float | None, max_ratio: float | None
) -> tuple[str, str] | None:
    """``(kind, detail)`` of what is wrong with ``update`` (``non-finite`` or ``rejected``), or None."""
    bad = first_non_finite(update.state, "uploaded tensor") or first_non_finite(update.extras, "uploaded extra")
    if bad is not None:
        return "non-finite", f"{bad} (found by the server)"
    if max_norm is None and max_ratio is None:
        return None
    names = _compared(update, sent)
    if not names:
        return None
    delta = update_norm(update, sent)
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


def _compared(update: ClientUpdate, sent: Mapping[str, Tensor]) -> list[str]:
    """The floating tensors of ``update`` that the server sent: those its norm is over."""
    return [n for n, t in update.state.items() if t.is_floating_point() and n in sent]


def update_norm(update: ClientUpdate, sent: Mapping[str, Tensor]) -> float:
    """The L2 norm of ``update.state - sent`` over the floating tensors sent (0 when there are none)."""
    return math.sqrt(
        sum(
            float((update.state[n].double() - sent[n].to(update.state[n].device).double()).pow(2).sum())
            for n in _compared(update, sent)
        )
    )


def clip_update(update: ClientUpdate, sent: Mapping[str, Tensor], bound: float) -> None:
    """Scale ``update``'s change (its floating tensors minus ``sent``) to the L2 norm ``bound``, in place."""
    scale = bound / update_norm(update, sent)
    for name in _compared(update, sent):
        tensor = update.state[name]
        base = sent[name].to(tensor.device).double()
        update.state[name] = (base + (tensor.double() - base) * scale).to(tensor.dtype)


def screen_round(
    updates: Sequence[ClientUpdate],
    sent: Sequence[Mapping[str, Tensor]],
    sizes: Mapping[str, int],
    settings: Settings,
) -> list[tuple[str, str] | None]:
    """For each of the round's ``updates`` that passed :func:`screen_update` (``sent``: what each was sent;
    ``sizes``: the train size of each client the round selected, as declared): ``("rejected", detail)``,
    ``("clipped", detail)`` (the update was scaled in place and stays in the round) or None."""
    out: list[tuple[str, str] | None] = [None] * len(updates)
    cap = settings.max_client_weight
    if cap is not None and len(sizes) > 1:
        for i, update in enumerate(updates):
            total = update.num_examples + sum(n for c, n in sizes.items() if c != update.client_id)
            share = update.num_examples / max(1, total)
            if share > cap:
                detail = f"its {update.num_examples} training examples would weigh {share:.3g} of the round's {total}"
                out[i] = "rejected", f"{detail}, over federation.max_client_weight={cap:g}"
    kept = [i for i, problem in enumerate(out) if problem is None]
    norms = {i: update_norm(updates[i], sent[i]) for i in kept}
    clip = settings.update_norm_action == "clip"
    bound = settings.max_update_norm
    if clip and bound is not None:  # else screen_update rejected them
        for i in kept:
            if norms[i] > bound:
                out[i] = "clipped", f"update norm {norms[i]:.3g} over federation.max_update_norm={bound:g}, clipped"
                clip_update(updates[i], sent[i], bound)
                norms[i] = bound
    k = settings.max_update_norm_vs_median
    if k is None or len(kept) < 2:
        return out
    medians = {i: statistics.median(norms[j] for j in kept if j != i) for i in kept}
    for i in kept:
        median = medians[i]
        if median > 0 and norms[i] > k * median:
            detail = (
                f"update norm {norms[i]:.3g} is {norms[i] / median:.3g} times the median {median:.3g} of the "
                f"round's other updates, over federation.max_update_norm_vs_median={k:g}"
            )
            if clip:
                clip_update(updates[i], sent[i], k * median)
                out[i] = "clipped", f"{detail}; clipped to {k * median:.3g}"
            else:
                out[i] = "rejected", detail
    return out
