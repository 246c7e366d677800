"""APPLE: each client learns how much of every client's core model its personalized model takes.

Luo, Wu. "Adapt to Adaptation: Learning Personalization for Cross-Silo Federated Learning." IJCAI 2022.
https://arxiv.org/abs/2110.08394 (code: https://github.com/ljaiverson/pFL-APPLE, ``train_APPLE.py``,
``utils/apple.py``, ``utils/losses.py``, read)

Client i keeps a core model ``theta_c,i`` (its shared tensors: uploaded, stored by the server) and a directed-
relationship vector ``p_i`` of length N (personal: never uploaded). Its personalized model is, per shared
parameter (weights and biases alike),

    theta_p,i = sum_j p_ij theta_c,j                                                        (the mix)

Per round r (counted from 0 as in the code; fedlit's ``server_round`` is r + 1):

- down: every other client's core from the previous round (its shared parameters; the own core as
  ``configure_client``'s state), or only ``M = max_downloads`` of them under a bandwidth limit (below)
- local training: each batch's forward runs the module with every shared parameter replaced by the mix, the own core
  being the live parameter and the other cores constants, so exact autograd gives the own core
  ``p_ii dL/dtheta_p`` and ``p_ij`` the gradient ``<dL/dtheta_p, theta_c,j>``; no other core gets a gradient.
  The loss is ``L = CE + coef(r) ||p_i - p0||^2`` (no 1/2: see the deviations), ``p0 = (n_1 / n, ..., n_N / n)``,
  ``p_i`` starts at ``p0`` and is unconstrained. The own core steps with the module's optimizer (SGD, lr 0.01,
  momentum 0.9 in the paper and the code), ``p_i`` with its own SGD (``lr_p`` = 1e-3, momentum ``p_momentum`` =
  0.9, restarted every turn like the code's optimizer)
- ``coef(r) = mu eps^(r / R_d)`` (``schedule="exponential"``) or ``mu (cos(pi r / R_d) + 1) / 2`` (``cosine``)
  for ``r < R_d``, 0 after; ``R_d = int(0.1 R)`` with R the federation's rounds unless ``decay_rounds`` is given
- up: the trained core ``theta_c,i``; the server replaces its copy of client i's core
- evaluation: client i's personalized model (the mix) as it stood at the end of its last turn (the cores it trained
  with, its own trained core, its trained ``p_i``); a client that has not trained yet: ``sum_j p0_j theta_c,j``
- bandwidth limit (``max_downloads = M < N - 1``): a client's first turn downloads every core (the initial
  cores, as in the code's round 0); after it, the client itself draws, at the end of a turn, the M cores it
  will download at its next: cores it has never downloaded since its first turn first (uniformly), the other
  places with probability proportional to ``base^|p_ij|``, ``base = max(thresh, lamb r M / N)``, from a random
  stream derived from the run's seed, the round and the client (a resumed run draws the same; no generator state
  to checkpoint); it uploads only the indices. A core not downloaded enters the mix with the value the client
  last downloaded (kept on the client).

Symbols -> code: ``theta_c,j`` -> ``self.cores[j]`` (server; until j first uploads, its initial core
``self.starts[j]``, or the initial shared tensors under ``core_init: shared``);
``p_i`` -> ``client_state["p"]`` (float32, in ``self.client_ids`` order); ``theta_p,i`` -> ``client_state["model"]``;
``p0`` -> ``self.p0``; ``coef(r)`` -> :meth:`APPLE.coefficient`; ``mu``, ``eps``, ``R_d``, ``M``, ``lamb``,
``thresh`` -> ``mu``, ``eps``, ``decay_rounds``, ``max_downloads``, ``lamb``, ``thresh``; the math ->
:func:`apple_mix`, :func:`apple_proximal`, :func:`apple_proximal_coefficient`, :func:`apple_download_choice`.

Memory: the server holds N cores (shared tensors only, never the frozen backbone) and ``global_state``
(``sum_j p0_j theta_c,j``, the model a new client would start from) plus the initial shared tensors. Each client's
store holds ``p_i`` (N floats), its personalized model (one copy of the shared parameters), and under a bandwidth
limit the last value it downloaded of every other core (N - 1 copies of the shared parameters) and which cores
it has downloaded.

Initial cores (``core_init``): the code builds every core as a model of its own, with its own random
initialization. ``own`` (the default) does the same: client j's core starts from the module's own initializers
(each layer's ``reset_parameters()``) drawn from a seed derived from the run's seed and j
(:func:`reinitialized_parameters`: a constant-initialized tensor such as a LoRA B at 0 keeps its constant, a
tensor of a layer without ``reset_parameters()`` its initial value; a warning when no tensor could be re-drawn).
``shared`` starts every core at the one built model (the mix then starts at that model, since ``p0`` sums to 1);
then, in round 1, the other clients' cores are all that model, so the ``p_ij`` (j != i) get one and the same
gradient and move together: the mix can only rescale the initial model, and ``sum_j p_ij`` drifts from 1.
``own`` re-draws shared tensors that came pretrained: use ``shared`` to keep them.

Deviation: the paper weights the proximal term ``mu/2 ||p_i - p0||^2``; the code (``utils/losses.py``) and fedlit
use ``coef(r) ||p_i - p0||^2`` without the 1/2, so a given ``mu`` pulls twice as hard as the paper's formula reads
(halve ``mu`` for the paper's). Deviation: the code mixes the outputs of
each layer's N copies (``sum_j p_j layer_j(x)``); for convolutions and linear layers this equals mixing their
weights and biases, which is what is done here for every shared parameter. Shared buffers (BatchNorm statistics)
are not mixed: each client runs and uploads its own core's. Deviation: the code never marks a core as
downloaded, so its draw is always uniform among the other cores; here downloads are remembered (the paper's
intent) and a core drawn by ``base^|p|`` is never drawn twice. Deviation: the code's per-round learning-rate decay
(``--decay``, 1 by default) is left to the module's scheduler for the core; ``lr_p`` is constant.
Communication counts the own core in the download (the client holds it already).
"""

