"""The Strategy API: a server algorithm as a Lightning callback.

A strategy decides what the server sends each client (:meth:`Strategy.configure_client`), how uploads are
combined (:meth:`Strategy.aggregate`), which clients train (:meth:`Strategy.select_clients`), which tensors are
shared (:meth:`Strategy.configure_roles`) and what is added to the client loss (:meth:`Strategy.training_loss`).
Side effects use Lightning's callback hooks, called by the loop with keyword arguments (a hook declares only the
arguments it needs, as with ``fabric.call``; :class:`fedlit.engine.loop.hooks.Hooks`). Server-side hooks (fit, round
and aggregation) get as ``trainer`` a :class:`~fedlit.core.contexts.ServerContext`: a read-only view of the run (the
round, the clients, ``settings``, the evaluation ``history``, the round's ``log``) whose
:meth:`~fedlit.core.contexts.ServerContext.request_stop` ends the run after the round. The hooks of a client's turn
or evaluation get its :class:`~fedlit.core.contexts.ClientContext` as ``client`` and as ``trainer`` (its data
loaders, seeds, gradient scaler, store entry and local settings), in a simulation, on the ranks of a multi-device run
and on a Flower node alike, so a strategy never reaches into Fabric, the data module or the run:

- ``on_fit_start(trainer, pl_module)`` / ``on_fit_end(trainer, pl_module)``
- ``on_round_start(trainer, pl_module, server_round)`` / ``on_round_end(trainer, pl_module, server_round, metrics)``
- ``on_client_fit_start(trainer, pl_module, server_round, client_id, received, received_extras, client_state)``
- ``on_train_epoch_start/end``, ``on_train_batch_start/end``, ``on_before_backward``, ``on_after_backward``,
  ``on_before_optimizer_step(trainer, pl_module, optimizer)`` (gradients unscaled),
  ``on_before_zero_grad(trainer, pl_module, optimizer, stepped)`` (``stepped`` is False when 16-bit mixed
  precision's gradient scaler skipped the step over inf/NaN gradients)
- ``on_client_fit_end(trainer, pl_module, server_round, client_id, update, client_state)``: add ``update.extras``
- ``on_before_aggregate(trainer, pl_module, server_round, updates)``: filter or transform uploads in place
- ``on_after_aggregate(trainer, pl_module, server_round, log)``: right after :meth:`Strategy.aggregate`, before
  evaluation: change the new ``strategy.global_state`` (ClientLevelDP's noise); ``log`` is the round's dict of
  scalars, to which a callback may add ``<group>/<name>`` values (logged to the loggers and ``metrics.csv``)
- ``on_client_evaluate_start(trainer, pl_module, server_round, client_id, client_state)``: after a client's tensors
  and what ``configure_evaluate`` sent are loaded, before its splits are evaluated: put a model the client keeps
  in ``client_state`` into the live module (APPLE's personalized model, FedMetaMed's personal model)

``pl_module`` is the live client module (a :class:`~fedlit.module.FederatedModule`) and ``client_state`` a dict
persisted per client in the :class:`~fedlit.core.store.ClientStore` under the callback's
``state_key``. Server state goes through ``state_dict()`` / ``load_state_dict()`` and is checkpointed.
"""

from __future__ import annotations

import abc
import contextlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from lightning.pytorch import Callback
from torch import Tensor
from typing_extensions import override

from fedlit.core.contexts import Batch, ClientContext, StepOutput
from fedlit.core.init_args import capture, init_arguments, jsonable
from fedlit.core.roles import ParameterRoles
from fedlit.module import FederatedModule


@dataclass
class ClientUpdate:
    """What one client uploads after local training.

    Attributes:
        client_id: The client.
        num_examples: Training examples the client used (the FedAvg weight).
        state: Its shared tensors after training, by name (nothing personal).
        metrics: Local training metrics: ``loss`` (the mean training loss) and ``steps`` (optimizer steps that
            happened; a step the gradient scaler skipped is not one); callbacks may add their own numbers in
            ``on_client_fit_end`` (SampleLevelDP's ``dp_sample_epsilon``).
        extras: Strategy uploads (SCAFFOLD's delta c_i...); tensors here count as communication.
    """

    client_id: str
    num_examples: int
    state: dict[str, Tensor]
    metrics: dict[str, float] = field(default_factory=dict)
    extras: dict[str, Any] = field(default_factory=dict)


