"""PGFed and PGFedMo: personalized global objectives from first-order approximations of the other clients' risks.

Luo, Mendieta, Chen, Wu. "PGFed: Personalize Each Client's Global Objective for Federated Learning." ICCV 2023.
https://arxiv.org/abs/2212.01448 (code: https://github.com/ljaiverson/pgfed, ``clientpgfed.py``, ``serverpgfed.py``)

Client i minimizes its own risk plus ``mu`` times a learned, non-negative mix of the other clients' risks, each
replaced by its first-order approximation ``f_j(theta) ~ l_j + <grad f_j, theta>`` taken where client j last
trained. Per round t, with ``S_{t-1}`` the clients the previous round aggregated and ``M = |S_{t-1}|``:

- down: ``theta_glob`` (every shared tensor; the client starts from it), ``g~_i = mu sum_{j in S_{t-1}} a_ij
  grad f_j``, ``gbar = (mu / M) sum_{j in S_{t-1}} grad f_j``, and the scalars ``mu l_j`` and ``a_ij``,
  ``j in S_{t-1}`` (nothing but ``theta_glob`` in round 1)
- each local step: ``grad <- grad f_i(theta; B) + g~_i`` on the shared parameters, then the module's optimizer
  steps (SGD with momentum 0.9 in the paper and the code); and, for every ``j in S_{t-1}``,
  ``a_ij <- max(0, a_ij - lam (mu l_j + <theta_i, gbar>))`` with ``theta_i`` the parameters the batch gradient
  was taken at (before the step)
- after training, one more pass over the client's training data, without a step, at the trained ``theta_i``:
  ``f_i`` = mean batch loss, ``grad f_i`` = mean batch gradient; up: ``theta_i``, ``grad f_i``,
  ``l_i = f_i - <grad f_i, theta_i>`` and the row ``a_ij, j in S_{t-1}``
- server: ``theta_glob = sum_i (n_i / sum_{S_t} n) theta_i``; it keeps ``grad f_i`` and ``mu l_i`` of this
  round's clients (they become ``S_{t-1}`` of the next round) and every client's row of ``a``
- PGFedMo: the client steps with ``g~_i = (1 - beta) g~_new + beta g~_prev``, ``g~_prev`` the correction it used
  the last time it trained (``g~_new`` alone the first time), kept on the client

Symbols -> code: ``theta_glob`` -> ``self.global_state``; ``theta_i`` -> ``update.state`` (kept in
``self.local_states`` for evaluation); ``grad f_j``, ``mu l_j`` -> ``self.grads[j]``, ``self.mu_losses[j]`` (the
last round's clients, in upload order); ``a_ij`` -> ``self.coefficients[i][j]`` (``1 / M`` until client i first
updates it); ``g~_i``, ``gbar`` -> ``received_extras["g_tilde"]``, ``["g_bar"]`` (counted as download);
``grad f_i``, ``l_i``, ``a_i.`` -> ``update.extras["grad"]``, ``["l"]``, ``["a"]`` (counted as upload);
``g~_prev`` -> ``client_state["g_tilde"]``; ``mu``, ``lam``, ``beta`` -> ``mu``, ``lam``, ``beta``; the math ->
:func:`pgfed_auxiliary_gradient`, :func:`pgfed_coefficient_step`, :func:`pgfed_risk_offset`, :func:`momentum_mix`.

As in the authors' code: ``a_ij`` moves once per local step (not once per round), after the corrected gradient
is formed and before the optimizer steps; the step uses the mean gradient ``gbar`` for every j (the exact
``<theta_i, mu grad f_j>`` would need all M gradients on every client); ``g~_i`` is fixed for the round (the
updated ``a_ij`` reach the server, and so the next ``g~_i``, after the round); only the previous round's
gradients are used; ``a`` starts at ``1 / M``. The client's personalized model is its own ``theta_i`` after its
last local training: each client is evaluated with ``self.local_states[i]`` (and its personal tensors), a client
that has not trained yet with ``theta_glob``. ``theta_glob`` itself is evaluated too, on every client
(:meth:`PGFed.global_model_state`; reported under ``global/...``), as the paper reports both.

Deviation: the code's ``a`` starts at ``1 / (clients per round)``; here ``1 / M`` with M the uploads the last
round aggregated (the same unless clients were left out). Deviation: clients not trained yet are evaluated with
``theta_glob``, the code's with the initial model. Deviation: the extra pass runs in training mode like the
code's, but BatchNorm running statistics are restored after it (the code lets them move); its ``f_i`` is the mean
of the batch losses, the code's the sample-weighted mean (equal with the code's ``drop_last=True`` loader).
Deviation: BatchNorm running statistics are shared tensors here, averaged and sent down as FedAvg's; the code
copies and averages ``model.parameters()`` only, so with a BatchNorm model (its CNN has none) they would stay on
each client (the roles of SiloBN; docs/personalized.md gives one measurement). Deviation: only shared parameters
are corrected and enter the dot products (the code's models have no personal or frozen part). Evaluation downloads
are counted as for FedAvg (one set of shared tensors per client), although a deployed client would evaluate the
model it already holds.
The official command line cannot select PGFedMo (the server switches momentum on for ``algorithm == "PGFedMo"``,
a name the launcher's ``--algorithm`` choices leave out): here it is its own class, :class:`PGFedMo`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor, nn
from torch.optim import Optimizer
from typing_extensions import override

from fedlit.core.contexts import ClientContext
from fedlit.core.errors import ConfigError
from fedlit.module import FederatedModule
from fedlit.strategies.base import ClientUpdate, Strategy
from fedlit.strategies.common.aggregate import State, client_weights, common_keys, weighted_average


def mean_loss_and_gradient(
    pl_module: FederatedModule,
    params: Mapping[str, Tensor],
    batches: Iterable[Any],
    *,
    prepare: Callable[[Any], Any] = lambda batch: batch,
    autocast: Callable[[], Any] = contextlib.nullcontext,
    convert_output: Callable[[Any], Any] = lambda out: out,
) -> tuple[float, dict[str, Tensor]]:
    """One pass over ``batches`` without a step: the mean of ``training_step``'s batch losses and the mean of the
    batch gradients of ``params`` (zero where a parameter gets none), at the module's current parameters.

    The module runs in training mode (the objective it trains); its buffers (BatchNorm running statistics) are
    restored afterwards, so the pass changes no tensor of the model. As in the local loop, a batch of one sample
    is left out when BatchNorm layers normalize with the statistics of the batch (one sample has none).
    ``prepare``, ``autocast`` and ``convert_output`` apply the run's device and precision as the local loop does.
    """
    names = list(params)
    buffers = {n: b.detach().clone() for n, b in pl_module.named_buffers()}
    sums = {n: torch.zeros(p.shape, dtype=torch.float64, device=p.device) for n, p in params.items()}
    loss_sum, count = 0.0, 0
    pl_module.set_train_mode()
    batch_statistics = any(
        isinstance(m, nn.modules.batchnorm._BatchNorm) and (m.training or m.running_mean is None)
        for m in pl_module.modules()
    )
    try:
        for batch_idx, batch in enumerate(batches):
            if batch_statistics and _num_samples(batch) == 1:
                continue
            with autocast():
                out = convert_output(pl_module.training_step(prepare(batch), batch_idx))
            loss = out["loss"] if isinstance(out, Mapping) else out
            grads = torch.autograd.grad(loss, [params[n] for n in names], allow_unused=True) if names else ()
            for name, grad in zip(names, grads, strict=True):
                if grad is not None:
                    sums[name] += grad.to(torch.float64)
            loss_sum, count = loss_sum + float(loss.detach()), count + 1
    finally:
        with torch.no_grad():
            for name, buffer in pl_module.named_buffers():
                buffer.copy_(buffers[name])
    if count == 0:
        raise ValueError("PGFed's extra pass found no training batch.")
    return loss_sum / count, {n: (s / count).to(params[n].dtype) for n, s in sums.items()}


def _num_samples(batch: Any) -> int | None:
    """The leading dimension of the first tensor in ``batch`` (a tensor, or a tuple, list or mapping of them)."""
    if isinstance(batch, Tensor):
        return batch.shape[0] if batch.dim() else None
    items = batch.values() if isinstance(batch, Mapping) else batch if isinstance(batch, list | tuple) else ()
    for item in items:
        if (found := _num_samples(item)) is not None:
            return found
    return None


def state_dot(a: State, b: State) -> Tensor:
    """``sum_k <a_k, b_k>`` over the keys of ``a``, a float64 scalar (on ``a``'s first tensor's device)."""
    if not a:
        raise ValueError("state_dot of an empty set of tensors.")
    device = next(iter(a.values())).device
    terms = [(t.detach().to(torch.float64) * b[n].detach().to(device, torch.float64)).sum() for n, t in a.items()]
    return torch.stack(terms).sum()


def pgfed_auxiliary_gradient(grads: Sequence[State], coefficients: Sequence[float], mu: float) -> dict[str, Tensor]:
    """``mu * sum_j a_j grad_j`` per tensor (PGFed: the gradient of client i's weighted first-order approximations
    of the other clients' risks), accumulated in float64 and cast back to the dtype of ``grads[0]``. The
    coefficients are used as given (not normalized: PGFed's ``a_ij`` are only kept >= 0); ``a_j = 1 / M`` for all
    j gives the mean gradient ``gbar`` clients receive."""
    if len(grads) != len(coefficients):
        raise ValueError(f"{len(grads)} gradients but {len(coefficients)} coefficients.")
    keys = common_keys(grads)
    out = {}
    for key in keys:
        ref = grads[0][key]
        acc = torch.zeros(ref.shape, dtype=torch.float64, device=ref.device)
        for a, grad in zip(coefficients, grads, strict=True):
            acc += float(a) * grad[key].to(ref.device, torch.float64)
        out[key] = (mu * acc).to(ref.dtype)
    return out


def pgfed_coefficient_step(a: Tensor, mu_losses: Tensor, theta_dot_gbar: Tensor | float, lam: float) -> Tensor:
    """``a_ij <- max(0, a_ij - lam (mu l_j + <theta_i, gbar>))`` for every j at once (PGFed's projected gradient
    step on client i's coefficients, the other clients' gradients replaced by their mean ``gbar`` as in the
    authors' code). Float64."""
    step = mu_losses.to(torch.float64) + torch.as_tensor(theta_dot_gbar, dtype=torch.float64)
    return (a.to(torch.float64) - lam * step).clamp_min(0.0)


def pgfed_risk_offset(mean_loss: float, grad: State, theta: State) -> Tensor:
    """``l_i = f_i(theta_i) - <grad f_i(theta_i), theta_i>``: the constant of client i's first-order risk
    approximation ``f_i(theta) ~ l_i + <grad f_i(theta_i), theta>`` (PGFed). Float64 scalar."""
    return torch.as_tensor(mean_loss, dtype=torch.float64) - state_dot(grad, theta).cpu()


def momentum_mix(new: State, previous: State | None, beta: float) -> dict[str, Tensor]:
    """``(1 - beta) new + beta previous`` per tensor of ``new`` (PGFedMo's gradient correction); ``new`` itself
    (copied) when there is no ``previous``. Computed in float64, cast back to ``new``'s dtypes."""
    if previous is None:
        return {n: t.clone() for n, t in new.items()}
    return {
        n: ((1 - beta) * t.to(torch.float64) + beta * previous[n].to(t.device, torch.float64)).to(t.dtype)
        for n, t in new.items()
    }


class PGFed(Strategy):
    """Personalized global objectives: each client adds a learned mix of the other clients' linearized risks.

    Args:
        mu: Weight ``mu`` of the auxiliary risks (default 0.1; 0 leaves FedAvg's local training, each client
            evaluated with its own trained model).
        lam: Step size ``lambda`` of the coefficients ``a_ij`` (the code's ``lambdaa``; default 0.01).
    """

    def __init__(self, *, mu: float = 0.1, lam: float = 0.01) -> None:
        super().__init__()
        self._init(mu=mu, lam=lam, beta=0.0, problems=[])

    def _init(self, *, mu: float, lam: float, beta: float, problems: list[str]) -> None:
        for key, value, hint in (("mu", mu, "0.1 in the paper"), ("lam", lam, "0.01 in the paper")):
            if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
                problems.append(f"strategy.init_args.{key}={value!r} must be a number >= 0 ({hint})")
        if problems:
            raise ConfigError(f"Invalid {type(self).__name__} settings: " + "; ".join(problems) + ".")
        self.mu, self.lam, self.beta = float(mu), float(lam), float(beta)
        self.grads: dict[str, dict[str, Tensor]] = {}
        self.mu_losses: dict[str, float] = {}
        self.coefficients: dict[str, dict[str, float]] = {}
        self.local_states: dict[str, dict[str, Tensor]] = {}
        self._turn: dict[str, Any] = {}

    # ------------------------------------------------------------------------------------------ server
    @override
    def setup_server_state(self) -> None:
        """No gradient, loss or coefficient yet; no client has a model of its own."""
        self.grads, self.mu_losses, self.coefficients, self.local_states = {}, {}, {}, {}

    def coefficient_row(self, client_id: str) -> Tensor:
        """``a_ij`` for ``j in S_{t-1}`` (float64, in ``self.grads`` order); ``1 / M`` where still unset."""
        row = self.coefficients.get(client_id, {})
        return torch.tensor([row.get(j, 1.0 / len(self.grads)) for j in self.grads], dtype=torch.float64)

    @override
    def configure_client_extras(self, server_round: int, client_id: str) -> dict[str, Any]:
        """``g~_i``, ``gbar``, ``mu l_j`` and ``a_ij`` over the last round's clients; nothing in round 1."""
        if not self.grads:
            return {}
        grads, a = list(self.grads.values()), self.coefficient_row(client_id)
        return {
            "g_tilde": pgfed_auxiliary_gradient(grads, a.tolist(), self.mu),
            "g_bar": pgfed_auxiliary_gradient(grads, [1.0 / len(grads)] * len(grads), self.mu),
            "mu_l": torch.tensor([self.mu_losses[j] for j in self.grads], dtype=torch.float64),
            "a": a,
        }

    @override
    def configure_evaluate(self, server_round: int, client_id: str) -> dict[str, Tensor]:
        """The client's own ``theta_i`` after its last local training; ``theta_glob`` before it has trained."""
        return dict(self.local_states.get(client_id, self.global_state))

    @override
    def global_model_state(self, client_id: str) -> dict[str, Tensor]:
        """``theta_glob``, evaluated on every client beside its own ``theta_i``."""
        return dict(self.global_state)

    @override
    def aggregate(self, server_round: int, updates: list[ClientUpdate]) -> dict[str, Tensor]:
        """``theta_glob = sum_i (n_i / n) theta_i``; keep each client's ``grad f_i``, ``mu l_i``, row of ``a`` and
        ``theta_i``."""
        if not updates:
            return dict(self.global_state)
        self.check_uploads(updates)
        previous = list(self.grads)
        problems = [
            u.client_id
            for u in updates
            if not {"grad", "l", "a"} <= set(u.extras) or len(u.extras["a"]) != len(previous)
        ]
        if problems:
            raise KeyError(
                f"Clients {problems} uploaded no PGFed extras (update.extras 'grad', 'l' and 'a' with one "
                f"coefficient per client of the previous round, {len(previous)})."
            )

        def on_server(state: Mapping[str, Tensor]) -> dict[str, Tensor]:
            return {n: t.detach().to(self.global_state[n].device) for n, t in state.items()}

        for update in updates:
            self.coefficients.setdefault(update.client_id, {}).update(
                zip(previous, update.extras["a"].tolist(), strict=True)
            )
            self.local_states[update.client_id] = on_server(update.state)
        self.grads = {u.client_id: on_server(u.extras["grad"]) for u in updates}
        self.mu_losses = {u.client_id: self.mu * float(u.extras["l"]) for u in updates}
        return {**self.global_state, **on_server(weighted_average([u.state for u in updates], client_weights(updates)))}

    @override
    def state_dict(self) -> dict[str, Any]:
        """The server state plus the last round's gradients and losses, every row of ``a`` and every ``theta_i``."""
        return {
            **super().state_dict(),
            "grads": self.grads,
            "mu_losses": self.mu_losses,
            "coefficients": self.coefficients,
            "local_states": self.local_states,
        }

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`."""
        super().load_state_dict(state_dict)
        self.grads = {c: dict(g) for c, g in state_dict["grads"].items()}
        self.mu_losses = dict(state_dict["mu_losses"])
        self.coefficients = {c: dict(row) for c, row in state_dict["coefficients"].items()}
        self.local_states = {c: dict(s) for c, s in state_dict["local_states"].items()}

    # ------------------------------------------------------------------------------------------ client
    def on_client_fit_start(
        self, pl_module: FederatedModule, received_extras: dict[str, Any], client_state: dict[str, Any]
    ) -> None:
        """Form this round's correction ``g~_i`` (PGFedMo: mixed with the client's previous one) and keep
        ``gbar``, ``mu l_j`` and the coefficients the local steps update."""
        params = {n: p for n, p in pl_module.shared_parameters()}
        turn: dict[str, Any] = {"params": params, "a": torch.zeros(0, dtype=torch.float64), "correction": None}
        if received_extras:
            new = {n: received_extras["g_tilde"][n] for n in params}
            previous = client_state.get("g_tilde") if self.beta > 0 else None
            g_tilde = momentum_mix(new, previous, self.beta)
            turn.update(
                g_tilde=g_tilde,
                correction={n: g_tilde[n].to(p.device, p.dtype) for n, p in params.items()},
                g_bar={n: received_extras["g_bar"][n].to(p.device) for n, p in params.items()},
                mu_l=received_extras["mu_l"].to(torch.float64).cpu(),
                a=received_extras["a"].to(torch.float64).cpu().clone(),
            )
        self._turn = turn

    @override
    def on_before_optimizer_step(self, optimizer: Optimizer) -> None:
        """``grad <- grad + g~_i`` on the shared parameters; ``a_ij <- max(0, a_ij - lam (mu l_j + <theta_i,
        gbar>))`` at the parameters the gradient was taken at (the step has not happened yet)."""
        turn = self._turn
        if not turn or turn["correction"] is None or not turn["params"]:
            return
        for name, param in turn["params"].items():
            correction = turn["correction"][name]
            if param.grad is None:  # unused this step: the auxiliary risks still pull it
                param.grad = correction.clone()
            else:
                param.grad.add_(correction)
        dot = state_dot(turn["params"], turn["g_bar"]).cpu()
        turn["a"] = pgfed_coefficient_step(turn["a"], turn["mu_l"], dot, self.lam)

    def on_client_fit_end(
        self,
        pl_module: FederatedModule,
        server_round: int,
        client_id: str,
        update: ClientUpdate,
        client_state: dict[str, Any],
        client: ClientContext,
    ) -> None:
        """The extra pass at the trained ``theta_i``: upload ``grad f_i``, ``l_i = f_i - <grad f_i, theta_i>`` and
        the coefficients; PGFedMo keeps the correction it used as ``g~_prev``."""
        turn = self._turn
        if not turn:
            return
        params = turn["params"]
        mean_loss, grad = mean_loss_and_gradient(
            pl_module,
            params,
            client.train_dataloader("pgfed", server_round, client_id),
            prepare=client.prepare_batch,
            autocast=client.autocast,
            convert_output=client.convert_output,
        )
        device = next(iter(update.state.values())).device if update.state else torch.device("cpu")  # the store's
        update.extras["grad"] = {n: g.detach().to(device, copy=True) for n, g in grad.items()}
        update.extras["l"] = pgfed_risk_offset(mean_loss, grad, {n: p.detach() for n, p in params.items()})
        update.extras["a"] = turn["a"].clone()
        if self.beta > 0 and turn["correction"] is not None:
            client_state["g_tilde"] = {n: t.detach().to(device, copy=True) for n, t in turn["g_tilde"].items()}
        self._turn = {}


class PGFedMo(PGFed):
    """PGFed with momentum on the correction: ``g~_i = (1 - beta) g~_new + beta g~_prev``, kept per client.

    Args:
        mu: Weight ``mu`` of the auxiliary risks (default 0.1).
        lam: Step size ``lambda`` of the coefficients ``a_ij`` (default 0.01).
        beta: Momentum ``beta`` in [0, 1) (default 0.5; 0 is PGFed).
    """

    def __init__(self, *, mu: float = 0.1, lam: float = 0.01, beta: float = 0.5) -> None:
        Strategy.__init__(self)
        problems = []
        if isinstance(beta, bool) or not isinstance(beta, int | float) or not 0 <= beta < 1:
            problems.append(f"strategy.init_args.beta={beta!r} must be in [0, 1) (0.5 in the paper; 0 is PGFed)")
        self._init(mu=mu, lam=lam, beta=beta, problems=problems)
