"""Secure aggregation of a round's uploads with Flower's SecAgg+ (the server learns only their weighted mean).

Bell, Bonawitz, Gascón, Lepoint, Raykova. "Secure Single-Server Aggregation with (Poly)Logarithmic Overhead."
ACM CCS 2020.

Each client of a round uploads ``[w_k, w_k x_k]`` (``w_k = n_k / max_weight``, ``x_k`` its shared tensors, ``n_k``
its ``num_examples``), quantized to integers and masked by pairwise masks agreed with its neighbours plus a private
mask; the masks cancel in the sum, so the server recovers ``sum_k w_k x_k / sum_k w_k`` and nothing about a single
``x_k`` (Flower's :class:`~flwr.server.workflow.SecAggPlusWorkflow` on the server, ``secaggplus_mod`` on the
clients, flwr 1.41). As Flower's own legacy path does, every client's ``update.state`` is then set to that mean:
a strategy whose ``aggregate`` is a ``num_examples``-weighted mean of the states (see
:attr:`fedlit.strategies.Strategy.secure_aggregation`) gives the same result as with the plain uploads, up to
the quantization error below.

Server: :func:`secure_fit` runs the four stages of the protocol for one round over the round's nodes (the clients
train inside the third, "collect masked vectors") and returns the round's turns. Client: :func:`client_mods` goes
into the ``ClientApp``; its train function hands the messages for which :func:`is_secure_train` holds to
:func:`handle_secure_train`.

Quantization (``SecAggOptions``): a client multiplies its tensors by ``w_k``, clips them to
``[-clipping_range, clipping_range]`` and rounds them stochastically (unbiased) to a grid of step
``2 clipping_range / quantization_range``. The mean of K clients is therefore off by at most
``K max_weight (2 clipping_range + max|x|) / (quantization_range sum_k n_k)`` per value (the rounding of the
values, and of the weights ``w_k`` to multiples of ``1 / quantization_range``). A client refuses to upload (and
drops out of the round with an error naming the option) when a value would be clipped,
``max|x| n_k / max_weight > clipping_range``, or when ``n_k > max_weight``; the server refuses a round whose
``K quantization_range`` reaches the masks' modulus ``2^32``.

What the secure path does not hide: the clients' ``num_examples``, training loss and step count, and integer
tensors (BatchNorm's ``num_batches_tracked``, a step counter that would not fit the clipping range), which
travel in the clear beside the masked vector. Extras (``configure_client_extras``, ``update.extras``) cannot be
masked and are refused. Deviation from the paper's cryptographic pseudo-random generator: flwr 1.41 expands each
mask with NumPy's Mersenne Twister seeded by 32 bits folded from the agreed key, so a mask is one of 2^32; the
protection is that of this implementation.

Faults: a turn whose ``problem`` is set (non-finite loss or tensor) or whose training raised is never masked into
the sum: the client raises, the ``ClientApp`` answers with an error, the protocol treats the client as dropped
(its pairwise masks are rebuilt from the shares its neighbours hold) and :func:`secure_fit` returns the turn as
quarantined (``problem`` set, nothing uploaded) or as the error's description. The round goes on while every
remaining client keeps at least ``reconstruction_threshold`` live neighbours; otherwise Flower halts it and every
turn of the round is an error.
"""

from __future__ import annotations

import inspect
import json
import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, fields
from difflib import get_close_matches
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Error, Message, RecordDict
from flwr.app.message_type import MessageType
from flwr.client.mod import secaggplus_mod
from flwr.common import (
    Code,
    FitIns,
    FitRes,
    Parameters,
    Status,
    bytes_to_ndarray,
    ndarray_to_bytes,
    ndarrays_to_parameters,
    parameters_to_ndarrays,
)
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS, Key, Stage
from flwr.compat.common import recorddict_compat as compat
from flwr.server import strategy as flwr_strategy
from flwr.server.compat.grid_client_proxy import GridClientProxy
from flwr.server.compat.legacy_context import LegacyContext
from flwr.server.workflow import SecAggPlusWorkflow
from flwr.server.workflow.constant import MAIN_CONFIGS_RECORD, MAIN_PARAMS_RECORD
from flwr.server.workflow.constant import Key as WorkflowKey
from flwr.serverapp.grid import Grid
from torch import Tensor

