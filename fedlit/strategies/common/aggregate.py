"""Generic aggregation math: client weights, weighted means and robust aggregators, written once for every strategy.

As Flower's ``flwr/server/strategy/aggregate.py``: functions take and return plain tensors or ``{name: tensor}``
dicts (one per client) and know nothing of rounds, roles or the loop; an algorithm's own math lives in its file.

- :func:`client_weights`, :func:`normalized_weights`: ``w_k = n_k`` (or 1) and ``w_k / sum_j w_j``.
- :func:`weighted_average`: ``sum_k w_k x_k / sum_k w_k`` (McMahan et al., AISTATS 2017, Algorithm 1); Flower's
  ``aggregate``.
- :func:`coordinate_median`, :func:`trimmed_mean`: Yin, Chen, Ramchandran, Bartlett, "Byzantine-Robust Distributed
  Learning: Towards Optimal Statistical Rates", ICML 2018, Definitions 1 and 2; Flower's ``aggregate_median`` and
  ``aggregate_trimmed_avg``.
- :func:`krum_scores`, :func:`krum_select`: Blanchard, El Mhamdi, Guerraoui, Stainer, "Machine Learning with
  Adversaries: Byzantine Tolerant Gradient Descent", NeurIPS 2017, Section 4; Flower's ``aggregate_krum``.

Everything is accumulated in float64 and cast back to each tensor's dtype (:func:`cast_like`): floating tensors keep
their dtype, integer ones (BatchNorm's ``num_batches_tracked``) are rounded to the nearest integer.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import torch
from torch import Tensor

if TYPE_CHECKING:
    from fedlit.strategies.base import ClientUpdate

State = Mapping[str, Tensor]

#: The values of a strategy's ``weighting`` argument: weigh client k by its training examples ``n_k``, or by 1.
WEIGHTINGS = ("num_examples", "uniform")


def client_weights(updates: Sequence[ClientUpdate], weighting: str = "num_examples") -> list[float]:
    """Each update's weight in a mean over the round's clients: its ``num_examples`` (``weighting="num_examples"``,
    FedAvg's ``n_k``) or 1 (``"uniform"``), as floats.

    Not normalized: the means below normalize in float64 (:func:`normalized_weights` gives ``w_k / sum_j w_j``).

    Raises:
        ValueError: If ``weighting`` is not one of :data:`WEIGHTINGS`.
    """
    if weighting not in WEIGHTINGS:
        raise ValueError(f"weighting={weighting!r} is not one of {list(WEIGHTINGS)}.")
    if weighting == "uniform":
        return [1.0] * len(updates)
    return [float(u.num_examples) for u in updates]


def normalized_weights(weights: Sequence[float]) -> Tensor:
    """``weights / sum(weights)`` in float64; raises on negative weights or a zero total."""
    w = torch.as_tensor(list(weights), dtype=torch.float64)
    if w.numel() == 0:
        raise ValueError("Cannot aggregate zero client updates.")
    if (w < 0).any() or not torch.isfinite(w).all():
        raise ValueError(f"Aggregation weights must be finite and >= 0, got {w.tolist()}.")
    total = w.sum()
    if total <= 0:
        raise ValueError(
            f"The aggregation weights sum to zero ({w.tolist()}): every selected client reported 0 examples."
        )
    return w / total


def common_keys(states: Sequence[State]) -> list[str]:
    """The keys of ``states[0]``; raises if there is no state or another state holds other keys."""
    if not states:
        raise ValueError("Cannot aggregate zero client updates.")
    keys = list(states[0])
    for i, state in enumerate(states[1:], start=1):
        if set(state) != set(keys):
            diff = sorted(set(state) ^ set(keys))
            raise ValueError(f"Client state {i} has other tensors than client state 0: {diff[:5]}.")
    return keys


def cast_like(value: Tensor, ref: Tensor) -> Tensor:
    """A float64 result back to ``ref``'s dtype: integer tensors are rounded to the nearest integer."""
    return value.to(ref.dtype) if ref.is_floating_point() else value.round().to(ref.dtype)


def weighted_average(states: Sequence[State], weights: Sequence[float]) -> dict[str, Tensor]:
    """``sum_i w_i state_i / sum_i w_i`` per tensor (FedAvg, McMahan et al. 2017, Algorithm 1).

    Accumulates in float64 and casts back to each tensor's dtype: floating tensors keep their dtype, integer
    tensors (``num_batches_tracked``) are rounded to the nearest integer. Every state must hold the same keys.
    """
    if len(states) != len(weights):
        raise ValueError(f"{len(states)} states but {len(weights)} weights.")
    w = normalized_weights(weights)
    out = {}
    for key in common_keys(states):
        ref = states[0][key]
        acc = torch.zeros(ref.shape, dtype=torch.float64, device=ref.device)
        for wi, state in zip(w, states, strict=True):
            acc += wi.to(ref.device) * state[key].to(torch.float64)
        out[key] = cast_like(acc, ref)
    return out


# ----------------------------------------------------------------------------------- robust aggregation
# Each one computes what Flower's function of the same name computes, in float64, cast back like weighted_average.


def _sorted_stack(states: Sequence[State], key: str) -> Tensor:
    """``(n, *shape)`` float64 stack of one tensor of every state, sorted along the client axis."""
    return torch.stack([s[key].to(torch.float64) for s in states]).sort(dim=0).values


def coordinate_median(states: Sequence[State]) -> dict[str, Tensor]:
    """Coordinate-wise median of the states, unweighted (Yin et al. 2018, Definition 1).

    With an even number of clients the two middle values are averaged, as ``numpy.median`` (and so Flower's
    ``aggregate_median``) does; ``torch.median`` would return the lower one.
    """
    keys = common_keys(states)
    n = len(states)
    out = {}
    for key in keys:
        ordered = _sorted_stack(states, key)
        middle = ordered[n // 2] if n % 2 else (ordered[n // 2 - 1] + ordered[n // 2]) / 2
        out[key] = cast_like(middle, states[0][key])
    return out


def trimmed_mean(states: Sequence[State], beta: float) -> dict[str, Tensor]:
    """Coordinate-wise beta-trimmed mean, unweighted (Yin et al. 2018, Definition 2).

    Per coordinate, drops the ``k = int(beta * n)`` smallest and ``k`` largest of the n client values and averages
    the rest: ``scipy.stats.trim_mean``'s rule, which Flower's ``aggregate_trimmed_avg`` follows.

    Raises:
        ValueError: If ``beta`` is outside ``[0, 0.5)``.
    """
    if not 0.0 <= beta < 0.5:
        raise ValueError(f"The trimmed fraction beta={beta} must be in [0, 0.5).")
    keys = common_keys(states)
    n = len(states)
    cut = int(beta * n)
    return {key: cast_like(_sorted_stack(states, key)[cut : n - cut].mean(dim=0), states[0][key]) for key in keys}


def pairwise_squared_distances(states: Sequence[State]) -> Tensor:
    """``D[i, j] = ||x_i - x_j||_2^2`` (float64, n x n), x_i the concatenation of state i's floating tensors.

    Integer tensors (BatchNorm's ``num_batches_tracked``) are step counters, not weights, and are left out.
    """
    keys = [k for k in common_keys(states) if states[0][k].is_floating_point()]
    n = len(states)
    dist = torch.zeros(n, n, dtype=torch.float64)
    for key in keys:
        flat = [s[key].detach().reshape(-1).to(torch.float64).cpu() for s in states]
        for i in range(n):
            for j in range(i + 1, n):
                d = (flat[i] - flat[j]).pow(2).sum()
                dist[i, j] += d
                dist[j, i] += d
    return dist


def krum_scores(states: Sequence[State], num_malicious: int) -> Tensor:
    """Krum's score of each state (Blanchard et al. 2017, Section 4): ``s(i) = sum_{i -> j} ||x_i - x_j||^2``
    over the ``max(1, n - f - 2)`` states closest to x_i (itself excluded), f = ``num_malicious``."""
    dist = pairwise_squared_distances(states)
    n = len(states)
    num_closest = max(1, n - num_malicious - 2)
    scores = torch.zeros(n, dtype=torch.float64)
    for i in range(n):
        others = torch.cat([dist[i, :i], dist[i, i + 1 :]])
        scores[i] = others.sort().values[:num_closest].sum()
    return scores


def krum_select(states: Sequence[State], num_malicious: int, num_selected: int = 1) -> list[int]:
    """Indices of the ``num_selected`` states with the lowest Krum scores (Krum for 1, Multi-Krum for more),
    ordered by score; ties go to the lower index.

    Raises:
        ValueError: If ``num_malicious < 0`` or ``num_selected`` is not in ``[1, len(states)]``.
    """
    if num_malicious < 0:
        raise ValueError(f"num_malicious={num_malicious} must be >= 0.")
    if not 1 <= num_selected <= len(states):
        raise ValueError(
            f"Multi-Krum cannot select num_selected={num_selected} of the {len(states)} client updates of this "
            f"round: lower num_selected or let more clients train per round."
        )
    scores = krum_scores(states, num_malicious)
    return torch.sort(scores, stable=True).indices[:num_selected].tolist()