from __future__ import annotations

import contextlib
from typing import Any, Literal, cast

import torch
from torch import Tensor
from typing_extensions import override

from fedlit.core.contexts import Batch, ClientContext, ServerContext, StepOutput
from fedlit.core.errors import ConfigError
from fedlit.module import FederatedModule
from fedlit.strategies.apple.downloads import is_limited, keep_and_request, with_kept_cores
from fedlit.strategies.apple.equations import (
    apple_download_choice,
    apple_mix,
    apple_proximal,
    apple_proximal_coefficient,
    initial_cores,
    reinitialized_parameters,
    swapped_parameters,
)
from fedlit.strategies.base import ClientUpdate, Strategy
from fedlit.strategies.common.aggregate import normalized_weights, weighted_average

__all__ = [
    "APPLE",
    "apple_download_choice",
    "apple_mix",
    "apple_proximal",
    "apple_proximal_coefficient",
    "reinitialized_parameters",
    "swapped_parameters",
]


class APPLE(Strategy):
    """Personalized models mixed from every client's core model by learned directed relationships ``p_i``.

    Args:
        mu: Weight ``mu`` of ``||p_i - p0||^2`` (default 0.1; 0: no pull towards ``p0``).
        lr_p: Learning rate of ``p_i`` (default 1e-3; the core takes the module's optimizer and learning rate,
            0.01 in the paper).
        p_momentum: SGD momentum of ``p_i`` (default 0.9, as the code's shared optimizer).
        schedule: Shape of ``coef(r)``: ``exponential`` (the code's default) or ``cosine``.
        eps: ``coef`` reaches ``mu * eps`` at ``R_d`` in the exponential schedule (default 1e-3).
        decay_rounds: ``R_d``, the rounds with the proximal term; None (default): ``int(0.1 * rounds)``.
        max_downloads: ``M``, the other cores a client downloads per round; None (default): all of them.
        lamb: ``lambda`` of the bandwidth limit's ``base`` (default 1).
        thresh: The least ``base`` (default 1.5).
        core_init: ``own`` (default, as the authors' code): each client's core starts from its own random
            initialization, seeded by the run's seed and the client; ``shared``: every core starts at the built
            model (keeps pretrained shared tensors; ``p`` then moves only along all-ones in round 1).
    """

    def __init__(
        self,
        *,
        mu: float = 0.1,
        lr_p: float = 1e-3,
        p_momentum: float = 0.9,
        schedule: Literal["exponential", "cosine"] = "exponential",
        eps: float = 1e-3,
        decay_rounds: int | None = None,
        max_downloads: int | None = None,
        lamb: float = 1.0,
        thresh: float = 1.5,
        core_init: Literal["own", "shared"] = "own",
    ) -> None:
        super().__init__()
        problems = []
        key = "strategy.init_args."
        if not mu >= 0:
            problems.append(f"{key}mu={mu!r} must be >= 0 (0.1 in the paper)")
        if not lr_p > 0:
            problems.append(f"{key}lr_p={lr_p!r} must be > 0 (1e-3 in the paper)")
        if not 0 <= p_momentum < 1:
            problems.append(f"{key}p_momentum={p_momentum!r} must be in [0, 1)")
        if schedule not in ("exponential", "cosine"):
            problems.append(f"{key}schedule={schedule!r} is not one of ['exponential', 'cosine']")
        if not 0 < eps <= 1:
            problems.append(f"{key}eps={eps!r} must be in (0, 1] (1e-3 in the paper)")
        if decay_rounds is not None and (isinstance(decay_rounds, bool) or decay_rounds < 0):
            problems.append(f"{key}decay_rounds={decay_rounds!r} must be >= 0, or null for 10% of the rounds")
        if max_downloads is not None and (isinstance(max_downloads, bool) or max_downloads < 1):
            problems.append(f"{key}max_downloads={max_downloads!r} must be >= 1, or null to download every core")
        if not lamb >= 0 or not thresh > 0:
            problems.append(f"{key}lamb={lamb!r} must be >= 0 and {key}thresh={thresh!r} > 0")
        if core_init not in ("own", "shared"):
            problems.append(f"{key}core_init={core_init!r} is not one of ['own', 'shared']")
        if problems:
            raise ConfigError("Invalid APPLE settings: " + "; ".join(problems) + ".")
        self.mu, self.lr_p, self.p_momentum, self.eps = float(mu), float(lr_p), float(p_momentum), float(eps)
        self.schedule, self.decay_rounds, self.max_downloads = schedule, decay_rounds, max_downloads
        self.lamb, self.thresh, self.core_init = float(lamb), float(thresh), core_init
        self.rounds: int | None = None
        self.initial: dict[str, Tensor] = {}
        self.starts: dict[str, dict[str, Tensor]] = {}
        self.cores: dict[str, dict[str, Tensor]] = {}
        self.requests: dict[str, list[int]] = {}
        self.p0 = torch.zeros(0, dtype=torch.float64)
        self._turn: dict[str, Any] = {}

    # ------------------------------------------------------------------------------------------ server
    @override
    def setup_server_state(self) -> None:
        """Every core starts at the initial shared tensors; ``p0`` from the class counts (uniform without them)
        until :meth:`on_fit_start` reads the clients' training sizes."""
        self.initial = dict(self.global_state)
        self.starts, self.cores, self.requests = {}, {}, {}
        counts = [float(sum(self.class_counts[c])) if self.class_counts else 1.0 for c in self.client_ids]
        self.p0 = normalized_weights(counts).to(torch.float64)

    @override
    def on_fit_start(self, trainer: ServerContext, pl_module: FederatedModule | None = None) -> None:
        """``p0 = n_j / n`` over the clients that train; R, the federation's rounds, for ``R_d``; under
        ``core_init: own``, in a fresh run, every client's initial core (a resumed run has them from the
        checkpoint) and ``global_state``, their ``p0`` mix."""
        self.rounds = int(trainer.settings.rounds)
        sizes = [float(trainer.num_examples(c, "train")) for c in self.client_ids]
        self.p0 = normalized_weights(sizes).to(torch.float64)
        if self.core_init == "own" and pl_module is not None and not self.starts and not self.cores:
            names = self.shared_parameter_names()
            self.starts = initial_cores(pl_module, names, self.initial, self.client_ids, trainer.derive_seed)
            self.global_state = weighted_average([self.starts[c] for c in self.client_ids], self.p0.tolist())

    def coefficient(self, server_round: int) -> float:
        """``coef(r)`` of round ``server_round`` (r = server_round - 1)."""
        decay = self.decay_rounds
        if decay is None:
            if self.rounds is None:
                raise ValueError("APPLE needs the federation's rounds (on_fit_start) or decay_rounds for coef(r).")
            decay = int(0.1 * self.rounds)
        return apple_proximal_coefficient(server_round - 1, decay, self.mu, self.schedule, self.eps)

    def _core(self, client_id: str) -> dict[str, Tensor]:
        """Client j's latest core: uploaded, else its initial one."""
        return self.cores.get(client_id) or self.starts.get(client_id) or self.initial

    def _limited(self) -> bool:
        return is_limited(self.max_downloads, len(self.client_ids))

    @override
    def configure_client(self, server_round: int, client_id: str) -> dict[str, Tensor]:
        """The client's own core (the initial shared tensors before it first uploads one)."""
        return dict(self._core(client_id))

    @override
    def configure_client_extras(self, server_round: int, client_id: str) -> dict[str, Any]:
        """``p0`` and the other clients' cores (shared parameters): all, or the ones the client asked for."""
        names = self.shared_parameter_names()
        own = self.client_ids.index(client_id)
        wanted = self.requests.get(client_id) if self._limited() else None
        indices = [j for j in range(len(self.client_ids)) if j != own and (wanted is None or j in wanted)]
        cores = {}
        for j in indices:
            core = self._core(self.client_ids[j])
            cores[self.client_ids[j]] = {n: core[n] for n in names}
        # The clients' order (no tensor: nothing counted as download): a client knows its own index and N from
        # what it receives, not from the server's ``client_ids``.
        return {"p0": self.p0.to(torch.float32), "cores": cores, "clients": list(self.client_ids)}

    @override
    def configure_evaluate(self, server_round: int, client_id: str) -> dict[str, Tensor]:
        """The client's own core (its buffers; the client puts its personalized model over the parameters in
        :meth:`on_client_evaluate_start`); ``sum_j p0_j theta_c,j`` for a client without a core of its own."""
        return dict(self.cores[client_id]) if client_id in self.cores else dict(self.global_state)

    @override
    def global_model_state(self, client_id: str) -> dict[str, Tensor]:
        """The FedAvg-style model ``sum_j p0_j theta_c,j`` (``global_state``), evaluated beside each client's
        personalized mix."""
        return dict(self.global_state)

    @override
    def expected_upload_extras(self, client_id: str) -> dict[str, Any]:
        """The indices of the M cores requested for the next turn, under a bandwidth limit."""
        return {"request": torch.zeros(cast(int, self.max_downloads), dtype=torch.int64)} if self._limited() else {}

    @override
    def aggregate(self, server_round: int, updates: list[ClientUpdate]) -> dict[str, Tensor]:
        """Keep each uploaded core (and request); ``global_state = sum_j p0_j theta_c,j``."""
        if not updates:
            return dict(self.global_state)
        self.check_uploads(updates)
        for update in updates:
            self.starts.pop(update.client_id, None)  # its initial core is no longer needed
            self.cores[update.client_id] = {
                n: t.detach().to(self.global_state[n].device) for n, t in update.state.items()
            }
            if "request" in update.extras:
                self.requests[update.client_id] = [int(j) for j in update.extras["request"].tolist()]
        return weighted_average([self._core(c) for c in self.client_ids], self.p0.tolist())

    @override
    def state_dict(self) -> dict[str, Any]:
        """Server state plus every core, the initial tensors, ``p0`` and the requests (exact resume)."""
        return {
            **super().state_dict(),
            "initial": self.initial,
            "starts": self.starts,
            "cores": self.cores,
            "p0": self.p0,
            "requests": self.requests,
        }

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`."""
        super().load_state_dict(state_dict)
        self.initial = dict(state_dict["initial"])
        self.starts = {c: dict(s) for c, s in state_dict.get("starts", {}).items()}  # none before core_init
        self.cores = {c: dict(s) for c, s in state_dict["cores"].items()}
        self.p0 = state_dict["p0"]
        self.requests = {c: list(r) for c, r in state_dict["requests"].items()}

    # ------------------------------------------------------------------------------------------ client
    def on_client_fit_start(
        self,
        pl_module: FederatedModule,
        server_round: int,
        client_id: str,
        received_extras: dict[str, Any],
        client_state: dict[str, Any],
    ) -> None:
        """Gather the N cores (own: live; others: received or, under a bandwidth limit, last downloaded), make
        ``p_i`` a leaf to train (``p0`` the first time) and its optimizer."""
        params = dict(pl_module.shared_parameters())
        device = next(iter(params.values())).device if params else torch.device("cpu")
        clients = list(received_extras["clients"])
        own = clients.index(client_id)
        limited = is_limited(self.max_downloads, len(clients))
        p0 = received_extras["p0"].to(device, torch.float32)
        first = "p" not in client_state
        received = received_extras["cores"]
        if limited:  # the cores not downloaded: their last downloaded values, kept on the client
            received = with_kept_cores(received, client_state)
        others = {j: {n: t.to(device, params[n].dtype) for n, t in core.items()} for j, core in received.items()}
        p = (p0.clone() if first else client_state["p"].to(device, torch.float32).clone()).requires_grad_(True)
        self._turn = {
            "params": params,
            "own": own,
            "first": first,
            "received": received_extras["cores"],
            "clients": clients,
            "limited": limited,
            "p": p,
            "p0": p0,
            "coef": self.coefficient(server_round),
            "cores": {n: [params[n] if k == own else others[c][n] for k, c in enumerate(clients)] for n in params},
            "optimizer": torch.optim.SGD([p], lr=self.lr_p, momentum=self.p_momentum),
        }

    def personalized(self) -> dict[str, Tensor]:
        """The mix for every shared parameter, from this turn's ``p_i`` and cores (differentiable)."""
        turn = self._turn
        return {n: apple_mix(turn["p"], cores) for n, cores in turn["cores"].items()}

    @override
    def client_forward(self, pl_module: FederatedModule) -> contextlib.AbstractContextManager[Any]:
        """Run the step with every shared parameter replaced by the mix."""
        if not self._turn:
            return contextlib.nullcontext()
        return swapped_parameters(pl_module, self.personalized())

    @override
    def training_loss(
        self, pl_module: FederatedModule, loss: Tensor, batch: Batch, outputs: StepOutput = None
    ) -> Tensor:
        """``loss + coef(r) ||p_i - p0||^2``."""
        turn = self._turn
        if not turn or turn["coef"] == 0:
            return loss
        return loss + apple_proximal(turn["p"], turn["p0"], turn["coef"]).to(loss.dtype)

    @override
    def on_before_optimizer_step(self, client: ClientContext) -> None:
        """Unscale ``p_i``'s gradient under 16-bit mixed precision (the loop unscales the module's only)."""
        turn = self._turn
        scaler = client.scaler
        if turn and turn["p"].grad is not None and scaler is not None:
            turn["p"].grad.div_(scaler.get_scale())

    @override
    def on_before_zero_grad(self, stepped: bool) -> None:
        """Step ``p_i`` when the module's optimizer stepped (the same gradients), then clear its gradient."""
        turn = self._turn
        if not turn:
            return
        if stepped and turn["p"].grad is not None:
            turn["optimizer"].step()
        turn["p"].grad = None

    def on_client_fit_end(
        self,
        server_round: int,
        client_id: str,
        update: ClientUpdate,
        client_state: dict[str, Any],
        client: ClientContext,
    ) -> None:
        """Keep ``p_i`` and the personalized model on the client; under a bandwidth limit draw and upload the
        indices of the cores to download next turn."""
        turn = self._turn
        if not turn:
            return
        store = client.store.device
        with torch.no_grad():
            client_state["model"] = {n: t.detach().to(store, copy=True) for n, t in self.personalized().items()}
        p = turn["p"].detach().to(store, copy=True)
        client_state["p"] = p
        if turn["limited"]:  # committed here, so a quarantined turn leaves the client's state as it was
            seed, limit = client.derive_seed("apple", server_round, client_id), cast(int, self.max_downloads)
            update.extras["request"] = keep_and_request(
                client_state, turn, p, store, limit, server_round, seed, lamb=self.lamb, thresh=self.thresh
            )
        self._turn = {}

    @override
    def on_client_evaluate_start(self, pl_module: FederatedModule, client_state: dict[str, Any]) -> None:
        """Put the client's personalized model over the shared parameters (before its first turn: as sent)."""
        model = client_state.get("model")
        if model is None:
            return
        live = dict(pl_module.shared_parameters())
        with torch.no_grad():
            for name, tensor in model.items():
                live[name].copy_(tensor)