from fedlit.core.errors import ConfigError
from fedlit.core.tensors import nbytes as state_nbytes
from fedlit.engine.client import ClientTurn
from fedlit.strategies.aggregators import WeightedMeanAggregator
from fedlit.strategies.base import ClientUpdate, Strategy
from fedlit.strategies.fedavg import FedAvg

if TYPE_CHECKING:
    from fedlit.engine.run import Run
    from fedlit.engine.tasks import FitTask

OPTION = "secure-aggregation"
#: The masks' modulus (Flower's ``modulus_range``): sums of quantized values must stay below it.
MODULUS = 2**32
#: Methods that read the uploads: a class that overrides one below the class declaring ``secure_aggregation``
#: has not declared that its own version needs only the weighted mean.
_READS_UPLOADS = ("aggregate", "combine", "client_weights", "check_uploads", "on_before_aggregate",
                  "configure_client_extras", "on_client_fit_end")
_PREFIX = "fedlit."  # keys of fedlit's entries in the FitIns config and the FitRes metrics
_FAULT = "fedlit-secagg-fault"  # marks the description of a client's fault inside Flower's error reason

TrainFn = Callable[[str, int, dict[str, Tensor], dict[str, Any]], ClientTurn]


def _parse_setting(text: str) -> Any:
    """The run config's ``secure-aggregation`` text: ``true``/``false`` or a JSON mapping of options."""
    if text.strip().lower() in ("true", "false", ""):
        return text.strip().lower() == "true"
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise ConfigError(f"{OPTION}={text!r} must be true, false or a JSON mapping of options such as "
                          f"'{{\"max_weight\": 200}}' ({err}).") from None


