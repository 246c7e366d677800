"""FedDyn: federated learning based on dynamic regularization.

Acar, Zhao, Matas Navarro, Mattina, Whatmough, Saligrama. "Federated Learning Based on Dynamic Regularization."
ICLR 2021. https://openreview.net/forum?id=B7v4QMR6Z9w

Algorithm 1 (FedDyn), written as the FedPxN authors' code (Yang et al., CHIL 2023) computes it, with
``h_k = -grad L_k(theta_k) / alpha`` and the server's ``h = -alpha hbar``:

- client k: minimize ``L_k(theta) + alpha <theta, -theta_anchor + h_k> + (alpha / 2) ||theta||^2``, which is
  Algorithm 1's ``L_k(theta) - <grad L_k(theta_k^{t-1}), theta> + (alpha / 2) ||theta - theta^{t-1}||^2`` up to
  a constant when ``theta_anchor = theta^{t-1}``
- client k, after training (the first-order condition update): ``h_k <- h_k + theta_k - theta_cld``
- server: ``theta_srv = (1 / |P_t|) sum_{k in P_t} theta_k``, ``hbar = (1 / N) sum_{all k} h_k`` (kept
  incrementally: ``hbar += sum_{k in P_t} (theta_k - theta_cld) / N``), ``theta_cld = theta_srv + hbar``
- clients receive ``theta_cld`` (the paper's ``theta^t``) and start from it

Symbols -> code: ``theta_srv`` -> ``self.global_state`` (the repo's ``server_model``, the paper code's
``avg_model``); ``theta_cld`` -> ``self.cloud_state`` (``cld_model``); ``hbar`` -> ``self.h_mean`` (the mean of
the repo's ``prev_grads``); ``h_k`` -> ``client_state["h"]`` (per client in the client store, zero until the
client first trains); ``alpha`` -> ``alpha``; ``N`` -> every client; ``P_t`` -> the round's ``updates``.

Where ``h_k`` lives: each client keeps its own ``h_k`` (it needs it in its loss), and the server keeps only the
mean ``hbar``, which it can update from what it already has (the uploaded ``theta_k`` and the ``theta_cld`` it
sent), so nothing beyond the model goes up. Both are checkpointed, as are ``theta_srv`` and ``theta_cld``.

Decisions, each a constructor argument whose other value gives the alternative:

- ``anchor="server"``: the linear term uses ``theta_srv``, as the FedPxN code
  (``get_param_tensor(server_model)``) do; the client then also downloads ``theta_srv``'s parameters (counted).
  ``anchor="cloud"`` is the paper's Algorithm 1 and the official code (``cld_mdl_param``): the model received.
- ``buffers="average"``: shared buffers (BatchNorm running statistics) are a plain mean, ``theta_cld =
  theta_srv`` there, and have no ``h``: they are not optimized, so there is no first-order condition to correct,
  and the correction can make a running variance negative (round 1 gives ``2 mean(var_k) - 1``; with few local
  steps clients then upload negative variances and evaluation turns NaN, as a 10-step run of the heart recipe did).
  ``"dynamic"`` treats every floating shared tensor like a parameter, as the FedPxN code's loops over
  ``state_dict()`` do (its eICU models have no BatchNorm). The regularizer only ever covers shared parameters.
- ``evaluate_with="server"``: clients are evaluated with ``theta_srv``, as the FedPxN code validates (and, for
  skin, tests) ``server_model`` and the official code reports ``avg_model``; ``"cloud"`` evaluates ``theta_cld``.

Deviation: the FedPxN code gets ``(alpha / 2) ||theta||^2`` from the optimizer (``Adam(weight_decay=alpha +
weight_decay)``); here it is written in :meth:`FedDyn.training_loss`. Its gradient ``alpha theta`` is what SGD's
and Adam's (coupled) weight decay add, so the steps are the same (tested); with AdamW the decay would be
decoupled and differ. Deviation: ``num_batches_tracked`` is the rounded mean (the FedPxN code copies client 0's).
The official code's per-client ``alpha / (N n_k / n)`` is not used (the FedPxN code does not use it
either); alpha = 0.01 (the FedPxN eICU script's default is 0.1).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

import torch
from torch import Tensor
from typing_extensions import override

from fedlit.core.contexts import Batch, StepOutput
from fedlit.core.errors import ConfigError
from fedlit.module import FederatedModule
from fedlit.strategies.base import ClientUpdate, Strategy
from fedlit.strategies.common.aggregate import State, weighted_average


def feddyn_penalty(params: Mapping[str, Tensor], anchor: State, h: State, alpha: float) -> Tensor:
    """``alpha * sum_k [<theta_k, -anchor_k + h_k> + ||theta_k||^2 / 2]`` over the keys of ``params``
    (FedDyn's client regularizer; differentiable in ``params``)."""
    if not params:
        raise ValueError("feddyn_penalty of an empty set of tensors.")
    terms = [
        (p * (h[n].to(p.device, p.dtype) - anchor[n].to(p.device, p.dtype))).sum() + p.pow(2).sum() / 2
        for n, p in params.items()
    ]
    return alpha * torch.stack(terms).sum()


def feddyn_server_update(
    states: Sequence[State], cloud: State, h_mean: State, num_clients: int
) -> tuple[dict[str, Tensor], dict[str, Tensor], dict[str, Tensor]]:
    """FedDyn's server: ``theta_srv = mean_k theta_k`` (unweighted, over the round's clients),
    ``hbar += sum_k (theta_k - theta_cld) / N`` and ``theta_cld = theta_srv + hbar``.

    ``hbar`` is the mean of every client's ``h_k`` (clients that did not train keep theirs), i.e. the paper's
    ``-h^t / alpha``. Tensors absent from ``h_mean`` get no correction: their ``theta_cld`` is ``theta_srv``.

    Args:
        states: The round's client models theta_k.
        cloud: theta_cld, the model the clients received this round.
        h_mean: hbar before this round, for the corrected keys.
        num_clients: N, all clients of the federation.

    Returns:
        ``(theta_srv, hbar, theta_cld)``.
    """
    if num_clients < len(states):
        raise ValueError(f"num_clients={num_clients} is smaller than the {len(states)} updates of the round.")
    server = weighted_average(states, [1.0] * len(states))
    new_h, new_cloud = {}, dict(server)
    for key, h in h_mean.items():
        drift = sum(s[key].to(h.device, torch.float64) - cloud[key].to(h.device, torch.float64) for s in states)
        new_h[key] = (h.to(torch.float64) + drift / num_clients).to(h.dtype)
        new_cloud[key] = (server[key].to(h.device, torch.float64) + new_h[key].to(torch.float64)).to(h.dtype)
    return server, new_h, new_cloud


class FedDyn(Strategy):
    """Dynamic regularization: each client's loss is corrected by its accumulated drift ``h_k``.

    Args:
        alpha: Regularization weight alpha (default 0.01).
        anchor: ``server`` pulls toward ``theta_srv`` (FedPxN code); ``cloud`` toward the model
            received, ``theta_cld`` (the paper).
        buffers: ``average`` averages shared buffers (BatchNorm statistics) plainly; ``dynamic`` corrects them like
            parameters (FedPxN code).
        evaluate_with: ``server`` evaluates ``theta_srv`` (FedPxN code, paper code); ``cloud`` evaluates
            ``theta_cld``.
    """

    def __init__(
        self,
        *,
        alpha: float = 0.01,
        anchor: Literal["server", "cloud"] = "server",
        buffers: Literal["average", "dynamic"] = "average",
        evaluate_with: Literal["server", "cloud"] = "server",
    ) -> None:
        super().__init__()
        problems = []
        if not alpha > 0:
            problems.append(f"strategy.init_args.alpha={alpha} must be > 0 (default 0.01)")
        for key, value, allowed in (
            ("anchor", anchor, ("server", "cloud")),
            ("buffers", buffers, ("average", "dynamic")),
            ("evaluate_with", evaluate_with, ("server", "cloud")),
        ):
            if value not in allowed:
                problems.append(f"strategy.init_args.{key}={value!r} is not one of {list(allowed)}")
        if problems:
            raise ConfigError("Invalid FedDyn settings: " + "; ".join(problems) + ".")
        self.alpha, self.anchor, self.buffers, self.evaluate_with = alpha, anchor, buffers, evaluate_with
        self.cloud_state: dict[str, Tensor] = {}
        self.h_mean: dict[str, Tensor] = {}
        self._turn: dict[str, Any] = {}

    # ------------------------------------------------------------------------------------------ server
    @override
    def setup_server_state(self) -> None:
        """``theta_cld = theta_srv`` (the initial shared tensors); ``hbar = 0``."""
        super().setup_server_state()
        self.cloud_state = {n: t.clone() for n, t in self.global_state.items()}
        params = set(self.shared_parameter_names())
        corrected = [
            n
            for n, t in self.global_state.items()
            if t.is_floating_point() and (n in params or self.buffers == "dynamic")
        ]
        self.h_mean = {n: torch.zeros_like(self.global_state[n]) for n in corrected}

    @override
    def configure_client(self, server_round: int, client_id: str) -> dict[str, Tensor]:
        """``theta_cld``: the model every client starts from."""
        return dict(self.cloud_state)

    @override
    def configure_client_extras(self, server_round: int, client_id: str) -> dict[str, Any]:
        """With ``anchor="server"``, ``theta_srv``'s shared parameters (the regularizer's anchor); else nothing."""
        if self.anchor == "cloud":
            return {}
        return {"server_state": {n: self.global_state[n] for n in self.shared_parameter_names()}}

    @override
    def configure_evaluate(self, server_round: int, client_id: str) -> dict[str, Tensor]:
        """``theta_srv`` (``evaluate_with="server"``) or ``theta_cld``."""
        return dict(self.global_state if self.evaluate_with == "server" else self.cloud_state)

    @override
    def aggregate(self, server_round: int, updates: list[ClientUpdate]) -> dict[str, Tensor]:
        """``theta_srv = mean theta_k``, ``hbar += sum (theta_k - theta_cld) / N``, ``theta_cld = theta_srv + hbar``."""
        if not updates:
            return dict(self.global_state)
        self.check_uploads(updates)
        server, h_mean, cloud = feddyn_server_update(
            [u.state for u in updates], self.cloud_state, self.h_mean, len(self.client_ids)
        )
        self.cloud_state.update({n: t.to(self.cloud_state[n].device) for n, t in cloud.items()})
        self.h_mean.update(h_mean)
        return {**self.global_state, **{n: t.to(self.global_state[n].device) for n, t in server.items()}}

    @override
    def state_dict(self) -> dict[str, Any]:
        return {"global_state": self.global_state, "cloud_state": self.cloud_state, "h_mean": self.h_mean}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.global_state = dict(state_dict["global_state"])
        self.cloud_state = dict(state_dict["cloud_state"])
        self.h_mean = dict(state_dict["h_mean"])

    # ------------------------------------------------------------------------------------------ client
    def on_client_fit_start(
        self,
        pl_module: FederatedModule,
        received: dict[str, Tensor],
        received_extras: dict[str, Any],
        client_state: dict[str, Any],
    ) -> None:
        """Keep ``theta_cld`` (for the ``h_k`` update), the anchor and ``h_k`` (0 the first time)."""
        params = {n: p for n, p in pl_module.shared_parameters() if n in received}
        anchor = received_extras["server_state"] if self.anchor == "server" else received
        h = client_state.get("h") or {n: torch.zeros_like(received[n]) for n in params}
        self._turn = {
            "params": params,
            "cloud": {n: received[n].detach().clone() for n in params},
            "anchor": {n: anchor[n].detach().to(p.device, p.dtype) for n, p in params.items()},
            "h": h,
            "h_device": {n: h[n].to(p.device, p.dtype) for n, p in params.items()},
        }

    @override
    def training_loss(
        self, pl_module: FederatedModule, loss: Tensor, batch: Batch, outputs: StepOutput = None
    ) -> Tensor:
        """``loss + alpha <theta, -theta_anchor + h_k> + (alpha / 2) ||theta||^2`` over the shared parameters."""
        turn = self._turn
        if not turn or not turn["params"]:
            return loss
        return loss + feddyn_penalty(turn["params"], turn["anchor"], turn["h_device"], self.alpha)

    def on_client_fit_end(self, update: ClientUpdate, client_state: dict[str, Any]) -> None:
        """``h_k <- h_k + theta_k - theta_cld`` (kept where the store keeps the client's tensors)."""
        turn = self._turn
        if not turn:
            return
        client_state["h"] = {
            n: h.to(update.state[n].device) + update.state[n] - turn["cloud"][n].to(update.state[n].device)
            for n, h in turn["h"].items()
        }
        self._turn = {}
