"""MetaFed: cyclic knowledge distillation along a ring of clients, then one personalization pass.

Chen, Lu, Qin, Wang, Xie. "MetaFed: Federated Learning Among Federations With Cyclic Knowledge Distillation for
Personalized Healthcare." IEEE Transactions on Neural Networks and Learning Systems, 2023.
https://arxiv.org/abs/2206.08516 (code read: microsoft/PersonalizedFL, ``alg/metafed.py``, ``main.py``,
``util/traineval.py``)

Each client (the paper's federation) keeps a model of its own; no model is averaged. The clients sit on a ring
(fedlit's client order) and the model of each is the teacher of the next. Three stages:

1. Warm-up (the code's ``init_model_flag``): every client trains its own model on its data alone, then sets its
   flag: ``flag_i = acc_i > zeta`` (``acc_i``: its model's accuracy on its validation split).
2. Common knowledge accumulation: client ``i`` trains with the model of its predecessor ``i - 1`` as teacher ``t``
   (the first client of the first pass has none). A client whose flag is set keeps its own model and distils the
   teacher's features into it,

       L_i = CE(f_i(x), y) + lam * mean_{b,d} (g_i(x) - g_t(x))^2                       (:func:`feature_distillation`)

   (``g``: the features the classifier reads, the code's ``get_sel_fea`` with its default ``plan=1``; the teacher in
   eval mode, detached; the mean over the batch and the features, PyTorch's ``mse_loss``); a client whose flag is not
   set copies the teacher and trains it on CE alone. After its turn the flag becomes ``flag_i or acc_i > zeta``
   (:func:`distills`; the code updates every flag after each pass, which gives the same flags, since a client's
   model does not change between its turn and the end of the pass).
3. Personalization: the last common model ``t`` (the last hop's upload: the ring's last client's model when the
   hops end a pass, as in the code) is every client's teacher; with ``a_i``, ``a_t`` the accuracies of the client's
   model and of ``t`` on its validation split,

       lam_p = 0                                     if a_t <= a_i and a_t < zeta_p,
       lam_p = 10 ** min(1, 5 (a_t - a_i)) / 10 * lam   otherwise                          (:func:`personal_lambda`)

   and the client trains as in stage 2 with ``lam_p`` (a client whose flag is not set copies ``t``).

Each client is evaluated with its own model; the latest common model (the last upload along the ring) is
evaluated beside it as the global model (:meth:`MetaFed.global_model_state`).

How the ring maps to fedlit's rounds: a client trains from what the server sends before the round and every
executor (simulation, ranks, a Flower deployment) gets the round's downloads before any client trains, so a client
cannot receive a model trained in the same round. Each ring step (the code's one ``client_train`` call) is
therefore one round with one client, in the code's order: rounds ``1..W`` are the warm-up (every client), round
``W + 1 + k`` is hop ``k`` (client ``k mod N`` of the ring, whose teacher is the model the previous hop uploaded,
relayed by the server as ``global_state``), and the last round ``R`` is the personalization (every client, in
parallel: they share one teacher, as in the code, where the last client's model is deep-copied before anyone
changes it). ``N`` hops are one of the code's iterations; a run of ``P`` passes has ``R = W + N P + 1`` rounds.
The clients selected are the stage's: ``federation.clients_per_round`` is not used. The server sends the stage with
every download (``received_extras``: strings and booleans, no tensor), so a client needs nothing but what it
receives and its own ``client_state``.

Defaults (the code's): ``lam = 1`` (``--lam``), ``zeta = 0.6`` (``--threshold``; its MedMNIST script runs 1.1, so
that no client distils and every step copies), ``zeta_p = 0.5`` (the code's ``thes`` for MedMNIST and PAMAP2, 0.4
for VLCS and PACS), the features feeding the head (``plan = 1``). ``warmup_rounds = 30``: the code's warm-up is 30
local epochs against 1 (``--wk_iters``) per ring step; with fedlit's local training per round it is 30 rounds
(adjust it to your ``local_epochs`` / ``local_steps``).

Symbols -> code: client i's model -> the module's shared tensors (``client_state["own"]``) and its personal tensors
(the store); the teacher -> what the client receives (``global_state``, the previous hop's upload); ``flag_i`` ->
``client_state["flag"]``; ``lam``, ``zeta``, ``zeta_p``, ``W`` -> ``lam``, ``threshold``, ``personal_threshold``,
``warmup_rounds``; ``R`` -> ``rounds`` (default ``federation.rounds``); the stage of a round ->
:func:`ring_stage`; ``g`` -> the input of the ``head`` layer (one ``nn.Linear``).

Deviation: the ring is a star: each hop's model goes up to the server and down to the next client (two transfers
where the paper's federations pass it directly), and warm-up and personalization rounds download the common model
and upload like any round (the server keeps only the ring hops' uploads). Deviation: the personal tensors of a
module's roles (normalization under FedBN-like roles) stay the client's own when it copies a teacher, as the code's
``--nosharebn``; a teacher runs with the receiving client's personal tensors. Deviation: accuracies are measured on
the client's ``val`` split (the code's validation loader); the code picks its reported round on validation
accuracy over all rounds, as ``federation.selection_metric`` does here. The accuracies behind the flags and
``lam_p`` are the code's ``correct / total`` in double precision (:func:`correct_count`: the arg max of the logits,
the sign of a binary task's one logit), not the module's float32 ``accuracy`` metric, whose rounding would let a
client at exactly the threshold pass it (3/5 against 0.6, 4/7 against 4/7). Deviation: a hop whose client fails passes
the previous common model on (the server keeps the last upload).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch import Tensor, nn
from torch.func import functional_call
from typing_extensions import override

from fedlit.core.contexts import Batch, ClientContext, ServerContext, StepOutput
from fedlit.core.errors import ConfigError, DataError
from fedlit.module import FederatedModule
from fedlit.strategies.base import ClientUpdate, Strategy
from fedlit.strategies.common.personal_copy import MethodCall, load_into
from fedlit.strategies.fedper import head_rule
from fedlit.strategies.fedrod import linear_head

WARMUP, RING, PERSONALIZE = "warmup", "ring", "personalize"


def ring_stage(server_round: int, warmup_rounds: int, rounds: int | None) -> tuple[str, int]:
    """The stage of ``server_round`` and, in the ring, its hop (from 0): rounds ``1..W`` are the warm-up, the last
    round ``R`` the personalization (never when ``R`` is None), the rounds between hops ``0, 1, ...``."""
    if server_round <= warmup_rounds:
        return WARMUP, -1
    if rounds is not None and server_round >= rounds:
        return PERSONALIZE, -1
    return RING, server_round - warmup_rounds - 1


def ring_client(hop: int, client_ids: list[str]) -> str:
    """The client of ring hop ``hop``: the ring is ``client_ids`` in order, passed round and round."""
    return client_ids[hop % len(client_ids)]


def feature_distillation(student: Tensor, teacher: Tensor) -> Tensor:
    """``mean (student - teacher)^2`` over every element (PyTorch's ``mse_loss``), in float32, the teacher detached."""
    return (student.float() - teacher.detach().float()).pow(2).mean()


def correct_count(logits: Tensor, targets: Tensor) -> tuple[int, int]:
    """The correct predictions and the samples of one batch: the arg max of multi-class logits (the code's
    ``output.max(1)[1]``), the sign of a binary task's one logit (a probability above 1/2)."""
    if logits.ndim == targets.ndim + 1 and logits.shape[-1] > 1:
        predicted = logits.argmax(-1)
    else:
        predicted = (logits.reshape(targets.shape) > 0).long()
    return int((predicted == targets.long()).sum()), targets.numel()


def distills(flag: bool, accuracy: float, threshold: float) -> bool:
    """A client's flag after a validation accuracy: set once ``accuracy > threshold``, never cleared."""
    return bool(flag) or accuracy > threshold


def personal_lambda(own: float, common: float, lam: float, threshold: float) -> float:
    """The personalization stage's weight: 0 when the common model is no better than the client's own and below
    ``threshold``, else ``10 ** min(1, 5 (common - own)) / 10 * lam``."""
    if common <= own and common < threshold:
        return 0.0
    return 10 ** min(1.0, 5 * (common - own)) / 10 * lam


@contextlib.contextmanager
def recorded_input(layer: nn.Module, turn: dict[str, Any], key: str) -> Iterator[None]:
    """While open, ``layer`` records its input in ``turn[key]``."""

    def hook(_: nn.Module, args: tuple[Any, ...]) -> None:
        turn[key] = args[0]

    handle = layer.register_forward_pre_hook(hook)
    try:
        yield
    finally:
        handle.remove()


class MetaFed(Strategy):
    """Cyclic knowledge distillation: a warm-up, ring hops of one client per round, one personalization round.

    Args:
        lam: ``lam``, the weight of the feature distillation (default 1, the code's).
        threshold: ``zeta``: a client distils (rather than copies the teacher) once its validation accuracy
            exceeds it (default 0.6, the code's; above 1: always copy).
        personal_threshold: ``zeta_p`` of the personalization's weight (default 0.5, the code's for MedMNIST).
        warmup_rounds: ``W``, rounds of local training before the ring (default 30, the code's 30 epochs).
        rounds: ``R``, the personalization round; None (the default): ``federation.rounds``. Set it to keep the
            schedule when a run is cut in parts (a run with fewer rounds stops before the personalization).
        head: Glob (or ``re:<regex>``) of the classifier's weight and bias, one ``nn.Linear`` whose input is the
            distilled features (default ``head.*``).
    """

    accepted_tasks = frozenset({"multiclass", "binary"})

    def __init__(
        self,
        *,
        lam: float = 1.0,
        threshold: float = 0.6,
        personal_threshold: float = 0.5,
        warmup_rounds: int = 30,
        rounds: int | None = None,
        head: str = "head.*",
    ) -> None:
        super().__init__()
        key = "strategy.init_args."
        problems = [
            f"{key}{name}={value!r} must be a number >= 0"
            for name, value in (("lam", lam), ("threshold", threshold), ("personal_threshold", personal_threshold))
            if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0
        ]
        if isinstance(warmup_rounds, bool) or not isinstance(warmup_rounds, int) or warmup_rounds < 0:
            problems.append(f"{key}warmup_rounds={warmup_rounds!r} must be an integer >= 0 (30 by default)")
        if rounds is not None and (isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1):
            problems.append(f"{key}rounds={rounds!r} must be null or an integer >= 1")
        if problems:
            raise ConfigError("Invalid MetaFed settings: " + "; ".join(problems) + ".")
        self.lam, self.threshold, self.personal_threshold = float(lam), float(threshold), float(personal_threshold)
        self.warmup_rounds, self.rounds, self.head = warmup_rounds, rounds, head
        self.head_rule = head_rule(head)
        self._fit_rounds: int | None = rounds
        self._turn: dict[str, Any] = {}

    # ------------------------------------------------------------------------------------------ server
    @override
    def on_fit_start(self, trainer: ServerContext) -> None:
        """Take ``R`` (``rounds``, else ``federation.rounds``); refuse a schedule without a ring hop."""
        total = self.rounds if self.rounds is not None else int(trainer.settings.rounds)
        if int(trainer.settings.rounds) > total:
            raise ConfigError(
                f"MetaFed personalizes at strategy.init_args.rounds={total}, but federation.rounds="
                f"{trainer.settings.rounds} goes past it: make them equal (or leave rounds null)."
            )
        if total < self.warmup_rounds + 2:
            raise ConfigError(
                f"MetaFed needs a warm-up of strategy.init_args.warmup_rounds={self.warmup_rounds}, "
                f"at least one ring round and the personalization round, but R={total}: raise "
                f"federation.rounds to at least {self.warmup_rounds + 2} or lower warmup_rounds."
            )
        self._fit_rounds = total

    @override
    def select_clients(
        self, server_round: int, client_ids: list[str], num_clients: int, generator: torch.Generator
    ) -> list[str]:
        """The ring hop's one client; every client in the warm-up and the personalization."""
        stage, hop = ring_stage(server_round, self.warmup_rounds, self._fit_rounds)
        return [ring_client(hop, client_ids)] if stage == RING else list(client_ids)

    @override
    def configure_client_extras(self, server_round: int, client_id: str) -> dict[str, Any]:
        """The stage, whether what is sent is a teacher, and whether the client updates its flag afterwards."""
        stage, hop = ring_stage(server_round, self.warmup_rounds, self._fit_rounds)
        return {
            "stage": stage,
            "teacher": stage == PERSONALIZE or hop > 0,
            "check": stage == RING or server_round == self.warmup_rounds,
        }

    @override
    def global_model_state(self, client_id: str) -> dict[str, Tensor]:
        """The latest common model (the last ring hop's upload), evaluated beside each client's own."""
        return dict(self.global_state)

    @override
    def aggregate(self, server_round: int, updates: list[ClientUpdate]) -> dict[str, Tensor]:
        """A ring hop's upload becomes the common model passed on; other rounds' uploads are not kept."""
        self.check_uploads(updates)
        stage, _ = ring_stage(server_round, self.warmup_rounds, self._fit_rounds)
        if stage == RING and updates:
            return dict(updates[-1].state)
        return dict(self.global_state)

    # ------------------------------------------------------------------------------------------ client
    def accuracy(self, pl_module: FederatedModule, client: ClientContext, client_id: str) -> float:
        """The live module's accuracy on the client's validation split (in eval mode): ``correct / total``, a Python
        double as the code's, from the ``logits`` and ``targets`` of the module's ``training_step``."""
        loader = client.eval_dataloader("val")
        if loader is None or client.num_examples("val") == 0:
            raise DataError(
                f"MetaFed: client {client_id!r} has no validation split to measure its model's accuracy "
                "on; give every client one (or set strategy.init_args.threshold above 1: always copy)."
            )
        pl_module.eval()
        correct = total = 0
        try:
            with torch.no_grad():
                for batch_idx, batch in enumerate(loader):
                    batch = client.prepare_batch(batch)
                    with client.autocast():
                        out = client.convert_output(pl_module.training_step(batch, batch_idx))
                    if not isinstance(out, Mapping) or "logits" not in out or "targets" not in out:
                        raise ConfigError(
                            "MetaFed measures accuracies from the logits and targets of the module's "
                            "training_step, which returned none: use a fedlit.tasks classifier (or return "
                            "{'loss', 'logits', 'targets'})."
                        )
                    right, seen = correct_count(out["logits"], out["targets"])
                    correct, total = correct + right, total + seen
        finally:
            pl_module.set_train_mode()
        return correct / total

    def on_client_fit_start(
        self,
        pl_module: FederatedModule,
        client_id: str,
        received_extras: dict[str, Any],
        client_state: dict[str, Any],
        client: ClientContext,
    ) -> None:
        """Copy the teacher (already loaded) or, once the flag is set, take the client's own model to distil into."""
        own, flag = client_state.get("own"), bool(client_state.get("flag", False))
        turn: dict[str, Any] = {
            "client": client,
            "client_id": client_id,
            "flag": flag,
            "lam": 0.0,
            "check": bool(received_extras["check"]) and self.threshold < 1,
        }
        if received_extras["teacher"] and flag and own is not None:
            teacher = {n: t.detach().clone() for n, t in pl_module.named_tensors("shared").items()}
            common = self.accuracy(pl_module, client, client_id) if received_extras["stage"] == PERSONALIZE else None
            load_into(pl_module, own)
            lam = (
                self.lam
                if common is None
                else personal_lambda(
                    self.accuracy(pl_module, client, client_id), common, self.lam, self.personal_threshold
                )
            )
            if lam > 0:
                _, layer = linear_head(pl_module, self.head_rule, "MetaFed")
                turn.update(teacher=teacher, lam=lam, layer=layer, step=MethodCall(pl_module, "training_step"))
        elif not received_extras["teacher"] and own is not None:
            load_into(pl_module, own)  # the warm-up and the ring's first hop train the client's own model
        self._turn = turn

    @override
    def client_forward(self, pl_module: FederatedModule) -> contextlib.AbstractContextManager[Any]:
        """While distilling, the head records the student's features."""
        turn = self._turn
        return recorded_input(turn["layer"], turn, "student") if "teacher" in turn else contextlib.nullcontext()

    @override
    def training_loss(
        self, pl_module: FederatedModule, loss: Tensor, batch: Batch, outputs: StepOutput = None
    ) -> Tensor:
        """``CE + lam mean (g_i - g_t)^2``, the teacher's features from its tensors in eval mode, without gradient."""
        turn = self._turn
        if "teacher" not in turn:
            return loss
        client = turn["client"]
        pl_module.eval()
        try:
            with torch.no_grad(), recorded_input(turn["layer"], turn, "features"), client.autocast():
                functional_call(turn["step"], {f"module.{n}": t for n, t in turn["teacher"].items()}, (batch, 0))
        finally:
            pl_module.set_train_mode()
        return loss + (turn["lam"] * feature_distillation(turn["student"], turn["features"])).to(loss.dtype)

    def on_client_fit_end(
        self, pl_module: FederatedModule, update: ClientUpdate, client_state: dict[str, Any], client: ClientContext
    ) -> None:
        """Keep the client's model; after a ring hop (and the warm-up's last round), update its flag."""
        turn = self._turn
        if not turn:
            return
        device = client.store.device
        client_state["own"] = {n: t.detach().to(device, copy=True) for n, t in update.state.items()}
        flag = turn["flag"]
        if turn["check"] and not flag:
            flag = distills(flag, self.accuracy(pl_module, client, turn["client_id"]), self.threshold)
        client_state["flag"] = flag
        self._turn = {}

    @override
    def on_client_evaluate_start(self, pl_module: FederatedModule, client_state: dict[str, Any]) -> None:
        """Evaluate the client's own model (before its first turn: the common model as sent)."""
        if "own" in client_state:
            load_into(pl_module, client_state["own"])
