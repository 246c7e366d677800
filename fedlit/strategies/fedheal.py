"""FedHEAL: parameter-harmonized, aggregation-equalized federated learning.

Chen, Huang, Ye. "Fair Federated Learning under Domain Skew with Local Consistency and Domain Diversity." CVPR 2024.
https://arxiv.org/abs/2405.16585

Two server-side parts on top of FedAvg's local training, with ``u_k = theta_g - theta_k`` the update of client k:

- FPHL (parameter-harmonized learning): a coordinate of ``u_k`` counts only if its sign agrees with the client's
  own past updates. With ``h_k`` the fraction of k's previous updates that were >= 0 (per coordinate),

      c_k = h_k where u_k >= 0, 1 - h_k where u_k < 0,      m_k = [c_k > tau],
      h_k <- (h_k * t_k + [u_k >= 0]) / (t_k + 1)          (t_k: updates seen so far; the first one: m_k = 1)

- FAEL (aggregation-equalized learning): clients whose masked update moved further get more weight, with momentum,

      d_k = sum_{tensors} ||u_k * m_k||_2,
      dw_k = (1 - beta) dw_k_prev + beta d_k / sum_j d_j,    w_k = w_k_prev + dw_k,    p_k = w_k / sum_j w_j

  (``w_k_prev`` starts at ``1 / |S_t|``, ``dw_k_prev`` at 0; the unnormalized ``w_k`` and ``dw_k`` are kept).

- Aggregation, elementwise: ``theta_g <- theta_g - sum_k q_k (u_k * m_k)`` with ``q_k = p_k m_k / sum_j p_j m_j``,
  and ``q_k = p_k`` where every client's mask is 0 (then every masked update is 0 there and theta_g stays).

The equations are written as the authors' code computes them (the paper's FPHL and FAEL sections).

Symbols -> code: ``theta_g`` -> ``self.global_state``; ``theta_k`` -> ``update.state``; ``h_k`` ->
``self.history[k]``; ``t_k`` -> ``self.counts[k]``; ``m_k`` -> :func:`heal_consistency_mask`; ``w_k``, ``dw_k``,
``d_k`` -> ``self.weights[k]``, ``self.deltas[k]``, ``self.distances[k]``; ``p``, the update -> :func:`heal_weights`,
:func:`heal_aggregate`; ``tau``, ``beta`` -> ``tau``, ``beta``.

Decisions (where the paper and the authors' code are silent or differ):

- ``sign_count="participations"`` (default): ``t_k`` counts the client's own updates. The authors' code divides by
  the round index instead (``"rounds"``: ``t_k = server_round - 1``), the same under full participation; a client
  without history (first participation) gets ``m_k = 1`` either way.
- ``distance_share="round"`` (default): ``sum_j d_j`` over the round's clients. The authors' code sums the latest
  distance of every client ever seen (``"seen"``), the same under full participation.
- Distances sum over the shared parameters (not buffers), as the authors' code; the mask and the update apply to
  every shared tensor, buffers included (integer ones, as ``num_batches_tracked``, rounded).
- Client weights do not use the number of examples (the authors' code neither).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import torch
from torch import Tensor
from typing_extensions import override

from fedlit.core.errors import ConfigError
from fedlit.strategies.base import ClientUpdate, Strategy
from fedlit.strategies.common.aggregate import State, cast_like, normalized_weights


def heal_consistency_mask(
    update: State, history: State | None, count: int, tau: float
) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """One client's parameter-update-consistency mask and its new sign history (FedHEAL, FPHL).

    ``history`` holds, per coordinate, the fraction of the client's ``count`` previous updates that were >= 0.
    The consistency of the current update ``u`` is that fraction where ``u >= 0`` and one minus it where ``u < 0``
    (the share of past updates with the same sign); ``mask = consistency > tau``. The history then takes ``u`` in:
    ``(history * count + [u >= 0]) / (count + 1)``. With no history (``history`` None or ``count`` 0) the mask is
    all ones and the history is ``[u >= 0]``.

    Returns:
        ``(mask, new_history)``, float64 tensors of 0s and 1s / fractions, per tensor of ``update``.
    """
    if count < 0:
        raise ValueError(f"count={count} must be >= 0.")
    positive = {n: (u >= 0).to(torch.float64) for n, u in update.items()}
    if history is None or count == 0:
        return {n: torch.ones_like(p) for n, p in positive.items()}, positive
    mask, new_history = {}, {}
    for name, pos in positive.items():
        h = history[name].to(pos.device, torch.float64)
        consistency = torch.where(pos > 0, h, 1 - h)
        mask[name] = (consistency > tau).to(torch.float64)
        new_history[name] = (h * count + pos) / (count + 1)
    return mask, new_history


def heal_weights(
    distances: Sequence[float],
    previous: Sequence[float],
    previous_delta: Sequence[float],
    beta: float,
    total: float | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """FedHEAL's aggregation weights with momentum (FAEL):

        dw_k = (1 - beta) dw_k_prev + beta d_k / D,   w_k = w_k_prev + dw_k,   p_k = w_k / sum_j w_j

    over the round's clients, ``D = total`` or, when None, ``sum_j d_j`` over them. Where ``D`` is 0 the distance
    term is 0 (no client moved).

    Returns:
        ``(p, w, dw)``, float64: the normalized weights, and the unnormalized ``w_k`` and ``dw_k`` to keep.
    """
    d = torch.as_tensor(list(distances), dtype=torch.float64)
    w_prev = torch.as_tensor(list(previous), dtype=torch.float64)
    dw_prev = torch.as_tensor(list(previous_delta), dtype=torch.float64)
    if not len(d) == len(w_prev) == len(dw_prev) or len(d) == 0:
        raise ValueError(
            f"heal_weights needs as many distances ({len(d)}), weights ({len(w_prev)}) and increments "
            f"({len(dw_prev)}) as clients, at least one."
        )
    if (d < 0).any() or not torch.isfinite(d).all():
        raise ValueError(f"Distances must be finite and >= 0, got {d.tolist()}.")
    denominator = float(d.sum()) if total is None else float(total)
    share = d / denominator if denominator > 0 else torch.zeros_like(d)
    dw = (1 - beta) * dw_prev + beta * share
    w = w_prev + dw
    return normalized_weights(w.tolist()), w, dw


def heal_aggregate(
    reference: State, updates: Sequence[State], masks: Sequence[State], weights: Sequence[float]
) -> dict[str, Tensor]:
    """``theta_g - sum_k q_k * (u_k * m_k)`` per tensor of ``reference``, elementwise, with
    ``q_k = p_k m_k / sum_j p_j m_j`` where some client's mask is 1 and ``q_k = p_k`` where every mask is 0
    (FedHEAL's masked aggregation; ``u_k = theta_g - theta_k``, ``p`` the normalized ``weights``).

    Float64 inside, cast back to each tensor's dtype (integer tensors rounded).
    """
    if not (len(updates) == len(masks) == len(weights)):
        raise ValueError(f"{len(updates)} updates, {len(masks)} masks and {len(weights)} weights.")
    p = normalized_weights(weights)
    out = {}
    for key, ref in reference.items():
        u = torch.stack([s[key].to(ref.device, torch.float64) for s in updates])
        m = torch.stack([s[key].to(ref.device, torch.float64) for s in masks])
        pk = p.to(ref.device).view(-1, *([1] * ref.dim()))
        adjusted = pk * m
        total = adjusted.sum(0, keepdim=True)
        q = torch.where(total == 0, pk.expand_as(m), adjusted / torch.where(total == 0, 1.0, total))
        out[key] = cast_like(ref.to(torch.float64) - (q * u * m).sum(0), ref)
    return out


class FedHEAL(Strategy):
    """Consistency-masked client updates, combined with momentum weights that grow with each client's distance.

    Args:
        tau: Consistency threshold: a coordinate of a client's update counts when more than this fraction of its
            past updates had the same sign (default 0.3, the paper's). In [0, 1).
        beta: Momentum of the weight increments (default 0.4, the paper's). In [0, 1].
        sign_count: ``participations`` (default) or ``rounds``: what the running sign fraction divides by.
        distance_share: ``round`` (default) or ``seen``: over which clients the distances are normalized.
    """

    def __init__(
        self,
        *,
        tau: float = 0.3,
        beta: float = 0.4,
        sign_count: Literal["participations", "rounds"] = "participations",
        distance_share: Literal["round", "seen"] = "round",
    ) -> None:
        super().__init__()
        problems = []
        if isinstance(tau, bool) or not isinstance(tau, (int, float)) or not 0 <= tau < 1:
            problems.append(f"strategy.init_args.tau={tau!r} must be in [0, 1) (0.3 is the paper's)")
        if isinstance(beta, bool) or not isinstance(beta, (int, float)) or not 0 <= beta <= 1:
            problems.append(f"strategy.init_args.beta={beta!r} must be in [0, 1] (0.4 is the paper's)")
        if sign_count not in ("participations", "rounds"):
            problems.append(f"strategy.init_args.sign_count={sign_count!r} is not one of ['participations', 'rounds']")
        if distance_share not in ("round", "seen"):
            problems.append(f"strategy.init_args.distance_share={distance_share!r} is not one of ['round', 'seen']")
        if problems:
            raise ConfigError("FedHEAL: " + "; ".join(problems) + ".")
        self.tau, self.beta = float(tau), float(beta)
        self.sign_count, self.distance_share = sign_count, distance_share
        self.history: dict[str, dict[str, Tensor]] = {}
        self.counts: dict[str, int] = {}
        self.weights: dict[str, float] = {}
        self.deltas: dict[str, float] = {}
        self.distances: dict[str, float] = {}
        self.last_weights: dict[str, float] = {}

    @override
    def setup_server_state(self) -> None:
        """No history, no weights yet."""
        self.history, self.counts, self.weights, self.deltas, self.distances = {}, {}, {}, {}, {}
        self.last_weights = {}

    @override
    def aggregate(self, server_round: int, updates: list[ClientUpdate]) -> dict[str, Tensor]:
        """Masks and distances per client, the momentum weights, then the masked, reweighted update."""
        if not updates:
            return dict(self.global_state)
        self.check_uploads(updates)
        keys = list(updates[0].state)
        for update in updates:
            if set(update.state) != set(keys):
                raise KeyError(
                    f"FedHEAL: client {update.client_id!r} uploaded other tensors than "
                    f"{updates[0].client_id!r}: {sorted(set(update.state) ^ set(keys))[:5]}"
                )
        params = set(self.shared_parameter_names())
        theta = {n: self.global_state[n] for n in keys}
        masked, masks = [], []
        for update in updates:
            k = update.client_id
            u = {n: theta[n].to(torch.float64) - update.state[n].to(theta[n].device, torch.float64) for n in keys}
            seen = k in self.history
            count = (self.counts.get(k, 0) if self.sign_count == "participations" else server_round - 1) if seen else 0
            mask, self.history[k] = heal_consistency_mask(u, self.history.get(k), count, self.tau)
            self.counts[k] = self.counts.get(k, 0) + 1
            masks.append(mask)
            masked.append({n: u[n] * mask[n] for n in keys})
            self.distances[k] = float(sum(masked[-1][n].norm() for n in keys if n in params))
        ids = [u.client_id for u in updates]
        total = sum(self.distances.values()) if self.distance_share == "seen" else None
        p, w, dw = heal_weights(
            [self.distances[k] for k in ids],
            [self.weights.get(k, 1 / len(ids)) for k in ids],
            [self.deltas.get(k, 0.0) for k in ids],
            self.beta,
            total=total,
        )
        for k, wk, dwk in zip(ids, w.tolist(), dw.tolist(), strict=True):
            self.weights[k], self.deltas[k] = wk, dwk
        self.last_weights = dict(zip(ids, p.tolist(), strict=True))
        return {**self.global_state, **heal_aggregate(theta, masked, masks, p.tolist())}

    @override
    def state_dict(self) -> dict[str, Any]:
        """The server state, every client's sign history and count, weights, increments and distances."""
        return {
            **super().state_dict(),
            "history": self.history,
            "counts": dict(self.counts),
            "weights": dict(self.weights),
            "deltas": dict(self.deltas),
            "distances": dict(self.distances),
            "last_weights": dict(self.last_weights),
        }

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`."""
        super().load_state_dict(state_dict)
        self.history = {k: dict(h) for k, h in state_dict["history"].items()}
        self.counts = dict(state_dict["counts"])
        self.weights, self.deltas = dict(state_dict["weights"]), dict(state_dict["deltas"])
        self.distances, self.last_weights = dict(state_dict["distances"]), dict(state_dict["last_weights"])