@dataclass
class SecAggOptions:
    """The SecAgg+ settings of a Flower deployment (the Flower run config's ``secure-aggregation``).

    The defaults suit small federations (a few to a few dozen clients per round): every client is every other's
    neighbour and its secrets are rebuilt from two thirds of their shares (at least 2), so up to a third of a
    round's clients may drop out, and the server would need the shares of two thirds of a client's neighbours
    (colluding with it) to unmask that client's upload.

    Attributes:
        num_shares: Neighbours each client shares its secrets with, itself included: an integer > 2, or a fraction
            in (0, 1] of the round's clients (1.0: all). Bell et al. take O(log n) for large rounds.
        reconstruction_threshold: Shares needed to rebuild a client's secrets: an integer >= 2 below
            ``num_shares``, or a fraction in (0, 1] of ``num_shares`` (at least 2). Higher: more colluding clients
            needed to unmask one upload, fewer dropouts tolerated (``num_shares - threshold`` per neighbourhood).
        clipping_range: Weighted values are clipped to [-clipping_range, clipping_range] before quantization (a
            client that would be clipped refuses instead, see the module docstring).
        quantization_range: Grid points over [-clipping_range, clipping_range]; the error shrinks with it, and
            ``clients per round * quantization_range`` must stay below 2^32.
        max_weight: The largest ``num_examples`` a client may have (its weight is ``num_examples / max_weight``);
            closest to the largest client's count gives the smallest error.
        timeout: Seconds the server waits for the replies of each stage (the third includes local training);
            None: no limit, a node that never answers stalls the round.
    """

    num_shares: int | float = 1.0
    reconstruction_threshold: int | float = 0.67
    clipping_range: float = 8.0
    quantization_range: int = 2**22
    max_weight: float = 1000.0
    timeout: float | None = None

    def __post_init__(self) -> None:
        problems = []
        shares, threshold = self.num_shares, self.reconstruction_threshold
        if isinstance(shares, bool) or not isinstance(shares, int | float) or (
                shares <= 2 if isinstance(shares, int) else not 0 < shares <= 1):
            problems.append(f"{OPTION}.num_shares={shares!r} must be an integer > 2 or a fraction in (0, 1] of the "
                            "round's clients (1.0: every client)")
        if isinstance(threshold, bool) or not isinstance(threshold, int | float) or (
                threshold < 2 if isinstance(threshold, int) else not 0 < threshold <= 1):
            problems.append(f"{OPTION}.reconstruction_threshold={threshold!r} must be an integer >= 2 or a fraction "
                            "in (0, 1] of num_shares")
        elif isinstance(threshold, int) and isinstance(shares, int) and not isinstance(shares, bool) \
                and threshold >= shares:
            problems.append(f"{OPTION}.reconstruction_threshold={threshold} must be below num_shares={shares}")
        if not (isinstance(self.clipping_range, int | float) and self.clipping_range > 0):
            problems.append(f"{OPTION}.clipping_range={self.clipping_range!r} must be > 0")
        if isinstance(self.quantization_range, bool) or not isinstance(self.quantization_range, int) \
                or not 2 <= self.quantization_range < 2**31:
            problems.append(f"{OPTION}.quantization_range={self.quantization_range!r} must be an integer in "
                            "[2, 2^31) (default 2^22 = 4194304)")
        if not (isinstance(self.max_weight, int | float) and self.max_weight > 0):
            problems.append(f"{OPTION}.max_weight={self.max_weight!r} must be > 0 (at least the largest client's "
                            "number of training examples)")
        if self.timeout is not None and not (isinstance(self.timeout, int | float) and self.timeout > 0):
            problems.append(f"{OPTION}.timeout={self.timeout!r} must be > 0 seconds or null (no limit)")
        if problems:
            raise ConfigError("; ".join(problems) + ".")

    @classmethod
    def from_config(cls, config: SecAggOptions | Mapping[str, Any] | str | bool | None) -> SecAggOptions | None:
        """The options from the run config's ``secure-aggregation``: a mapping of the fields above (or its JSON
        text), ``true`` for the defaults, ``false`` or null for no secure aggregation (None). Unknown keys are
        refused."""
        if isinstance(config, cls):
            return config
        if isinstance(config, str):
            config = _parse_setting(config)
        if config is None or config is False:
            return None
        if config is True:
            return cls()
        if not isinstance(config, Mapping):
            raise ConfigError(f"{OPTION}={config!r} must be true, false or a mapping of "
                              f"{[f.name for f in fields(cls)]}.")
        names = [f.name for f in fields(cls)]
        unknown = [k for k in config if k not in names]
        if unknown:
            hints = [f"{k!r} (did you mean {close[0]!r}?)" if (close := get_close_matches(str(k), names, 1)) else
                     repr(k) for k in unknown]
            raise ConfigError(f"{OPTION} has unknown keys {', '.join(hints)}; the keys are {names}.")
        return cls(**config)

    def resolved(self, num_clients: int) -> tuple[int, int]:
        """``(num_shares, threshold)`` for a round of ``num_clients``, as the workflow derives them (flwr 1.41)."""
        if isinstance(self.num_shares, float):
            shares = round(self.num_shares * num_clients)
            if shares < num_clients and shares % 2 == 0:
                shares += 1
            if shares <= 2:
                shares = num_clients
        else:
            shares = self.num_shares
        if isinstance(self.reconstruction_threshold, float):
            threshold = max(round(self.reconstruction_threshold * shares), 2)
        else:
            threshold = self.reconstruction_threshold
        return shares, threshold

    def workflow(self) -> SecAggPlusWorkflow:
        """Flower's workflow with these settings."""
        return SecAggPlusWorkflow(self.num_shares, self.reconstruction_threshold, max_weight=float(self.max_weight),
                                  clipping_range=float(self.clipping_range),
                                  quantization_range=self.quantization_range, modulus_range=MODULUS,
                                  timeout=self.timeout)


def _definer(cls: type, name: str) -> type | None:
    return next((c for c in cls.__mro__ if name in vars(c)), None)


def _class_problem(cls: type) -> str | None:
    """Why ``cls`` cannot aggregate securely whatever its arguments, or None."""
    if not getattr(cls, "secure_aggregation", False):
        return "its aggregate needs each client's upload (secure_aggregation = False)"
    flag = _definer(cls, "secure_aggregation")
    for method in _READS_UPLOADS:
        owner = _definer(cls, method)
        if owner is not None and flag is not None and owner is not flag and issubclass(owner, flag):
            return (f"{owner.__name__} overrides {method} after {flag.__name__} declared secure_aggregation, "
                    f"without declaring it again")
    return None


def compatible_strategies() -> list[str]:
    """The strategies of :mod:`fedlit.strategies` that can aggregate securely (with their default arguments)."""
    import fedlit.strategies as strategies  # the registry, imported when asked: it loads every strategy

    classes = [getattr(strategies, n) for n in strategies.__all__]
    return sorted(c.__name__ for c in classes if isinstance(c, type) and issubclass(c, Strategy)
                  and not inspect.isabstract(c) and _class_problem(c) is None)


