"""EPFL: personalized LoRA by similarity of the clients' B matrices.

Wang et al. "FHBench: Towards Efficient and Personalized Federated Learning for Multimodal Healthcare." arXiv 2025.
https://arxiv.org/abs/2504.10817 (EPFL is the method the benchmark proposes; its code, wph6/FHBench, was read.)

Every client fine-tunes LoRA adapters (A kaiming-uniform, B zero; on the q and v projections of every attention
block: ``fedlit.models.LoRA(r=8, alpha=16, fused_qkv="qv")`` for timm ViTs, ``target_modules: [query, value]``
for BERT-style encoders) and a classification head. After local training, client i uploads all its A and B
matrices. The server, from these uploads (copies taken before any update), computes per LoRA B tensor l in the
selected set psi and every pair of the round's clients

    d_ij^l = ||B_i^l - B_j^l||_F,     dbar_ij = mean_{l in psi} d_ij^l,
    s^_ij = (1 / dbar_ij) / sum_{k != i} (1 / dbar_ik),
    s_ij = (1 - lam) s^_ij  (j != i),   s_ii = lam,

and sends client i its own mix ``A_i <- sum_j s_ij A_j`` of every A tensor. B and the head are never overwritten:
B only measures similarity, the head never leaves the client. The client trains with cross-entropy (the task's
loss; the recipes give SGD, lr 1e-3, no momentum, a cosine schedule over rounds, batch 32, 1 epoch).

How fedlit expresses "uploaded but never overwritten": :meth:`EPFL.configure_roles` keeps the LoRA A tensors
(names containing ``lora_A``) ``shared`` and makes every other shared tensor ``personal`` (LoRA B, names
containing ``lora_B``; the head; anything else the model shared). Personal tensors stay in the client's store and
are never replaced by the server. The B tensors go up as an extra of the update (``update.extras["lora_B"]``,
counted as upload), so the download is each client's A mix only.

psi (``psi``): ``all`` B tensors, ``first_half`` (the first L // 2 of the L B tensors in model order, i.e. the
lower blocks), ``second_half`` (the others), or an explicit list of B tensor names. Model order is FHBench's:
block 0's q then v, block 1's q then v, ...

Deviation (zero distances): FHBench's code means to give identical B matrices a huge similarity, but its test
compares a list with 0 and never fires, so identical B matrices (B frozen or not yet moved from 0, or two clients
that ended equal) divide by zero and the weights become NaN. Here ``eps > 0`` uses ``1 / (dbar + eps)``;
the default ``eps = 0`` treats a zero distance as the maximum similarity (the limit of the formula): the clients at
distance 0 from i share ``1 - lam`` equally, the others get 0. With every B equal, each client keeps ``lam`` of its
own A and takes ``(1 - lam) / (N - 1)`` of every other client's, as with any ``eps > 0``.

Deviation (partial participation): FHBench trains every client every round. Here the weights are computed among
the round's clients; a client outside the round keeps the last mix it was sent; a client that has not trained yet
(or an evaluation-only client) receives ``global_state``, the sample-weighted mean of the round's A tensors (the
initial A before round 1). That mean is also evaluated on every client, with the client's own B and head
(:meth:`EPFL.global_model_state`; reported under ``global/...``). A round with one client leaves its A as it is
(``s_11 = 1``). The LoRA scale is alpha / r (FHBench's code uses the integer alpha // r; equal for r = 8,
alpha = 16).

Evaluation (``evaluation``): ``after_mix`` (the default, fedlit's protocol for every strategy) evaluates each
client with the mix it was sent after the round's aggregation, and the report takes every client at the round of
the best mean validation value. ``fhbench`` follows FHBench's benchmark: each client is evaluated right after its
local training, with the A it uploaded (before the mix; kept in its store, one copy of its A), and the report adds
``best_per_client``: each client's test values at its own best validation round (the usual ``best`` and ``last``
stay, for comparison with other strategies). A client that has not trained yet is evaluated as under ``after_mix``.

Memory: the server keeps one A mix per client that has trained (plus ``global_state``); each client's store holds
its own B, its head and every other personal tensor.

Symbols -> code: ``A_j`` -> ``update.state`` (the shared tensors); ``B_j^l`` -> ``update.extras["lora_B"][l]``;
psi -> ``self.distance_names``; ``dbar`` -> ``self.distances``; ``s`` -> ``self.weights`` (rows and columns in
``self.weight_clients`` order); client i's mix -> ``self.mixes[i]``; ``lam`` -> ``self.lam``; the math ->
:func:`mean_tensor_distances` and :func:`epfl_weights`.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from typing import Any, Literal

import torch
from torch import Tensor
from typing_extensions import override

from fedlit.core.errors import ConfigError
from fedlit.core.roles import ParameterRoles
from fedlit.module import FederatedModule
from fedlit.strategies.base import ClientUpdate, Strategy
from fedlit.strategies.common.aggregate import State, client_weights, weighted_average

PSI = ("all", "first_half", "second_half")
#: The key of the uploaded B tensors in ``ClientUpdate.extras``.
EXTRAS_KEY = "lora_B"


def mean_tensor_distances(states: Sequence[State], names: Sequence[str]) -> Tensor:
    """``(N, N)`` float64 ``dbar_ij = mean over l in names of ||X_i^l - X_j^l||_F``: the Frobenius distance per
    tensor, then the mean over tensors (EPFL's distance between clients' LoRA B matrices, FHBench, arXiv 2025)."""
    if not names:
        raise ValueError("mean_tensor_distances needs at least one tensor name.")
    n = len(states)
    out = torch.zeros(n, n, dtype=torch.float64)
    for name in names:
        flat = torch.stack([s[name].detach().to("cpu", torch.float64).reshape(-1) for s in states])
        # Exact differences (no matrix-product shortcut): identical tensors must be at distance exactly 0.
        out += torch.cdist(flat, flat, compute_mode="donot_use_mm_for_euclid_dist")
    out /= len(names)
    out.fill_diagonal_(0.0)
    return out


def epfl_weights(distances: Tensor, lam: float = 0.5, eps: float = 0.0) -> Tensor:
    """EPFL's mixing matrix (FHBench, arXiv 2025) from the clients' mean distances ``dbar``:

        s^_ij = (1 / dbar_ij) / sum_{k != i} (1 / dbar_ik),   s_ij = (1 - lam) s^_ij (j != i),   s_ii = lam.

    A zero distance (identical matrices, e.g. every B still at 0 in round 1) would divide by zero. With
    ``eps > 0`` the similarity is ``1 / (dbar + eps)``; with ``eps = 0`` a zero distance is the maximum similarity,
    the limit of ``s^`` as that distance goes to 0: the clients at distance 0 from ``i`` share ``1 - lam`` equally
    and the others get 0. A single client keeps its own value (``s_11 = 1``).

    Args:
        distances: ``(N, N)`` non-negative distances (the diagonal is ignored).
        lam: The weight of the client's own value, in [0, 1].
        eps: Added to every distance before inverting; >= 0.

    Returns:
        ``(N, N)`` float64; row ``i`` holds client i's weights, summing to 1.
    """
    d = torch.as_tensor(distances, dtype=torch.float64)
    n = d.shape[0]
    if d.ndim != 2 or d.shape != (n, n):
        raise ValueError(f"epfl_weights needs an (N, N) distance matrix, got shape {tuple(d.shape)}.")
    if not 0 <= lam <= 1:
        raise ValueError(f"epfl_weights: lam={lam} must be in [0, 1].")
    if eps < 0:
        raise ValueError(f"epfl_weights: eps={eps} must be >= 0.")
    off = ~torch.eye(n, dtype=torch.bool)
    if not torch.isfinite(d[off]).all() or (d[off] < 0).any():
        raise ValueError(f"epfl_weights: distances must be finite and >= 0, got {d.tolist()}.")
    if n == 1:
        return torch.ones(1, 1, dtype=torch.float64)
    if eps > 0:
        similarity = 1.0 / (d + eps)
    else:
        zero = (d == 0) & off
        similarity = torch.where(zero.any(dim=1, keepdim=True), zero.to(torch.float64), 1.0 / d)
    similarity = torch.where(off, similarity, torch.zeros_like(similarity))
    weights = (1 - lam) * similarity / similarity.sum(dim=1, keepdim=True)
    return weights + lam * torch.eye(n, dtype=torch.float64)


class EPFL(Strategy):
    """LoRA A mixed per client by the similarity of the clients' LoRA B; B and the head stay each client's own.

    Args:
        lam: ``lam``, the weight of a client's own A in its mix (default 0.5, FHBench's ``model_momentum``).
        psi: The B tensors the distances are averaged over: ``all``, ``first_half``, ``second_half`` (of the B
            tensors in model order) or a list of B tensor names (default ``all``).
        eps: Added to every mean distance before inverting it; 0 (the default) treats a zero distance as the
            maximum similarity instead (see the module docstring).
        evaluation: ``after_mix`` (default): each client evaluated with its mix, at the best mean validation round;
            ``fhbench``: with its trained A before the mix, and also reported at its own best validation round
            (``best_per_client``).
    """

    def __init__(
        self,
        *,
        lam: float = 0.5,
        psi: Literal["all", "first_half", "second_half"] | list[str] = "all",
        eps: float = 0.0,
        evaluation: Literal["after_mix", "fhbench"] = "after_mix",
    ) -> None:
        super().__init__()
        problems = []
        if not 0 <= lam <= 1:
            problems.append(f"strategy.init_args.lam={lam} must be in [0, 1] (the weight of a client's own A)")
        if eps < 0:
            problems.append(
                f"strategy.init_args.eps={eps} must be >= 0 (0 treats a zero distance as the maximum similarity)"
            )
        if isinstance(psi, str) and psi not in PSI:
            problems.append(f"strategy.init_args.psi={psi!r} is not one of {list(PSI)} or a list of LoRA B names")
        elif not isinstance(psi, str) and (not psi or not all(isinstance(n, str) for n in psi)):
            problems.append(
                f"strategy.init_args.psi={psi!r} must be one of {list(PSI)} or a non-empty list of LoRA B tensor names"
            )
        if evaluation not in ("after_mix", "fhbench"):
            problems.append(f"strategy.init_args.evaluation={evaluation!r} is not one of ['after_mix', 'fhbench']")
        if problems:
            raise ConfigError("EPFL: " + "; ".join(problems) + ".")
        self.lam, self.eps, self.evaluation = float(lam), float(eps), evaluation
        #: Read by the engine's report: also each client at its own best validation round (FHBench's protocol).
        self.per_client_selection = evaluation == "fhbench"
        self.psi: str | list[str] = psi if isinstance(psi, str) else list(psi)
        self.b_names: list[str] = []
        self.distance_names: list[str] = []
        self.mixes: dict[str, dict[str, Tensor]] = {}
        self.weights: Tensor = torch.zeros(0, 0, dtype=torch.float64)
        self.distances: Tensor = torch.zeros(0, 0, dtype=torch.float64)
        self.weight_clients: list[str] = []

    @override
    def configure_roles(self, roles: ParameterRoles) -> ParameterRoles:
        """LoRA A stays shared; LoRA B, the head and every other shared tensor become personal."""
        shared = roles.names("shared")
        a_names = [n for n in shared if "lora_A" in n]
        self.b_names = [n for n in shared if "lora_B" in n]
        if not a_names or not self.b_names:
            raise ConfigError(
                "EPFL mixes LoRA A by the similarity of LoRA B, but the model shares "
                f"{len(a_names)} tensors named '*lora_A*' and {len(self.b_names)} named '*lora_B*' (shared tensors "
                f"look like {shared[:3]}). Give the backbone LoRA (model.init_args.backbone.init_args.lora) and the "
                "role 'shared' to its adapters in model.init_args.roles (pattern 'backbone.*lora_*')."
            )
        self.distance_names = self._select_psi(self.b_names)
        return roles.replace(lambda n, r: r == "shared" and "lora_A" not in n, "personal")

    def _select_psi(self, b_names: list[str]) -> list[str]:
        half = len(b_names) // 2
        if self.psi == "all":
            return list(b_names)
        if self.psi in ("first_half", "second_half"):
            if half == 0:
                raise ConfigError(
                    f"strategy.init_args.psi={self.psi!r} needs at least 2 LoRA B tensors; the model "
                    f"has {b_names}. Use psi: all."
                )
            return b_names[:half] if self.psi == "first_half" else b_names[half:]
        unknown = [n for n in self.psi if n not in b_names]
        if unknown:
            hints = {n: difflib.get_close_matches(n, b_names, n=1) for n in unknown}
            raise ConfigError(
                f"strategy.init_args.psi: {unknown} are not shared LoRA B tensors of the model "
                f"(closest: {hints}); valid names: {b_names}."
            )
        return [n for n in b_names if n in self.psi]

    @override
    def setup_server_state(self) -> None:
        """No mix yet: every client starts from the initial A."""
        self.mixes = {}
        self.weights = torch.zeros(0, 0, dtype=torch.float64)
        self.distances = torch.zeros(0, 0, dtype=torch.float64)
        self.weight_clients = []

    @override
    def configure_client(self, server_round: int, client_id: str) -> dict[str, Tensor]:
        """Client i's own mix ``sum_j s_ij A_j`` of its last round; before it has one, ``global_state``."""
        return dict(self.mixes.get(client_id, self.global_state))

    @override
    def global_model_state(self, client_id: str) -> dict[str, Tensor]:
        """``global_state``, the sample-weighted mean of the last round's A, evaluated on every client beside its
        own mix (with the client's own B and head)."""
        return dict(self.global_state)

    def on_client_fit_end(self, pl_module: FederatedModule, update: ClientUpdate, client_state: dict[str, Any]) -> None:
        """Upload the client's B tensors beside its A (they stay personal: the server never sends them back);
        under ``evaluation: fhbench`` keep its trained A (before the mix) in its store, to be evaluated with."""
        device = next(iter(update.state.values())).device if update.state else torch.device("cpu")
        live = pl_module.named_tensors("personal")
        update.extras[EXTRAS_KEY] = {n: live[n].detach().to(device, copy=True) for n in self.b_names}
        if self.evaluation == "fhbench":
            client_state["trained"] = {n: t.detach().clone() for n, t in update.state.items()}

    @override
    def on_client_evaluate_start(self, pl_module: FederatedModule, client_state: dict[str, Any]) -> None:
        """Under ``evaluation: fhbench``, put the client's trained A (before the mix) over the received mix."""
        trained = client_state.get("trained") if self.evaluation == "fhbench" else None
        if not trained:
            return
        live = pl_module.named_tensors("shared")
        with torch.no_grad():
            for name, tensor in trained.items():
                live[name].copy_(tensor)

    @override
    def aggregate(self, server_round: int, updates: list[ClientUpdate]) -> dict[str, Tensor]:
        """One A mix per client of the round (the weights from its B distances); ``global_state`` becomes the
        sample-weighted mean of the round's A, which clients that have not trained yet receive."""
        if not updates:
            return dict(self.global_state)
        self.check_uploads(updates)
        missing = [u.client_id for u in updates if EXTRAS_KEY not in u.extras]
        if missing:
            raise KeyError(f"EPFL: clients {missing} uploaded no LoRA B (update.extras[{EXTRAS_KEY!r}]).")
        self.distances = mean_tensor_distances([u.extras[EXTRAS_KEY] for u in updates], self.distance_names)
        self.weights = epfl_weights(self.distances, self.lam, self.eps)
        self.weight_clients = [u.client_id for u in updates]
        states = [u.state for u in updates]

        def on_server(state: dict[str, Tensor]) -> dict[str, Tensor]:
            return {n: t.to(self.global_state[n].device) for n, t in state.items()}

        for update, row in zip(updates, self.weights, strict=True):
            self.mixes[update.client_id] = on_server(weighted_average(states, row.tolist()))
        return {**self.global_state, **on_server(weighted_average(states, client_weights(updates)))}

    @override
    def state_dict(self) -> dict[str, Any]:
        """The server state plus every client's mix and the last round's distances and weights (exact resume)."""
        return {
            **super().state_dict(),
            "mixes": self.mixes,
            "weights": self.weights,
            "distances": self.distances,
            "weight_clients": list(self.weight_clients),
        }

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`."""
        super().load_state_dict(state_dict)
        self.mixes = {c: dict(s) for c, s in state_dict["mixes"].items()}
        self.weights, self.distances = state_dict["weights"], state_dict["distances"]
        self.weight_clients = list(state_dict["weight_clients"])