class Strategy(Callback, abc.ABC):
    """Base class of federated algorithms.

    The base keeps the server's copy of the shared tensors in ``self.global_state``, sends it to every client
    and samples clients uniformly without replacement.

    Attributes:
        communicates: False for strategies that exchange nothing by design (Local), which silences the warning
            given when no tensor is shared.
        accepted_tasks: The data set tasks the algorithm is defined for (FedSLD: ``multiclass`` and ``binary``,
            whose class counts it needs); None (the default): any task. The federation refuses other data.
        secure_aggregation: True when :meth:`aggregate` depends on the uploads only through the
            ``num_examples``-weighted mean of ``update.state`` (and the clients' counts), so that a secure
            aggregation protocol revealing nothing but that mean (SecAgg+ in a Flower deployment,
            :mod:`fedlit.flower.secagg`) can stand in for the individual uploads: FedAvg and the strategies that
            only change roles or the client objective (FedProx, FedBN, SiloBN...), the FedOpt family. False (the
            default) for rules that need each upload (median, Krum, SCAFFOLD's extras, similarity weights). A
            subclass that overrides ``aggregate`` or another method reading the uploads must declare it again
            (:func:`fedlit.flower.secagg.check_secure_aggregation` refuses it otherwise).
        eval_finetune_steps: Local optimizer steps each evaluated client takes on its own train split, from what
            :meth:`configure_evaluate` sends it (and its personal tensors), before its validation and test splits
            are evaluated, at every evaluated round (0, the default: none). Plain steps of the module's loss with a
            fresh optimizer at the round's learning rate, no :meth:`training_loss` or training hook; nothing of them
            is kept, so the federation is unchanged and only what is evaluated differs. It is how methods that
            "fine-tune after federation" are evaluated (FedAvg-FT, FedProx-FT); the steps are counted in
            ``results.json``'s ``compute`` and by ``fedlit cost``. The global model
            (:meth:`global_model_state`) is evaluated without them.
        cost_notes: What ``fedlit cost`` cannot count from the shapes the strategy declares
            (:meth:`expected_download_extras`, :meth:`expected_upload_extras`), printed as notes under its table
            (FedDBE's warm-up upload). Default: none.
        fusable: True when several clients' turns can train in one fused pass (``federation.fused_clients``,
            :mod:`fedlit.engine.speedups.fused`) with the result of sequential turns: the client side is
            ``on_client_fit_start`` (called for each client of the group before the first step, the module holding
            that client's tensors), :meth:`training_loss` (a function of the module's tensors, the loss, the batch
            and the attributes ``on_client_fit_start`` set, which are put back for each client) and
            ``on_client_fit_end``, with no per-step hook and the default :meth:`client_forward`. False (the
            default): fused training refuses the strategy. Read from the class itself: a subclass declares it again.
        global_state, client_ids, class_counts, roles: What :meth:`initialize` received.

    Hyperparameters are recorded with no code from the subclass (as Lightning's ``save_hyperparameters``): the
    arguments of the construction, bound to the most-derived ``__init__``'s signature with its defaults filled in
    and ``**kwargs`` expanded (:mod:`fedlit.core.init_args`). :meth:`hparams` returns them, and they show in
    ``repr`` (``FedAvgM(server_lr=1.0, beta=0.9, weighting='num_examples')``), in TensorBoard's HParams
    (``strategy.<name>``), in ``results.json`` (``strategy``, ``strategy_hparams``) and in ``fedlit report``'s
    configuration table. A subclass overrides :meth:`hparams` only to hide or rename some (FedAvg hides the
    default aggregator).
    """

    communicates: bool = True
    cost_notes: tuple[str, ...] = ()
    accepted_tasks: frozenset[str] | None = None
    secure_aggregation: bool = False
    eval_finetune_steps: int = 0
    fusable: bool = False

    def __new__(cls, *args: Any, **kwargs: Any) -> Strategy:
        # Records the arguments of this construction (hparams() shows them): no code from the subclass.
        strategy = super().__new__(cls)
        capture(strategy, cls, args, kwargs)
        return strategy

    def __init__(self) -> None:
        super().__init__()
        self.global_state: dict[str, Tensor] = {}
        self.client_ids: list[str] = []
        self.class_counts: Mapping[str, list[int]] | None = None
        self.roles = ParameterRoles({})

    def configure_roles(self, roles: ParameterRoles) -> ParameterRoles:
        """Refine the model's roles (FedBN makes normalization personal). Default: unchanged."""
        return roles

    def initialize(
        self,
        global_state: Mapping[str, Tensor],
        client_ids: list[str],
        class_counts: Mapping[str, list[int]] | None = None,
        roles: ParameterRoles | None = None,
    ) -> None:
        """Called at set-up, after :meth:`configure_roles`; on resume :meth:`load_state_dict` follows and wins.

        Keeps its arguments as attributes (``global_state`` copied), then calls :meth:`setup_server_state`, which
        is what a strategy with server state of its own overrides.

        Args:
            global_state: The model's initial shared tensors.
            client_ids: Every client.
            class_counts: Each client's training samples per class, as clients report them before round 1
                (FedSLD's prior). A few integers per client; not counted as communication. None when the
                data set's task has no classes (survival, regression).
            roles: The roles :meth:`configure_roles` returned (which shared tensors are parameters, which are
                buffers). ``None`` (a direct call, as in a test) counts every floating tensor of ``global_state``
                as a shared parameter and every other one as a shared buffer.
        """
        self.global_state = {n: t.detach().clone() for n, t in global_state.items()}
        self.client_ids = list(client_ids)
        self.class_counts = class_counts
        if roles is None:
            roles = ParameterRoles(
                dict.fromkeys(self.global_state, "shared"),
                buffers={n for n, t in self.global_state.items() if not t.is_floating_point()},
            )
        self.roles = roles
        self.setup_server_state()

    def setup_server_state(self) -> None:
        """Start the strategy's own server state (SCAFFOLD's ``c``, FedOpt's moments) from the attributes
        :meth:`initialize` has just set: ``global_state``, ``client_ids``, ``class_counts``, ``roles``.
        Default: nothing."""

    def shared_parameter_names(self) -> list[str]:
        """The server's tensors that are parameters, not buffers (those that have gradients), in model order."""
        return [n for n in self.roles.names("shared", buffers=False) if n in self.global_state]

    def select_clients(
        self, server_round: int, client_ids: list[str], num_clients: int, generator: torch.Generator
    ) -> list[str]:
        """The clients that train this round: ``num_clients`` sampled uniformly without replacement."""
        if num_clients >= len(client_ids):
            return list(client_ids)
        order = torch.randperm(len(client_ids), generator=generator)[:num_clients]
        return [client_ids[i] for i in sorted(order.tolist())]

    def configure_client(self, server_round: int, client_id: str) -> dict[str, Tensor]:
        """What the server sends ``client_id`` before it trains. Default: the global shared tensors."""
        return dict(self.global_state)

    def configure_client_extras(self, server_round: int, client_id: str) -> dict[str, Any]:
        """What else the server sends ``client_id`` (SCAFFOLD's c, FedSLD's prior): not loaded into the model,
        passed to ``on_client_fit_start`` as ``received_extras``; its tensors count as download. Default: {}."""
        return {}

    def expected_upload_extras(self, client_id: str) -> dict[str, Any]:
        """What ``on_client_fit_end`` will add to ``client_id``'s ``update.extras``, as tensors of the right shapes
        and dtypes (their values do not matter), called after :meth:`initialize`: cost estimates made before any
        training (``fedlit cost``) count its bytes as upload. Default: {} (a strategy that uploads extras
        overrides it; what a client uploads in ``update.state`` is its ``shared`` tensors, known from the roles)."""
        return {}

    def expected_download_extras(self, server_round: int, client_id: str) -> dict[str, Any]:
        """What :meth:`configure_client_extras` will send ``client_id`` in ``server_round`` of a run under way, as
        tensors of the right shapes and dtypes (their values do not matter), called after :meth:`initialize`:
        ``fedlit cost`` counts its bytes as download, asking for round 1 and for round 2, which stands for every
        later round. Default: what :meth:`configure_client_extras` returns before any training, right for extras
        whose shapes training does not change (SCAFFOLD's c, FedSLD's prior); a strategy whose extras grow from
        the uploads (pFedMoAP's experts, FedDBE's global mean) overrides it."""
        return self.configure_client_extras(server_round, client_id)

    def expected_upload_names(self, server_round: int, client_id: str, received: Mapping[str, Tensor]) -> list[str]:
        """The names of the tensors ``client_id`` uploads in ``update.state`` after its turn of ``server_round`` in
        which it received ``received``: a Flower server refuses a reply that misses one or adds another
        (:mod:`fedlit.flower.replies`). Default: every name received (a client uploads its shared tensors, which
        are what it received); a strategy whose ``on_client_fit_end`` drops some (FedRA) overrides it."""
        return list(received)

    def configure_evaluate(self, server_round: int, client_id: str) -> dict[str, Tensor]:
        """What ``client_id`` evaluates with, on top of its personal tensors. Default: as in training."""
        return self.configure_client(server_round, client_id)

    def on_client_evaluate_start(
        self, trainer: ClientContext, pl_module: FederatedModule, server_round: int, client_id: str
    ) -> None:
        """Called before ``client_id`` is evaluated, its tensors loaded; a strategy that evaluates a model kept in
        the client's ``client_state`` (declare that argument) copies it into ``pl_module`` here. Default: nothing."""

    def global_model_state(self, client_id: str) -> dict[str, Tensor] | None:
        """The server's global model for ``client_id`` (every shared tensor), evaluated beside the personalized one.

        A personalized strategy whose :meth:`configure_evaluate` gives a client a model of its own, while the
        server also keeps a global one (PGFed's ``theta_glob``, EPFL's mean A, APPLE's p0-mix of the cores,
        FedMetaMed's deputy), returns the global shared tensors here: every evaluation then also evaluates each
        client with them (its personal tensors kept), reported under ``global/...`` (see
        :mod:`fedlit.engine.loop.evaluate`). Default: None, for strategies whose evaluated model already is the global
        one (the two evaluations would be identical)."""
        return None

    def training_loss(
        self, pl_module: FederatedModule, loss: Tensor, batch: Batch, outputs: StepOutput = None
    ) -> Tensor:
        """The client objective: ``loss`` plus any regularizer of the strategy, or a replacement of it.

        Args:
            pl_module: The live client module.
            loss: The module's loss on ``batch``.
            batch: The batch, on the device.
            outputs: What ``training_step`` returned (a dict with ``loss`` and, for fedlit's tasks,
                ``logits`` and ``targets``, so a strategy can re-weight the loss without a second forward pass).

        Returns:
            The loss to back-propagate. Default: ``loss``.
        """
        return loss

    def client_forward(self, pl_module: FederatedModule) -> contextlib.AbstractContextManager[Any]:
        """A context the local loop enters around each ``training_step`` of a client's turn (outside autocast),
        between ``on_client_fit_start`` and ``on_client_fit_end``: a strategy that trains a function of the
        module's tensors rather than the tensors themselves (APPLE's mix of every client's core model) swaps them
        in here and restores them on exit; the backward pass runs after the exit. Default: nothing."""
        return contextlib.nullcontext()

    def check_uploads(self, updates: list[ClientUpdate]) -> None:
        """Raise a ``KeyError`` if a client uploaded tensors the server does not share."""
        for update in updates:
            unknown = sorted(set(update.state) - set(self.global_state))
            if unknown:
                raise KeyError(f"Client {update.client_id!r} uploaded tensors the server does not share: {unknown[:5]}")

    @abc.abstractmethod
    def aggregate(self, server_round: int, updates: list[ClientUpdate]) -> dict[str, Tensor]:
        """Combine the uploads into the new server state and return it; the loop stores it as ``global_state``
        (do not store it yourself).

        What it returns must have exactly the names of ``global_state`` as :meth:`initialize` set them, each tensor
        of the same shape (dtype and device are kept as returned); anything else, ``None`` included, stops the run
        with a :class:`~fedlit.core.errors.ConfigError` (:mod:`fedlit.engine.loop.aggregation`). State of the
        strategy's own (FedOpt's moments, SCAFFOLD's ``c``) stays in its attributes and :meth:`state_dict`.

        Args:
            server_round: The round, counted from 1.
            updates: The round's uploads that passed the server's screening (possibly none).

        Returns:
            The new server state, by tensor name.
        """

    @override
    def state_dict(self) -> dict[str, Any]:
        """Server state for checkpoints."""
        return {"global_state": self.global_state}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`."""
        self.global_state = dict(state_dict["global_state"])

    def configure_eval_finetune(self, pl_module: FederatedModule) -> torch.optim.Optimizer | None:
        """The optimizer of the :attr:`eval_finetune_steps` taken before each evaluation, over ``pl_module``'s
        parameters as loaded for the client; None (the default): the module's ``configure_optimizers`` at the
        round's learning rate. Per-FedAvg's one plain step of size alpha returns ``SGD(params, lr=alpha)``; a
        method that fine-tunes only the head returns an optimizer over the head's parameters."""
        return None

    def hparams(self) -> dict[str, Any]:
        """Hyperparameters shown by ``repr``, logged to TensorBoard and recorded in ``results.json``. Default: the
        arguments the strategy was built with (see the class docstring), JSON-friendly; override it only to hide
        or rename some, from ``super().hparams()``."""
        return {k: jsonable(v) for k, v in init_arguments(self).items()}

    @override
    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.hparams().items())
        return f"{type(self).__name__}({args})"