def check_secure_aggregation(strategy: Strategy) -> None:
    """Raise a ``ConfigError`` naming ``strategy`` and the reason when it cannot run under secure aggregation:
    its ``aggregate`` needs more than the ``num_examples``-weighted mean of the uploaded states
    (:attr:`~fedlit.strategies.Strategy.secure_aggregation`), its aggregator is not the weighted mean, its
    weighting is not by ``num_examples``, or it overrides a method that reads the uploads without declaring it."""
    why = _class_problem(type(strategy))
    if why is None and isinstance(strategy, FedAvg):
        if type(strategy.aggregator) is not WeightedMeanAggregator:
            why = f"its aggregator {strategy.aggregator!r} needs each client's upload"
        elif strategy.weighting != "num_examples":
            why = (f"strategy.init_args.weighting={strategy.weighting!r}: SecAgg+ weighs each upload by its "
                   "num_examples (use weighting: num_examples)")
    if why is not None:
        raise ConfigError(
            f"{OPTION}: {strategy!r} cannot aggregate securely: {why}. SecAgg+ reveals only the num_examples-"
            f"weighted mean of the uploads; strategies that need no more: {', '.join(compatible_strategies())}. "
            f"Use one of them or turn {OPTION} off.")


# ---- server side ----------------------------------------------------------------------------------------------


def secure_fit(grid: Grid, fed: Run, server_round: int, tasks: list[FitTask], node_ids: Mapping[str, int],
               options: SecAggOptions) -> list[ClientTurn | str]:
    """One round's turns through SecAgg+: in the order of ``tasks``, a :class:`ClientTurn` whose ``update.state``
    is the securely aggregated ``num_examples``-weighted mean (the same tensors for every client; integer tensors:
    the client's own, sent in the clear), ``num_examples`` and ``metrics`` (``loss``, ``steps``) the client's,
    ``download_bytes`` what it received; a quarantined turn (``problem`` set, nothing uploaded); or, for a client
    the protocol dropped (an error, no reply in time, a halted round), a description of why.

    Args:
        grid: The ServerApp's grid.
        fed: The federation (its strategy is checked with :func:`check_secure_aggregation`).
        server_round: The round, from 1.
        tasks: What the strategy sends each client of the round.
        node_ids: The Flower node of each client; every client of a round needs a node of its own.
        options: The protocol's settings.
    """
    check_secure_aggregation(fed.strategy)
    _check_round(tasks, node_ids, options)
    recorder = _RecordingGrid(grid)
    adapter = _LegacyStrategy(tasks, node_ids, server_round, options, recorder)
    state = RecordDict()
    state.config_records[MAIN_CONFIGS_RECORD] = ConfigRecord({WorkflowKey.CURRENT_ROUND: server_round})
    state.array_records[MAIN_PARAMS_RECORD] = ArrayRecord()
    context = LegacyContext(Context(run_id=0, node_id=0, node_config={}, state=state, run_config={}),
                            strategy=adapter)
    options.workflow()(recorder, context)
    results = {proxy.node_id: res for proxy, res in adapter.results or []}
    mean = parameters_to_ndarrays(next(iter(results.values())).parameters) if results else []
    turns: list[ClientTurn | str] = []
    for task in tasks:
        node = node_ids[task.client_id]
        fault = recorder.faults.get(node)
        download = state_nbytes(task.received) + state_nbytes(task.received_extras)
        if node in results:
            turns.append(_turn(task, results[node], mean, download))
        elif fault is not None and fault.get("kind") == "problem":
            update = ClientUpdate(task.client_id, int(fault["num_examples"]), {},
                                  {"loss": float(fault["loss"]), "steps": float(fault["steps"])})
            turns.append(ClientTurn(update, download, str(fault["detail"])))
        elif fault is not None:
            turns.append(str(fault["detail"]))
        else:
            turns.append(f"dropped by SecAgg+ in round {server_round}: {recorder.halt_reason(node, options)}")
    return turns


