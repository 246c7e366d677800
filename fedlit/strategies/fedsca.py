"""FedSCA: federated tuning with similarity-guided collaborative aggregation.

Zhang, Gao, Duan, Guo, Shah, Ranjan, Wei. "FedSCA: Federated Tuning with Similarity-guided Collaborative Aggregation
for Heterogeneous Medical Image Segmentation." arXiv 2025. https://arxiv.org/abs/2503.15390
The aggregation follows pFedGraph: Ye, Ni, Wu, Wang, Chen, Wang. "Personalized Federated Learning with Inferred
Collaboration Graphs." ICML 2023.

Three parts:

- FEL (parameter-efficient learning): only the adapters (and, if the model's roles say so, e.g. the mask decoder)
  train; the rest is frozen by the model's ``roles``.
- LAT (low-level adapter transmission): clients upload only the lowest ``L`` adapters in depth order; every other
  trainable tensor (higher adapters, decoder, head) is personal and never leaves the client.
- SGCA (similarity-guided collaborative aggregation, Eq. 7): with ``d_ij = ||Theta_i - Theta_j||_2`` over the
  uploaded tensors and ``m_j = n_j / sum n`` over the round's clients, client i receives its own mix

      W_i = argmin_{w in simplex} sum_j (w_j - m_j)^2 + alpha sum_j w_j d_ij = Proj_simplex(m - (alpha / 2) d_i),
      Theta_i <- sum_j W_ij Theta_j.

  Client loss: the task's loss + ``beta * (-cos(Theta_i, sum_j W_ij Theta_j))``, the received mix as the target,
  skipped in round 1 (and for a client that has not received a mix yet).

Deviation (the paper's Eq. 7 as printed uses the client's own share m_i, a constant that cancels, and a minus sign
that rewards dissimilar clients): the default is pFedGraph's form above; ``literal_eq7=True`` gives the printed
one.

Deviation (the scale of ``d``): Eq. 7 weighs raw L2 distances, which grow with the adapter's size, the learning
rate and the local steps, so one ``alpha`` means different things on different models. With equal distances
``d`` between N clients of equal size, a client keeps ``1/N + (N - 1) alpha d / (2N)`` for itself and nothing for
the others once ``alpha d >= 2``: it stops collaborating. fedlit therefore divides the distances by the round's
mean off-diagonal distance (``normalize_distances=True``, the default): ``alpha`` is then in units of that mean,
the equal-distance client keeps ``1/N + (N - 1) alpha / (2N)`` (0.58 for N = 6 at alpha = 1) and collaborates for
any ``alpha < 2``, on the tiny SAM as on ViT-B; a client farther than the others still gets less of them, one at
least twice the mean distance from every other client (at alpha = 1) none. ``normalize_distances=False`` gives
Eq. 7's raw distances. Each round's ``W`` is logged as ``sgca/weight/<i>/<j>`` (with ``sgca/own_weight_mean`` and
the raw ``sgca/distance_mean``) to the loggers and ``metrics.csv``.

What an adapter is: the module path up to the first dotted component of a tensor's name that contains
``adapter`` (any case: ``blocks.3.Space_Adapter``, ``layers.0.mlp_adapter``); its depth is the layer index that
:class:`fedlit.core.roles.RoleRule` reads (the first ``.N.`` of the name), adapters of one layer in model order
(Medical-SAM-Adapter: the space adapter, then the MLP adapter, of block 0 first). Only adapters whose tensors are
``shared`` under the model's roles count; frozen ones stay frozen.

Symbols -> code: ``Theta_j`` -> ``update.state``; ``W`` -> ``self.weights`` (rows and columns in
``self.weight_clients`` order); the mix sent to client i -> ``self.mixes[i]``; ``alpha``, ``beta`` ->
``self.alpha``, ``self.beta``; the math -> :func:`sgca_weights`, :func:`simplex_projection` and
:func:`cosine_regularizer`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor
from typing_extensions import override

from fedlit.core.contexts import Batch, StepOutput
from fedlit.core.errors import ConfigError
from fedlit.core.roles import ParameterRoles, RoleRule
from fedlit.module import FederatedModule
from fedlit.strategies.base import ClientUpdate, Strategy
from fedlit.strategies.common.aggregate import (
    State,
    client_weights,
    normalized_weights,
    pairwise_squared_distances,
    weighted_average,
)

_ADAPTER = re.compile("adapter", re.IGNORECASE)


def adapter_prefixes(names: list[str], depth_key: str = RoleRule.depth_key) -> list[str]:
    """The adapters among tensor ``names``, lowest first: each name's module path up to its first dotted component
    containing ``adapter`` (any case), ordered by the layer index ``depth_key`` finds (adapters without one last),
    then by first appearance."""
    first_seen: dict[str, int] = {}
    for name in names:
        parts = name.split(".")
        hit = next((i for i, part in enumerate(parts) if _ADAPTER.search(part)), None)
        if hit is not None:
            first_seen.setdefault(".".join(parts[: hit + 1]), len(first_seen))

    def depth(prefix: str) -> float:
        found = re.search(depth_key, prefix + ".")
        return int(found.group(1)) if found else float("inf")

    return sorted(first_seen, key=lambda p: (depth(p), first_seen[p]))


def _in_adapter(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def simplex_projection(v: Tensor) -> Tensor:
    """The Euclidean projection of ``v`` onto the probability simplex ``{w : w >= 0, sum w = 1}``.

    The exact sort-based algorithm (Duchi, Shalev-Shwartz, Singer, Chandra. "Efficient Projections onto the
    l1-Ball for Learning in High Dimensions." ICML 2008, Fig. 1; Held, Wolfe, Crowder 1974): sort ``u`` descending,
    ``rho = max{j : u_j - (sum_{r<=j} u_r - 1) / j > 0}``, ``theta = (sum_{r<=rho} u_r - 1) / rho``,
    ``w = max(v - theta, 0)``. Computed in float64.
    """
    v = v.to(torch.float64).reshape(-1)
    if v.numel() == 0 or not torch.isfinite(v).all():
        raise ValueError(f"simplex_projection needs a non-empty finite vector, got {v.tolist()}.")
    u = torch.sort(v, descending=True).values
    cumsum = torch.cumsum(u, 0)
    j = torch.arange(1, len(u) + 1, dtype=torch.float64)
    rho = int(torch.nonzero(u - (cumsum - 1) / j > 0).max()) + 1
    theta = (cumsum[rho - 1] - 1) / rho
    return torch.clamp(v - theta, min=0)


def sgca_weights(
    distances: Tensor, sizes: Sequence[float], alpha: float, *, normalize: bool = False, literal_eq7: bool = False
) -> Tensor:
    """FedSCA's per-client aggregation weights (SGCA, Eq. 7), one row per client.

    FedSCA: "FedSCA: Federated Tuning with Similarity-guided Collaborative Aggregation for Heterogeneous Medical
    Image Segmentation" (arXiv 2025), Eq. 7, corrected as in pFedGraph (Ye, Ni, Wu, Wang, Chen, Wang.
    "Personalized Federated Learning with Inferred Collaboration Graphs." ICML 2023):

        W_i = argmin_{w in simplex} sum_j (w_j - m_j)^2 + alpha sum_j w_j d_ij = Proj_simplex(m - (alpha / 2) d_i)

    (complete the square: the objective is ``||w - (m - alpha d_i / 2)||^2`` plus a constant).

    Args:
        distances: ``(N, N)`` distances ``d_ij = ||Theta_i - Theta_j||_2`` between the clients' uploads.
        sizes: ``n_j``, the clients' training examples; ``m_j = n_j / sum n``.
        alpha: Weight of the distance penalty (>= 0).
        normalize: Divide the distances by their mean off-diagonal value first (when it is > 0), making ``alpha``
            independent of the scale of the weights.
        literal_eq7: The paper's Eq. 7 as printed: the prior ``m_i`` (the client's own share, for every j) and a
            minus sign on the distance term, i.e. ``W_i = Proj_simplex(m_i 1 + (alpha / 2) d_i)``.

    Returns:
        ``(N, N)`` float64 weights; row ``i`` is on the simplex.
    """
    d = torch.as_tensor(distances, dtype=torch.float64)
    n = d.shape[0]
    if d.shape != (n, n):
        raise ValueError(f"sgca_weights needs an (N, N) distance matrix, got shape {tuple(d.shape)}.")
    if alpha < 0:
        raise ValueError(f"sgca_weights: alpha={alpha} must be >= 0.")
    m = normalized_weights(sizes)
    if len(m) != n:
        raise ValueError(f"{n} clients in the distances but {len(m)} sizes.")
    if normalize and n > 1:
        mean = d[~torch.eye(n, dtype=torch.bool)].mean()
        if mean > 0:
            d = d / mean
    rows = []
    for i in range(n):
        target = m[i].expand(n) + alpha / 2 * d[i] if literal_eq7 else m - alpha / 2 * d[i]
        rows.append(simplex_projection(target))
    return torch.stack(rows)


def flat_distances(states: Sequence[State]) -> Tensor:
    """``(N, N)`` float64 Euclidean distances ``||Theta_i - Theta_j||_2`` over all tensors of the states."""
    return pairwise_squared_distances(states).clamp(min=0).sqrt()


def cosine_regularizer(params: Mapping[str, Tensor], target: Mapping[str, Tensor], eps: float = 1e-8) -> Tensor:
    """FedSCA's client regularizer ``-cos(Theta_i, Theta_target)`` over the concatenation of ``params``' tensors
    (FedSCA, arXiv 2025: the client loss is the segmentation loss plus beta times this). Differentiable in
    ``params``; ``eps`` keeps a zero vector finite (its cosine is 0)."""
    if not params:
        raise ValueError("cosine_regularizer of an empty set of tensors.")
    a = torch.cat([p.reshape(-1) for p in params.values()])
    b = torch.cat([target[n].to(p.device, p.dtype).reshape(-1) for n, p in params.items()])
    return -torch.nn.functional.cosine_similarity(a, b, dim=0, eps=eps)


def sgca_log(weights: Tensor, clients: Sequence[str], distances: Tensor) -> dict[str, float]:
    """A round's SGCA as scalars: ``sgca/weight/<i>/<j>`` (``W_ij``, what client i takes of client j's upload),
    ``sgca/own_weight_mean`` (the mean of ``W_ii``; ``1 / N`` for FedAvg-like mixing, 1 without collaboration) and
    ``sgca/distance_mean`` (the mean off-diagonal raw distance ``d_ij``)."""
    n = len(clients)
    log = {
        f"sgca/weight/{ci}/{cj}": float(weights[i, j]) for i, ci in enumerate(clients) for j, cj in enumerate(clients)
    }
    log["sgca/own_weight_mean"] = float(weights.diagonal().mean()) if n else float("nan")
    off = distances[~torch.eye(n, dtype=torch.bool)]
    log["sgca/distance_mean"] = float(off.mean()) if off.numel() else 0.0
    return log


class FedSCA(Strategy):
    """Lowest adapters shared; each client receives its own similarity-guided mix of them; a cosine pull to it.

    Args:
        num_shared_adapters: ``L``, how many adapters, lowest first, clients upload and receive (default 1).
        alpha: Weight of the distance penalty in SGCA (Eq. 7; default 1.0, a choice of fedlit's), in units of the
            round's mean distance when ``normalize_distances``.
        beta: Weight of the cosine regularizer (default 0.01); 0 turns it off.
        normalize_distances: Divide the distances by their mean off-diagonal value before SGCA (default True, so
            ``alpha`` does not depend on the adapters' size or the learning rate; False: the paper's raw distances,
            with which a client whose distances reach ``2 / alpha`` gets no one else's adapter).
        literal_eq7: Use Eq. 7 as printed (own share m_i, distances rewarded) instead of pFedGraph's form
            (default False).
    """

    def __init__(
        self,
        *,
        num_shared_adapters: int = 1,
        alpha: float = 1.0,
        beta: float = 0.01,
        normalize_distances: bool = True,
        literal_eq7: bool = False,
    ) -> None:
        super().__init__()
        problems = []
        if not isinstance(num_shared_adapters, int) or num_shared_adapters < 1:
            problems.append(f"strategy.init_args.num_shared_adapters={num_shared_adapters!r} must be an integer >= 1")
        if alpha < 0:
            problems.append(f"strategy.init_args.alpha={alpha} must be >= 0 (0 gives every client the FedAvg mix)")
        if beta < 0:
            problems.append(f"strategy.init_args.beta={beta} must be >= 0 (0 turns the cosine regularizer off)")
        if problems:
            raise ConfigError("FedSCA: " + "; ".join(problems) + ".")
        self.num_shared_adapters = num_shared_adapters
        self.alpha, self.beta = float(alpha), float(beta)
        self.normalize_distances, self.literal_eq7 = bool(normalize_distances), bool(literal_eq7)
        self.adapters: list[str] = []
        self.mixes: dict[str, dict[str, Tensor]] = {}
        self.weights: Tensor = torch.zeros(0, 0, dtype=torch.float64)
        self.weight_clients: list[str] = []
        self._target: dict[str, Tensor] | None = None
        self._round_log: dict[str, float] = {}

    @override
    def configure_roles(self, roles: ParameterRoles) -> ParameterRoles:
        """The tensors of the lowest ``L`` shared adapters stay shared; every other shared tensor becomes personal."""
        shared = roles.names("shared")
        self.adapters = adapter_prefixes(shared)
        if not self.adapters:
            raise ConfigError(
                "FedSCA shares the lowest adapters, but no shared tensor of the model has 'adapter' in its module "
                f"path (shared tensors look like {shared[:3]}). Give the adapters the role 'shared' in "
                "model.init_args.roles (e.g. pattern '*adapter*') or use a model with adapters."
            )
        if self.num_shared_adapters > len(self.adapters):
            raise ConfigError(
                f"strategy.init_args.num_shared_adapters={self.num_shared_adapters} but the model has only "
                f"{len(self.adapters)} shared adapters ({self.adapters[:5]}...): give at most {len(self.adapters)}."
            )
        kept = self.adapters[: self.num_shared_adapters]
        return roles.replace(lambda n, r: r == "shared" and not any(_in_adapter(n, p) for p in kept), "personal")

    @override
    def setup_server_state(self) -> None:
        """No mix yet: every client starts from the initial shared tensors."""
        self.mixes = {}
        self.weights = torch.zeros(0, 0, dtype=torch.float64)
        self.weight_clients = []

    @override
    def configure_client(self, server_round: int, client_id: str) -> dict[str, Tensor]:
        """Client i's own mix ``sum_j W_ij Theta_j`` of its last round; before it has one, ``global_state``."""
        return dict(self.mixes.get(client_id, self.global_state))

    @override
    def aggregate(self, server_round: int, updates: list[ClientUpdate]) -> dict[str, Tensor]:
        """SGCA (Eq. 7): one mix per client of the round. ``global_state`` becomes the size-weighted mean (the mix
        with alpha = 0), which clients that have not trained yet receive."""
        if not updates:
            return dict(self.global_state)
        self.check_uploads(updates)
        states = [u.state for u in updates]
        sizes = client_weights(updates)
        distances = flat_distances(states)
        self.weights = sgca_weights(
            distances, sizes, self.alpha, normalize=self.normalize_distances, literal_eq7=self.literal_eq7
        )
        self.weight_clients = [u.client_id for u in updates]
        self._round_log = sgca_log(self.weights, self.weight_clients, distances)

        def on_server(state: dict[str, Tensor]) -> dict[str, Tensor]:
            return {n: t.to(self.global_state[n].device) for n, t in state.items()}

        for update, row in zip(updates, self.weights, strict=True):
            self.mixes[update.client_id] = on_server(weighted_average(states, row.tolist()))
        return {**self.global_state, **on_server(weighted_average(states, sizes))}

    def on_after_aggregate(self, server_round: int, log: dict[str, float]) -> None:
        """Add the round's SGCA weights (:func:`sgca_log`) to the round's log (TensorBoard, ``metrics.csv``)."""
        log.update(self._round_log)
        self._round_log = {}

    @override
    def configure_client_extras(self, server_round: int, client_id: str) -> dict[str, Any]:
        """Whether what the client receives is its own mix (no tensor: nothing counted as download), so the client
        knows it without the server's ``mixes`` (a deployed client has only what it receives)."""
        return {"has_mix": client_id in self.mixes}

    def on_client_fit_start(
        self, server_round: int, received: dict[str, Tensor], received_extras: dict[str, Any]
    ) -> None:
        """Keep the received mix as the cosine target, except in round 1 or before the client has a mix."""
        regularize = self.beta > 0 and server_round > 1 and bool(received_extras["has_mix"])
        self._target = {n: t.detach().clone() for n, t in received.items()} if regularize else None

    @override
    def training_loss(
        self, pl_module: FederatedModule, loss: Tensor, batch: Batch, outputs: StepOutput = None
    ) -> Tensor:
        """``loss + beta * (-cos(Theta_i, sum_j W_ij Theta_j))`` over the shared parameters; ``loss`` in round 1."""
        if self._target is None:
            return loss
        params = {n: p for n, p in pl_module.shared_parameters() if n in self._target}
        if not params:
            return loss
        return loss + self.beta * cosine_regularizer(params, self._target)

    @override
    def state_dict(self) -> dict[str, Any]:
        """The server state plus every client's mix and the last round's weights, so a resumed run is exact."""
        return {
            **super().state_dict(),
            "mixes": self.mixes,
            "weights": self.weights,
            "weight_clients": list(self.weight_clients),
        }

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`."""
        super().load_state_dict(state_dict)
        self.mixes = {c: dict(s) for c, s in state_dict["mixes"].items()}
        self.weights = state_dict["weights"]
        self.weight_clients = list(state_dict["weight_clients"])
