"""FedMetaMed: PRR-FL, a personal and a deputy model per client, deputies exchanged by Fourier aggregation.

Chen, Zhu, Yang, Yuan. "Personalized Retrogress-Resilient Framework for Real-World Medical Federated Learning."
MICCAI 2021. (code: https://github.com/CityU-AIM-Group/PRR-FL, ``server.py``, ``local_train.py``, ``main.py``)

Each client holds two models over one frozen backbone: the *deputy* (the module's shared tensors, uploaded and
overwritten by the server every round) and the *personal* model (a second copy of every trainable tensor, kept in
the client's ``client_state``, never sent). Normalization layers are personal in both (FedBN roles).

Server, Cumulative Fourier Aggregation (the paper's PFA; ``avg_freq`` in the code), per shared weight of the
round's clients i, with ``L_t`` the round's ratio:

- ``W_i`` = the weight as a matrix: a conv weight ``(O, C, k1, k2)`` as ``(C k1, k2 O)`` (``permute(1, 2, 3, 0)``,
  reshape), a 2-D weight as it is; ``F_i = fft2(W_i)``, ``A_i = fftshift(|F_i|)``, ``P_i = angle(F_i)``
- ``A'_i = mean_j A_j`` inside the centred box of half-size ``floor(h L / 2) x floor(w L / 2)`` (rows
  ``[h/2 - b_h, h/2 + b_h)``), ``A_i`` outside; ``W'_i = Re(ifft2(ifftshift(A'_i) e^{i P_i}))``, reshaped back
- every other shared tensor (biases, non-normalization buffers): the mean over the round's clients, as FedAvg
- ``L_t = L_start + (t - 1) / R (L_end - L_start)`` over the ``R`` rounds (the code's linear schedule)

Client i receives its own ``W'_i`` as its deputy. Collaborative transfer (the paper's Retrieve / Reciprocate /
Refine, the code's Recover / Exchange / Sublimate; ``DET``): before each local epoch, macro-F1 of both models
picks the stage (:func:`~fedlit.strategies.fedmetamed.equations.prr_stage`): the first epoch of a round is Retrieve;
then Retrieve while ``F1_d < alpha1 F1_p``, Reciprocate after Retrieve or while ``F1_d < alpha2 F1_p``, Refine
otherwise (stages fall back when the deputy drops, as in the code). Each batch goes through both models; with
``KL(teacher || student)`` batch-mean, no temperature, the teacher detached
(:func:`~fedlit.strategies.fedmetamed.equations.prr_losses`):

- Retrieve: personal ``CE``; deputy ``CE + KL(p_per || p_dep)`` (the paper's "KL(deputy || personal)": the deputy
  learns from the personal model)
- Reciprocate: personal ``CE + KL(p_dep || p_per)``; deputy ``CE + KL(p_per || p_dep)``
- Refine: personal ``CE + KL(p_dep || p_per)``; deputy ``CE``

Each client is evaluated with its personal model (``evaluate="deputy"`` evaluates the deputy instead; the
deputy a client will start its next turn from is :meth:`FedMetaMed.deputy_state`).

How fedlit runs two models on one live module: the loop's forward pass is the deputy's; :meth:`training_loss`
runs the module's ``training_step`` a second time through ``torch.func.functional_call`` with the personal
tensors in place of the live ones (their BatchNorm statistics move in place), and returns both losses summed
(their gradients do not mix: each KL's teacher is detached). The personal tensors step with their own optimizer,
a mirror of the loop's (same class and hyperparameters per parameter group, this round's learning rate), in
``on_before_optimizer_step``; with ``federation.optimizer_state: persist`` its state is kept per client.

Memory per client: two sets of trainable tensors (the deputy in the store and on the server, one mix per client,
the personal model in ``client_state``) and the personal optimizer's state when persisted.

Symbols -> code: deputy ``theta_d`` -> the module's shared tensors + its stored personal (normalization) tensors;
personal ``theta_p`` -> ``client_state["personal"]`` (every shared and personal tensor, by name); stage ->
``client_state["stage"]``; ``W'_i`` -> ``self.mixes[i]``; ``L_start``, ``L_end`` -> ``l_start``,
``l_end``; ``alpha1``, ``alpha2`` -> ``alpha1``, ``alpha2``; the math (pure functions, in
:mod:`fedlit.strategies.fedmetamed.equations` to keep this file short) ->
:func:`~fedlit.strategies.fedmetamed.equations.fourier_ratio`,
:func:`~fedlit.strategies.fedmetamed.equations.cumulative_fourier_average`,
:func:`~fedlit.strategies.fedmetamed.equations.prr_stage`, :func:`~fedlit.strategies.fedmetamed.equations.prr_losses`.

Deviation: the defaults are the paper's (``L`` 0.26 -> 0.55, ``alpha1 = 0.6``, ``alpha2 = 0.8``); the code runs
0.7 -> 0.95, 0.7 and 0.9 (all arguments). Deviation: F1 is measured on the client's validation split
(``f1_split="val"``); the code measures it on the training loader (``f1_split="train"``, without shuffling).
Deviation: which tensors are transformed is decided by shape (4-D: conv, 2-D: matrix, other shared tensors
averaged) and normalization by :func:`fedlit.core.roles.is_norm_module`, where the code matches names containing
``conv``, ``linear`` and ``bn``. Deviation: the code's mean is uniform over its 4 clients, all trained every round;
here the mean runs over the round's clients (``weighting="uniform"``, or ``num_examples``), a client receives its
mix from its last round, and one that has not trained yet receives ``global_state`` (the round's mean of every
shared tensor, the initial model before round 1). Its personal model starts as a copy of its deputy at its first
turn (in round 1 both are the initial model, as in the code). As in the code: the stage restarts at each round
(``reset_stage=False`` carries it over rounds instead), and a round of a single local epoch (``local_epochs: 1``
without ``local_steps``) trains every batch in Reciprocate. Deviation: the code rebuilds both optimizers every
round; here the personal optimizer follows ``federation.optimizer_state``. Binary tasks with one logit ``z`` use
the two-class logits ``(0, z)``. 16-bit mixed precision with a gradient scaler is refused (use ``bf16-mixed``).
Evaluation downloads are counted as for FedAvg (the client's mix), although the personal model it is evaluated
with never leaves the client.
"""