def _check_round(tasks: list[FitTask], node_ids: Mapping[str, int], options: SecAggOptions) -> None:
    ids = [t.client_id for t in tasks]
    missing = [c for c in ids if c not in node_ids]
    if missing:
        raise ConfigError(f"{OPTION}: no Flower node for clients {missing[:5]}.")
    by_node: dict[int, list[str]] = {}
    for c in ids:
        by_node.setdefault(node_ids[c], []).append(c)
    shared = {n: cs for n, cs in by_node.items() if len(cs) > 1}
    if shared:
        raise ConfigError(f"{OPTION}: clients of one round share a Flower node ({shared}); SecAgg+ masks one upload "
                          "per node, so start one SuperNode per client.")
    with_extras = [t.client_id for t in tasks if t.received_extras]
    if with_extras:
        raise ConfigError(f"{OPTION}: the strategy sends extras (configure_client_extras) to {with_extras[:5]}, "
                          "which the secure path does not carry; use a strategy without extras.")
    if len(tasks) < 2:
        raise ConfigError(f"{OPTION}: a round of {len(tasks)} client cannot hide its upload (the mean is the upload); "
                          "select at least 2 clients per round (3 or more: with 2, each learns the other's).")
    if len(tasks) * options.quantization_range >= MODULUS:
        raise ConfigError(f"{OPTION}.quantization_range={options.quantization_range}: {len(tasks)} clients' sum "
                          f"would overflow the masks' modulus 2^32; lower it below {MODULUS // len(tasks)}.")
    shares, threshold = options.resolved(len(tasks))
    neighbours = min(2 * (shares // 2) + 1, len(tasks))
    if threshold > neighbours:
        raise ConfigError(f"{OPTION}.reconstruction_threshold={options.reconstruction_threshold} needs {threshold} "
                          f"shares, but with {len(tasks)} clients (num_shares={options.num_shares}) a client has "
                          f"{neighbours} neighbours; lower it (a fraction such as 0.67 adapts to the round).")


def _turn(task: FitTask, res: FitRes, mean: list[np.ndarray], download: int) -> ClientTurn:
    """The turn of a client whose masked vector went into ``mean`` (in the order of the floating tensors)."""
    config = _fit_config(task, None)
    names, dtypes = json.loads(config[_PREFIX + "names"]), json.loads(config[_PREFIX + "dtypes"])
    floats = iter(mean)
    state: dict[str, Tensor] = {}
    for name, dtype in zip(names, dtypes, strict=True):
        device = task.received[name].device
        if _is_float(dtype):
            state[name] = torch.from_numpy(np.asarray(next(floats), dtype=np.float64)).to(device, _dtype(dtype))
        else:
            array = bytes_to_ndarray(res.metrics[_PREFIX + "clear:" + name])
            state[name] = torch.from_numpy(array.copy()).to(device, _dtype(dtype))
    metrics = {"loss": float(res.metrics["loss"]), "steps": float(res.metrics["steps"])}
    update = ClientUpdate(task.client_id, int(res.num_examples), state, metrics)
    return ClientTurn(update, download)


class _LegacyStrategy(flwr_strategy.Strategy):
    """The Flower strategy the workflow drives: one FitIns per node with its task's tensors; keeps the results."""

    def __init__(self, tasks: list[FitTask], node_ids: Mapping[str, int], server_round: int,
                 options: SecAggOptions, grid: Grid) -> None:
        self.instructions = [(GridClientProxy(node_ids[t.client_id], grid, 0), _fit_ins(t, server_round, options))
                             for t in tasks]
        self.results: list[tuple[Any, FitRes]] | None = None

    def initialize_parameters(self, client_manager: Any) -> Parameters | None:
        return None

    def configure_fit(self, server_round: int, parameters: Parameters, client_manager: Any) -> list[Any]:
        return list(self.instructions)

    def aggregate_fit(self, server_round: int, results: list[Any], failures: list[Any]) -> tuple[None, dict]:
        # Every FitRes holds the unmasked weighted mean now; the fedlit strategy aggregates, not Flower.
        self.results = list(results)
        return None, {}

    def configure_evaluate(self, server_round: int, parameters: Parameters, client_manager: Any) -> list[Any]:
        return []

    def aggregate_evaluate(self, server_round: int, results: list[Any], failures: list[Any]) -> tuple[None, dict]:
        return None, {}

    def evaluate(self, server_round: int, parameters: Parameters) -> None:
        return None


def _fit_config(task: FitTask, server_round: int | None) -> dict[str, Any]:
    # The legacy FitIns config holds scalars only: the names and dtypes travel as JSON lists.
    names = list(task.received)
    config: dict[str, Any] = {
        _PREFIX + "names": json.dumps(names),
        _PREFIX + "dtypes": json.dumps([str(task.received[n].dtype).removeprefix("torch.") for n in names]),
        _PREFIX + "client_id": task.client_id}
    if server_round is not None:
        config[_PREFIX + "round"] = server_round
    return config


def _fit_ins(task: FitTask, server_round: int, options: SecAggOptions) -> FitIns:
    """``task``'s tensors in name order (plain: they come from the server) and the names, dtypes, client, round."""
    config = _fit_config(task, server_round)
    config[_PREFIX + "clipping_range"] = float(options.clipping_range)
    config[_PREFIX + "max_weight"] = float(options.max_weight)
    arrays = [_numpy(t) for t in task.received.values()]
    return FitIns(ndarrays_to_parameters(arrays), config)


class _RecordingGrid(Grid):
    """``grid`` seen through: notes, per node, the first stage it failed or did not answer, and its fault."""

    def __init__(self, grid: Grid) -> None:
        self.grid = grid
        self.faults: dict[int, dict[str, Any]] = {}
        self.answered: dict[str, set[int]] = {}

    def set_run(self, run: Any) -> None:
        self.grid.set_run(run)

    @property
    def run(self) -> Any:
        return self.grid.run

    def create_message(self, *args: Any, **kwargs: Any) -> Message:
        return self.grid.create_message(*args, **kwargs)

    def get_node_ids(self) -> Iterable[int]:
        return self.grid.get_node_ids()

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        return self.grid.push_messages(messages)

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        return self.grid.pull_messages(message_ids)

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> Iterable[Message]:
        messages = list(messages)
        stage = str(messages[0].content.config_records[RECORD_KEY_CONFIGS][Key.STAGE]) if messages else "?"
        replies = list(self.grid.send_and_receive(messages, timeout=timeout))
        answered = {r.metadata.src_node_id for r in replies}
        self.answered[stage] = answered
        for reply in replies:
            if reply.has_error() and reply.metadata.src_node_id not in self.faults:
                self.faults[reply.metadata.src_node_id] = _fault_of(reply.error, stage)
        for message in messages:
            node = message.metadata.dst_node_id
            if node not in answered and node not in self.faults:
                self.faults[node] = {"kind": "error", "detail": f"SecAgg+ stage {stage!r}: no reply in time"}
        return replies

    def halt_reason(self, node: int, options: SecAggOptions) -> str:
        """Why a client that did not fail itself has no result: the round was halted."""
        reached = [s for s in Stage.all() if s in self.answered]
        last = reached[-1] if reached else Stage.SETUP
        return (f"the protocol halted after stage {last!r}: too few clients answered to rebuild the masks "
                f"(reconstruction_threshold={options.reconstruction_threshold}; faults: "
                f"{[f['detail'] for f in self.faults.values()][:3]})")


def _fault_of(error: Error, stage: str) -> dict[str, Any]:
    reason = error.reason or ""
    found = re.search(_FAULT + r" (\{.*\})", reason, re.DOTALL)
    if found:
        try:
            return dict(json.loads(found.group(1)))
        except ValueError:
            pass
    return {"kind": "error", "detail": f"SecAgg+ stage {stage!r}: the node answered with an error "
                                       f"(code {error.code}): {reason}"}


# ---- client side ----------------------------------------------------------------------------------------------


class SecureTrainFault(Exception):
    """A client's turn that must not enter the masked sum; its text carries the fault for :func:`secure_fit`."""

    def __init__(self, **fault: Any) -> None:
        super().__init__(f"{_FAULT} {json.dumps(fault)}")
        self.fault = fault


def _secaggplus_for_secure_train(msg: Message, context: Context, call_next: Callable[..., Message]) -> Message:
    # Flower's mod takes every "train" message; the deployment's plain train messages carry no SecAgg+ config.
    if msg.metadata.message_type == MessageType.TRAIN and RECORD_KEY_CONFIGS in msg.content.config_records:
        return secaggplus_mod(msg, context, call_next)
    return call_next(msg, context)


def client_mods() -> list[Callable[..., Message]]:
    """The mods of the ``ClientApp``: Flower's ``secaggplus_mod``, applied to SecAgg+ messages only."""
    return [_secaggplus_for_secure_train]


def is_secure_train(msg: Message) -> bool:
    """True for a "train" message of the SecAgg+ protocol: pass it to :func:`handle_secure_train`."""
    return (msg.metadata.message_type == MessageType.TRAIN and msg.has_content()
            and RECORD_KEY_CONFIGS in msg.content.config_records)


def handle_secure_train(msg: Message, context: Context, train: TrainFn) -> Message:
    """Train the client named in ``msg`` and reply with its FitRes, for ``secaggplus_mod`` to mask.

    ``train(client_id, server_round, received, received_extras)`` runs the client's turn (fedlit's
    :func:`~fedlit.engine.client.train_client` where the client lives). The reply's parameters are the client's
    floating shared tensors in the order the server named them (float64), ``num_examples`` its count, metrics its
    ``loss`` and ``steps`` and its integer tensors (in the clear). A turn that raised, is quarantined, uploads
    extras or would be clipped raises :class:`SecureTrainFault` instead: the client drops out of the round.
    """
    if "fitins.config" not in msg.content.config_records:
        raise ConfigError(f"{OPTION}: a SecAgg+ message reached the train function before the protocol's mod: build "
                          "the ClientApp with mods=fedlit.flower.secagg.client_mods().")
    ins = compat.recorddict_to_fitins(msg.content, keep_input=True)
    config = ins.config
    names, dtypes = json.loads(str(config[_PREFIX + "names"])), json.loads(str(config[_PREFIX + "dtypes"]))
    client_id, server_round = str(config[_PREFIX + "client_id"]), int(config[_PREFIX + "round"])  # type: ignore[arg-type]
    received = {n: torch.from_numpy(a.copy()).to(_dtype(d))
                for n, d, a in zip(names, dtypes, parameters_to_ndarrays(ins.parameters), strict=True)}
    try:
        turn = train(client_id, server_round, received, {})
    except Exception as err:  # noqa: BLE001  (the server gets the description; the client drops out)
        raise SecureTrainFault(kind="error", detail=f"{type(err).__name__}: {err}") from err
    update = turn.update
    if turn.problem is not None:
        raise SecureTrainFault(kind="problem", detail=turn.problem, num_examples=update.num_examples,
                               loss=float(update.metrics.get("loss", math.nan)),
                               steps=float(update.metrics.get("steps", 0.0)))
    problem = _upload_problem(update, names, float(config[_PREFIX + "clipping_range"]),  # type: ignore[arg-type]
                              float(config[_PREFIX + "max_weight"]))  # type: ignore[arg-type]
    if problem is not None:
        raise SecureTrainFault(kind="error", detail=f"client {client_id!r}: {problem}")
    floats = [update.state[n].detach().to("cpu", torch.float64).numpy() for n in names
              if update.state[n].is_floating_point()]
    metrics: dict[str, Any] = {"loss": float(update.metrics["loss"]), "steps": float(update.metrics["steps"]),
                               _PREFIX + "client_id": client_id}
    for n in names:
        if not update.state[n].is_floating_point():
            metrics[_PREFIX + "clear:" + n] = ndarray_to_bytes(_numpy(update.state[n]))
    res = FitRes(Status(Code.OK, "Success"), ndarrays_to_parameters(floats), int(update.num_examples), metrics)
    return Message(compat.fitres_to_recorddict(res, keep_input=True), reply_to=msg)


def _upload_problem(update: ClientUpdate, names: list[str], clipping_range: float, max_weight: float) -> str | None:
    if update.extras:
        return (f"it uploads extras {sorted(update.extras)[:5]}, which SecAgg+ cannot mask; use a strategy without "
                "extras")
    if sorted(update.state) != sorted(names):
        return f"it uploads tensors {sorted(update.state)[:5]} instead of the shared ones it received {names[:5]}"
    n = update.num_examples
    if n > max_weight:
        return (f"its {n} training examples exceed {OPTION}.max_weight={max_weight:g}; set max_weight to at least the "
                "largest client's number of training examples")
    for name in names:
        tensor = update.state[name]
        if not tensor.is_floating_point() or tensor.numel() == 0:
            continue
        peak = float(tensor.detach().abs().max())
        if peak * n / max_weight > clipping_range:
            return (f"tensor {name!r} reaches {peak:.4g}, which weighted by num_examples / max_weight = {n}/"
                    f"{max_weight:g} exceeds {OPTION}.clipping_range={clipping_range:g} and would be clipped; raise "
                    f"clipping_range above {peak * n / max_weight:.4g} (or make the tensor personal)")
    return None


def _numpy(tensor: Tensor) -> np.ndarray:
    tensor = tensor.detach().cpu()
    return (tensor.float() if tensor.dtype == torch.bfloat16 else tensor).numpy()  # numpy has no bfloat16


def _dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown tensor dtype {name!r} in a SecAgg+ message")
    return dtype


def _is_float(name: str) -> bool:
    return _dtype(name).is_floating_point

