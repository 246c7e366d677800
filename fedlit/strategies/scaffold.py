"""SCAFFOLD: stochastic controlled averaging for federated learning.

Karimireddy, Kale, Mohri, Reddi, Stich, Suresh. "SCAFFOLD: Stochastic Controlled Averaging for Federated
Learning." ICML 2020. https://arxiv.org/abs/1910.06378

Algorithm 1, control variates option II (Section 4, Eqs. 3-5):

- local step, K times (line 10, Eq. 3): ``y_i <- y_i - eta_l (g_i(y_i) + c - c_i)``
- after the K steps (line 12, Eq. 4 option II): ``c_i+ = c_i - c + (x - y_i) / (K eta_l)``
- upload (line 13): ``y_i`` (the server subtracts ``x``) and ``delta c_i = c_i+ - c_i``; then ``c_i <- c_i+``
- server (lines 16-17, Eq. 5): ``x <- x + eta_g / |S| sum_{i in S} (y_i - x)``,
  ``c <- c + 1 / N sum_{i in S} delta c_i``

Symbols -> code: ``x`` -> ``self.global_state``; ``c`` -> ``self.c`` (server state, sent with
``configure_client_extras`` and counted as download); ``c_i`` -> ``client_state["c_i"]`` (per client in the
:class:`~fedlit.core.store.ClientStore`, zero until the client first trains); ``y_i`` -> ``update.state``;
``delta c_i`` -> ``update.extras["delta_c"]`` (counted as upload); ``eta_l`` -> the learning rate of each
parameter's group in the optimizer the hook receives; ``K eta_l`` -> the sum of those rates over the K local steps
that happened (``K`` = ``update.metrics["steps"]``: a step that 16-bit mixed precision's gradient scaler skipped
over inf/NaN gradients did not move ``y_i`` and is not counted); ``eta_g`` -> ``eta_g``; ``N`` ->
``len(self.client_ids)``, every client of the federation; ``S`` -> the round's ``updates``; ``w_i`` -> the
normalized weights of ``control_weighting``.

Decision (``control_weighting``): the server moves ``c`` with the weights it gives the models,
``c <- c + (|S| / N) sum_{i in S} w_i delta c_i``, ``w_i = n_i / sum_{j in S} n_j`` under
``weighting="num_examples"`` (what FLamby's SCAFFOLD runs) and ``w_i = 1 / |S|`` under ``weighting="uniform"``,
where it is the paper's ``c <- c + 1 / N sum_{i in S} delta c_i``. With sample-weighted models and an unweighted
``c`` the corrections ``c - c_i`` no longer cancel in the server's weighted mean, and the model drifts.
``control_weighting="uniform"`` or ``"num_examples"`` picks either rule whatever ``weighting`` is.

Deviation: ``weighting="num_examples"`` weighs ``y_i - x`` by the clients' training examples (the paper's mean
is uniform, the default here). Deviation: the local step is the module's own optimizer, with ``c - c_i`` added
to the gradient of every shared parameter in ``on_before_optimizer_step``. That is Eq. 3 exactly for SGD
without momentum or weight decay; with momentum, weight decay or Adam the step is not Eq. 3 and option II's
``c_i+`` is the paper's approximation (a warning says so, once). Deviation: only shared parameters have control
variates. Shared buffers (BatchNorm statistics) have no gradient to correct: they are uploaded and stepped by the
server like parameters (``x += eta_g sum_i w_i (y_i - x)``, integer ones rounded); personal tensors take no part.
Deviation: a client none of whose steps happened (every one skipped by the gradient scaler) keeps its ``c_i`` and
uploads ``delta c_i = 0``: ``(x - y_i) / (K eta_l)`` is undefined for ``K = 0``.

The reference code, PFLlib (``serverscaffold.py``, ``clientscaffold.py``), differs from the paper in three places
we do not follow by default: it weighs ``y_i - x`` by sample counts (``weighting="num_examples"`` reproduces
that), it adds ``|S| / N * delta c_i`` per client (``|S|`` times the paper's step on ``c``), and it divides by the
batches of one epoch rather than by K.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import torch
from torch import Tensor
from torch.optim import Optimizer
from typing_extensions import override

from fedlit.core.errors import ConfigError
from fedlit.module import FederatedModule
from fedlit.strategies.base import ClientUpdate, Strategy
from fedlit.strategies.common.aggregate import WEIGHTINGS, State, cast_like, client_weights, normalized_weights


def server_step(
    reference: State, states: Sequence[State], weights: Sequence[float], step_size: float
) -> dict[str, Tensor]:
    """``x + step_size * sum_i w_i (y_i - x) / sum_i w_i`` per tensor of ``reference`` (SCAFFOLD Eq. 5, first half).

    With ``step_size = 1`` this is the weighted mean of the states. Float64 inside; floating tensors keep their
    dtype, integer ones (``num_batches_tracked``) are rounded.
    """
    w = normalized_weights(weights)
    out = {}
    for key, x in reference.items():
        delta = torch.zeros(x.shape, dtype=torch.float64, device=x.device)
        for wi, state in zip(w, states, strict=True):
            delta += wi.to(x.device) * (state[key].to(x.device, torch.float64) - x.to(torch.float64))
        value = x.to(torch.float64) + step_size * delta
        out[key] = cast_like(value, x)
    return out


def scaffold_control_variate(
    c_local: State, c_global: State, x: State, y: State, k_lr: Mapping[str, float]
) -> dict[str, Tensor]:
    """``c_i+ = c_i - c + (x - y_i) / (K lr)`` per tensor of ``c_local`` (SCAFFOLD Eq. 4, option II).

    Args:
        c_local: The client's control variate c_i.
        c_global: The server's control variate c.
        x: The model the client received.
        y: The client's model after its K local steps.
        k_lr: ``K * lr`` per tensor (the sum of the learning rates of the K steps).
    """
    out = {}
    for key, ci in c_local.items():
        if k_lr[key] <= 0:
            raise ValueError(f"SCAFFOLD needs K * lr > 0 for {key!r}, got {k_lr[key]} (a zero learning rate?).")
        drift = (x[key].to(ci.device, torch.float64) - y[key].to(ci.device, torch.float64)) / k_lr[key]
        out[key] = (ci.to(torch.float64) - c_global[key].to(ci.device, torch.float64) + drift).to(ci.dtype)
    return out


def scaffold_server_control(
    c: State, deltas: Sequence[State], weights: Sequence[float], num_clients: int
) -> dict[str, Tensor]:
    """``c + (|S| / N) sum_i w_i delta_i``, ``w_i = weights_i / sum_j weights_j``, per tensor of ``c`` (SCAFFOLD
    Eq. 5, second half, with the weights of the model's mean: equal weights give the paper's
    ``c + sum_i delta_i / N``).

    Args:
        c: The server's control variate.
        deltas: The round's ``delta c_i = c_i+ - c_i``, ``|S|`` of them.
        weights: One non-negative weight per client (1 each, or its examples).
        num_clients: N, all clients of the federation.
    """
    if len(deltas) != len(weights):
        raise ValueError(f"{len(deltas)} control variates but {len(weights)} weights.")
    if num_clients < len(deltas):
        raise ValueError(f"num_clients={num_clients} is smaller than the {len(deltas)} updates of the round.")
    normalized_weights(weights)  # raises on negative weights or a zero total
    total = float(sum(weights))
    factors = [len(deltas) * float(w) / total for w in weights]  # |S| w_i: exactly 1 each for equal weights
    out = {}
    for key, ci in c.items():
        step = sum(f * d[key].to(ci.device, torch.float64) for f, d in zip(factors, deltas, strict=True))
        out[key] = (ci.to(torch.float64) + step / num_clients).to(ci.dtype)
    return out


class SCAFFOLD(Strategy):
    """Stochastic controlled averaging: client drift corrected by control variates (option II).

    Args:
        eta_g: Global step size eta_g (1: the server takes the mean of the client models).
        weighting: ``uniform`` averages ``y_i - x`` equally (the paper); ``num_examples`` weighs client i by its
            training examples (PFLlib, FLamby).
        control_weighting: The weights of ``delta c_i`` in the server's step on ``c``: ``same`` as ``weighting``
            (so that the corrections cancel in the weighted mean), or ``uniform`` / ``num_examples`` regardless.
    """

    def __init__(
        self,
        *,
        eta_g: float = 1.0,
        weighting: Literal["uniform", "num_examples"] = "uniform",
        control_weighting: Literal["same", "uniform", "num_examples"] = "same",
    ) -> None:
        super().__init__()
        problems = []
        if not eta_g > 0:
            problems.append(f"strategy.init_args.eta_g={eta_g} must be > 0 (1 is the paper's default)")
        if weighting not in WEIGHTINGS:
            problems.append(f"strategy.init_args.weighting={weighting!r} is not one of {list(WEIGHTINGS)}")
        if control_weighting not in ("same", *WEIGHTINGS):
            problems.append(
                f"strategy.init_args.control_weighting={control_weighting!r} is not one of "
                f"{['same', *WEIGHTINGS]} ('same' follows weighting)"
            )
        if problems:
            raise ConfigError("Invalid SCAFFOLD settings: " + "; ".join(problems) + ".")
        self.eta_g, self.weighting, self.control_weighting = eta_g, weighting, control_weighting
        self.c: dict[str, Tensor] = {}
        self._warned = False
        self._turn: dict[str, Any] = {}

    # ------------------------------------------------------------------------------------------ server
    @override
    def setup_server_state(self) -> None:
        """``c = 0`` for every shared parameter."""
        super().setup_server_state()
        self.c = {n: torch.zeros_like(self.global_state[n]) for n in self.shared_parameter_names()}

    @override
    def configure_client_extras(self, server_round: int, client_id: str) -> dict[str, Any]:
        """The server control variate ``c`` (line 5: ``(x, c)`` go to every selected client)."""
        return {"c": dict(self.c)}

    @override
    def expected_upload_extras(self, client_id: str) -> dict[str, Any]:
        """``delta c_i``: one tensor per shared parameter, shaped as ``c`` (line 13)."""
        return {"delta_c": dict(self.c)}

    def client_weights(self, updates: list[ClientUpdate], weighting: str | None = None) -> list[float]:
        """The weight of each ``y_i - x`` in the server step (of each ``delta c_i`` with ``weighting`` given)."""
        return client_weights(updates, weighting or self.weighting)

    @override
    def aggregate(self, server_round: int, updates: list[ClientUpdate]) -> dict[str, Tensor]:
        """``x += eta_g sum_i w_i (y_i - x)`` and ``c += (|S| / N) sum_i w_i delta c_i`` (lines 16-17, Eq. 5)."""
        if not updates:
            return dict(self.global_state)
        self.check_uploads(updates)
        missing = [u.client_id for u in updates if "delta_c" not in u.extras]
        if missing:
            raise KeyError(f"Clients {missing} uploaded no SCAFFOLD control variate (update.extras['delta_c']).")
        x = {n: self.global_state[n] for n in updates[0].state}
        new_state = {
            **self.global_state,
            **server_step(x, [u.state for u in updates], self.client_weights(updates), self.eta_g),
        }
        control = self.weighting if self.control_weighting == "same" else self.control_weighting
        self.c.update(
            scaffold_server_control(
                self.c,
                [u.extras["delta_c"] for u in updates],
                self.client_weights(updates, control),
                len(self.client_ids),
            )
        )
        return new_state

    @override
    def state_dict(self) -> dict[str, Any]:
        return {"global_state": self.global_state, "c": self.c}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.global_state = dict(state_dict["global_state"])
        self.c = dict(state_dict["c"])

    # ------------------------------------------------------------------------------------------ client
    def on_client_fit_start(
        self,
        pl_module: FederatedModule,
        received: dict[str, Tensor],
        received_extras: dict[str, Any],
        client_state: dict[str, Any],
    ) -> None:
        """Keep ``x`` and ``c``; load ``c_i`` (0 the first time) and precompute the correction ``c - c_i``."""
        params = {n: p for n, p in pl_module.shared_parameters() if n in received_extras["c"]}
        c = received_extras["c"]
        c_i = client_state.get("c_i") or {n: torch.zeros_like(c[n]) for n in params}
        self._turn = {
            "params": params,
            "x": {n: received[n].detach().clone() for n in params},
            "c": {n: c[n].detach().clone() for n in params},
            "c_i": c_i,
            "correction": {n: (c[n].to(p.device) - c_i[n].to(p.device)).to(p.dtype) for n, p in params.items()},
            "k_lr": dict.fromkeys(params, 0.0),
            "steps": 0,
            "pending_lr": None,
            "groups": None,
        }

    @override
    def on_before_optimizer_step(self, optimizer: Optimizer) -> None:
        """``g <- g + c - c_i`` on every shared parameter before the step (line 10, Eq. 3); notes each
        parameter's ``eta_l``, counted in ``K eta_l`` once the step has happened (:meth:`on_before_zero_grad`)."""
        turn = self._turn
        if not turn:
            return
        if turn["groups"] is None:
            self._check_optimizer(optimizer)
            group_of = {id(p): g for g in optimizer.param_groups for p in g["params"]}
            absent = [n for n, p in turn["params"].items() if id(p) not in group_of]
            if absent:
                raise ValueError(f"SCAFFOLD: shared parameters {absent[:5]} are not in the optimizer.")
            turn["groups"] = {n: group_of[id(p)] for n, p in turn["params"].items()}
        for name, param in turn["params"].items():
            correction = turn["correction"][name]
            if param.grad is None:  # unused this step: g = 0, the corrected step still moves it
                param.grad = correction.clone()
            else:
                param.grad.add_(correction)
        turn["pending_lr"] = {name: float(group["lr"]) for name, group in turn["groups"].items()}

    @override
    def on_before_zero_grad(self, optimizer: Optimizer, stepped: bool = True) -> None:
        """Count the step in ``K`` and its learning rates in ``K eta_l`` if it happened (``stepped``: the gradient
        scaler of 16-bit mixed precision skips steps whose gradients are not finite)."""
        turn = self._turn
        if not turn or turn["pending_lr"] is None:
            return
        if stepped:
            turn["steps"] += 1
            for name, lr in turn["pending_lr"].items():
                turn["k_lr"][name] += lr
        turn["pending_lr"] = None

    def on_client_fit_end(self, update: ClientUpdate, client_state: dict[str, Any]) -> None:
        """``c_i+ = c_i - c + (x - y_i) / (K eta_l)``; upload ``delta c_i = c_i+ - c_i`` (lines 12-14, Eq. 4)."""
        turn = self._turn
        if not turn:
            return
        c_i = {n: t.to(update.state[n].device) for n, t in turn["c_i"].items()}  # kept where the store keeps y_i
        if turn["steps"] == 0:
            warnings.warn(
                f"SCAFFOLD: client {update.client_id!r} took no optimizer step this round (the gradient scaler "
                "skipped every one over inf/NaN gradients): its control variate c_i is kept and it uploads "
                "delta c_i = 0. Lower the learning rate or train in 32-bit (federation.precision) if this repeats.",
                stacklevel=2,
            )
            new = {n: t.clone() for n, t in c_i.items()}
        else:
            new = scaffold_control_variate(c_i, turn["c"], turn["x"], update.state, turn["k_lr"])
        update.extras["delta_c"] = {n: new[n] - c_i[n] for n in new}
        client_state["c_i"] = new
        self._turn = {}

    def _check_optimizer(self, optimizer: Any) -> None:
        """Warn once unless the local step is Eq. 3's plain SGD (no momentum, no weight decay)."""
        groups = optimizer.param_groups
        decays = sorted({float(g.get("weight_decay", 0.0)) for g in groups})
        plain_sgd = (
            isinstance(optimizer, torch.optim.SGD)
            and all(g.get("momentum", 0) == 0 for g in groups)
            and decays == [0.0]
        )
        if plain_sgd or self._warned:
            return
        self._warned = True
        kind = type(optimizer).__name__.removeprefix("Fabric")
        momenta = sorted({g.get("momentum", g.get("betas")) for g in groups}, key=str)
        warnings.warn(
            f"SCAFFOLD assumes plain SGD local steps (Eq. 3; option II divides the model change by K * lr), got "
            f"{kind} with momentum/betas {momenta} and weight_decay {decays}: the control variates are the paper's "
            "approximation. Use model.init_args.optimizer=sgd with model.init_args.momentum=0 and "
            "model.init_args.weight_decay=0 (or torch.optim.SGD with momentum: 0 and weight_decay: 0 in "
            "model.init_args.optimizer.init_args) for the exact algorithm.",
            stacklevel=2,
        )