from __future__ import annotations

from typing import Any, Literal

import torch
from torch import Tensor
from torch.func import functional_call
from torch.optim import Optimizer
from typing_extensions import override

from fedlit.core.contexts import Batch, ClientContext, ServerContext, StepOutput
from fedlit.core.errors import ConfigError, DataError
from fedlit.core.roles import ParameterRoles
from fedlit.module import FederatedModule
from fedlit.strategies.base import ClientUpdate, Strategy
from fedlit.strategies.common.aggregate import client_weights, weighted_average
from fedlit.strategies.fedmetamed import equations as F
from fedlit.strategies.fedmetamed.personal import MethodCall, detached_to, macro_f1, mirror_optimizer


def _two_class(logits: Tensor) -> Tensor:
    """A binary task's single logit ``z`` as the two-class logits ``(0, z)``; other logits unchanged."""
    if logits.ndim == 1 or logits.shape[-1] == 1:
        z = logits.reshape(-1, 1)
        return torch.cat([torch.zeros_like(z), z], dim=-1)
    return logits


class FedMetaMed(Strategy):
    """PRR-FL: deputies exchanged by Cumulative Fourier Aggregation, personal models taught by collaborative transfer.

    Args:
        l_start: ``L`` of round 1, the share of the centred spectrum whose amplitudes are averaged (paper 0.26;
            code 0.7).
        l_end: ``L`` the linear schedule heads for after ``R`` rounds (paper 0.55; code 0.95).
        schedule_rounds: ``R``; None (the default): ``federation.rounds``. Set it to keep the schedule when a
            resumed run gets more rounds.
        alpha1: Retrieve while ``F1_deputy < alpha1 F1_personal`` (paper 0.6; code 0.7).
        alpha2: Refine once ``F1_deputy >= alpha2 F1_personal`` (paper 0.8; code 0.9).
        f1_split: Where macro-F1 is measured before each epoch: ``val`` (the client's validation split) or
            ``train`` (its training split, as the code).
        weighting: The clients' weights in the amplitude and FedAvg means: ``uniform`` (the code) or
            ``num_examples``.
        reset_stage: Restart in Retrieve at every round (the code); False carries the stage over rounds.
        evaluate: Which model a client is evaluated with: ``personal`` (the paper) or ``deputy``.
    """

    accepted_tasks = frozenset({"multiclass", "binary"})

    def __init__(
        self,
        *,
        l_start: float = 0.26,
        l_end: float = 0.55,
        schedule_rounds: int | None = None,
        alpha1: float = 0.6,
        alpha2: float = 0.8,
        f1_split: Literal["val", "train"] = "val",
        weighting: Literal["uniform", "num_examples"] = "uniform",
        reset_stage: bool = True,
        evaluate: Literal["personal", "deputy"] = "personal",
    ) -> None:
        super().__init__()
        problems = []
        if not 0 <= l_start <= 1 or not 0 <= l_end <= 1:
            problems.append(f"strategy.init_args.l_start={l_start} and l_end={l_end} must be in [0, 1]")
        if schedule_rounds is not None and (not isinstance(schedule_rounds, int) or schedule_rounds < 1):
            problems.append(f"strategy.init_args.schedule_rounds={schedule_rounds!r} must be an integer >= 1 or null")
        if not 0 < alpha1 <= alpha2:
            problems.append(
                f"strategy.init_args.alpha1={alpha1} and alpha2={alpha2} need 0 < alpha1 <= alpha2 (paper 0.6 and 0.8)"
            )
        for key, value, allowed in (
            ("f1_split", f1_split, ("val", "train")),
            ("weighting", weighting, ("uniform", "num_examples")),
            ("evaluate", evaluate, ("personal", "deputy")),
        ):
            if value not in allowed:
                problems.append(f"strategy.init_args.{key}={value!r} is not one of {list(allowed)}")
        if problems:
            raise ConfigError("FedMetaMed: " + "; ".join(problems) + ".")
        self.l_start, self.l_end, self.schedule_rounds = float(l_start), float(l_end), schedule_rounds
        self.alpha1, self.alpha2 = float(alpha1), float(alpha2)
        self.f1_split, self.weighting, self.evaluate = f1_split, weighting, evaluate
        self.reset_stage = bool(reset_stage)
        self.fourier_names: list[str] = []
        self.mixes: dict[str, dict[str, Tensor]] = {}
        self._fit_rounds: int | None = None
        self._turn: dict[str, Any] = {}

    # ------------------------------------------------------------------------------------------ server
    @override
    def configure_roles(self, roles: ParameterRoles) -> ParameterRoles:
        """Normalization parameters and buffers that train become ``personal`` (FedBN), in both models."""
        return roles.replace(lambda name, role: roles.is_norm(name) and role != "frozen", "personal")

    @override
    def setup_server_state(self) -> None:
        """The shared 2-D and 4-D floating parameters go through the Fourier mix; no client has a mix yet."""
        self.fourier_names = [
            n
            for n in self.shared_parameter_names()
            if self.global_state[n].is_floating_point() and self.global_state[n].ndim in (2, 4)
        ]
        self.mixes = {}

    def ratio(self, server_round: int) -> float:
        """``L_t`` of ``server_round``."""
        rounds = self.schedule_rounds or self._fit_rounds
        if rounds is None:
            raise ConfigError(
                "FedMetaMed needs the number of rounds of its L schedule: set "
                "strategy.init_args.schedule_rounds (a federation sets it at fit start)."
            )
        return F.fourier_ratio(server_round, rounds, self.l_start, self.l_end)

    @override
    def configure_client(self, server_round: int, client_id: str) -> dict[str, Tensor]:
        """Client i's own Fourier mix of its last round; before it has one, ``global_state``."""
        return dict(self.mixes.get(client_id, self.global_state))

    def deputy_state(self, client_id: str) -> dict[str, Tensor]:
        """The shared tensors of ``client_id``'s deputy as its next turn starts (for a global evaluation)."""
        return self.configure_client(0, client_id)

    @override
    def global_model_state(self, client_id: str) -> dict[str, Tensor] | None:
        """The client's deputy (what the server's aggregation gives it), evaluated beside its personal model; None
        with ``evaluate: deputy``, where the two evaluations would be the same."""
        return self.deputy_state(client_id) if self.evaluate == "personal" else None

    @override
    def aggregate(self, server_round: int, updates: list[ClientUpdate]) -> dict[str, Tensor]:
        """Cumulative Fourier Aggregation: one mix per client of the round; ``global_state`` becomes the round's
        mean of every shared tensor, which clients that have not trained yet receive."""
        if not updates:
            return dict(self.global_state)
        self.check_uploads(updates)
        states = [u.state for u in updates]
        weights = client_weights(updates, self.weighting)
        mean = weighted_average(states, weights)
        mixes = [dict(mean) for _ in updates]
        ratio = self.ratio(server_round)
        for name in (n for n in self.fourier_names if n in mean):
            for mix, tensor in zip(
                mixes, F.cumulative_fourier_average([s[name] for s in states], weights, ratio), strict=True
            ):
                mix[name] = tensor

        def on_server(state: dict[str, Tensor]) -> dict[str, Tensor]:
            return {n: t.to(self.global_state[n].device) for n, t in state.items()}

        for update, mix in zip(updates, mixes, strict=True):
            self.mixes[update.client_id] = on_server(mix)
        return {**self.global_state, **on_server(mean)}

    @override
    def state_dict(self) -> dict[str, Any]:
        """The server state plus every client's mix."""
        return {**super().state_dict(), "mixes": self.mixes}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`."""
        super().load_state_dict(state_dict)
        self.mixes = {c: dict(s) for c, s in state_dict["mixes"].items()}

    # ------------------------------------------------------------------------------------------ client
    @override
    def on_fit_start(self, trainer: ServerContext, pl_module: FederatedModule) -> None:
        """Take ``R`` from the federation; refuse a gradient scaler and a module without macro-F1."""
        self._fit_rounds = trainer.settings.rounds
        if trainer.scaler is not None:
            raise ConfigError(
                "FedMetaMed steps its personal model outside the gradient scaler of 16-bit mixed "
                "precision: use federation.precision bf16-mixed or 32-true."
            )
        if "f1" not in pl_module.higher_is_better:
            raise ConfigError(
                f"FedMetaMed picks its stages from macro-F1, but {type(pl_module).__name__} reports "
                f"{sorted(pl_module.higher_is_better)}: use fedlit.tasks.ClassificationModule."
            )

    def on_client_fit_start(
        self, pl_module: FederatedModule, client_id: str, client_state: dict[str, Any], client: ClientContext
    ) -> None:
        """Take the personal model (a copy of the deputy at the client's first turn) and the stage."""
        self._fit_rounds = client.rounds
        live = pl_module.named_tensors("shared", "personal")
        trainable = {n for n, p in pl_module.named_parameters() if p.requires_grad}
        stored = client_state.get("personal", live)
        personal = {}
        for name, tensor in live.items():
            copy = stored[name].detach().to(tensor.device, tensor.dtype, copy=True)
            personal[name] = copy.requires_grad_(True) if name in trainable else copy
        self._turn = {
            "client": client,
            "client_id": client_id,
            "personal": personal,
            "optimizer": None,
            "stage": 0 if self.reset_stage else client_state.get("stage", 0),
            "stages": [],
            "f1": None,
            "mutual": client.local.local_steps is None and client.local.local_epochs < 2,
            "training_step": MethodCall(pl_module, "training_step"),
            "optimizer_state": client_state.get("optimizer") if client.local.optimizer_state == "persist" else None,
        }

    def _prefixed(self) -> dict[str, Tensor]:
        return {f"module.{n}": t for n, t in self._turn["personal"].items()}

    def _f1_loader(self) -> Any:
        client, client_id = self._turn["client"], self._turn["client_id"]
        if self.f1_split == "train":
            return client.train_dataloader(generator=torch.Generator().manual_seed(0))
        loader = client.eval_dataloader("val")
        if loader is None:
            raise DataError(
                f"FedMetaMed measures F1 on client {client_id!r}'s validation split, which it has not: "
                "give the clients a validation split or set strategy.init_args.f1_split: train."
            )
        return loader

    @override
    def on_train_epoch_start(self, pl_module: FederatedModule) -> None:
        """Pick the epoch's stage from macro-F1 of the deputy and the personal model."""
        turn = self._turn
        if not turn:
            return
        if turn["mutual"]:
            turn["stage"] = F.RECIPROCATE
        elif turn["stage"] == 0:  # the first epoch: Retrieve, whatever the scores
            turn["stage"] = F.RETRIEVE
        else:
            loader = self._f1_loader()
            f1_deputy = macro_f1(pl_module, turn["client"], loader, None)
            f1_personal = macro_f1(pl_module, turn["client"], loader, self._prefixed())
            turn["f1"] = [f1_deputy, f1_personal]
            turn["stage"] = F.prr_stage(turn["stage"], f1_deputy, f1_personal, self.alpha1, self.alpha2)
        turn["stages"].append(turn["stage"])

    @override
    def training_loss(
        self, pl_module: FederatedModule, loss: Tensor, batch: Batch, outputs: StepOutput = None
    ) -> Tensor:
        """The deputy's and the personal model's losses of the stage, summed (gradients stay apart)."""
        turn = self._turn
        if not turn:
            return loss
        if not isinstance(outputs, dict) or "logits" not in outputs:
            raise ConfigError(
                f"FedMetaMed distils between logits, but {type(pl_module).__name__}.training_step "
                "returns no 'logits': use fedlit.tasks.ClassificationModule."
            )
        client = turn["client"]
        with client.autocast():
            out = functional_call(turn["training_step"], self._prefixed(), (batch, 0))
        out = client.convert_output(out)
        personal, deputy = F.prr_losses(
            turn["stage"], out["loss"], loss, _two_class(out["logits"]), _two_class(outputs["logits"])
        )
        return deputy + personal

    @override
    def on_before_optimizer_step(self, pl_module: FederatedModule, optimizer: Optimizer) -> None:
        """Step the personal model with its own optimizer (a mirror of the loop's, this step's hyperparameters)."""
        turn = self._turn
        if not turn:
            return
        inner = getattr(optimizer, "optimizer", optimizer)
        if turn["optimizer"] is None:
            turn["optimizer"] = mirror_optimizer(pl_module, inner, turn["personal"], turn["optimizer_state"])
        for group, ref in zip(turn["optimizer"].param_groups, inner.param_groups, strict=True):
            group.update({k: v for k, v in ref.items() if k != "params"})
        turn["optimizer"].step()
        turn["optimizer"].zero_grad(set_to_none=True)

    def on_client_fit_end(self, update: ClientUpdate, client_state: dict[str, Any], client: ClientContext) -> None:
        """Keep the personal model, the stage (and the personal optimizer's state under ``persist``)."""
        turn = self._turn
        if not turn:
            return
        device = client.store.device
        client_state["personal"] = {n: t.detach().to(device, copy=True) for n, t in turn["personal"].items()}
        client_state["stage"], client_state["stages"] = turn["stage"], list(turn["stages"])
        if turn["f1"] is not None:
            client_state["f1"] = list(turn["f1"])
        if client.local.optimizer_state == "persist" and turn["optimizer"] is not None:
            client_state["optimizer"] = detached_to(turn["optimizer"].state_dict(), device)
        self._turn = {}

    @override
    def on_client_evaluate_start(
        self, pl_module: FederatedModule, client_id: str, client_state: dict[str, Any]
    ) -> None:
        """Put the client's personal model into the live module (``evaluate="personal"``, once it has one)."""
        if self.evaluate == "deputy" or "personal" not in client_state:
            return
        live = pl_module.named_tensors("shared", "personal")
        with torch.no_grad():
            for name, tensor in client_state["personal"].items():
                live[name].copy_(tensor)
