"""The server side of SecAgg+ in a Flower deployment: one round's uploads aggregated so the server sees their mean.

:func:`secure_fit` runs the four stages of Flower's :class:`~flwr.server.workflow.SecAggPlusWorkflow` for one round
over the round's nodes, driving a :class:`_LegacyStrategy` (one FitIns per node with its task's tensors) through a
:class:`_RecordingGrid` (which notes the stage and the fault of each node that drops out), and returns the round's
turns; :class:`~fedlit.flower.server.FlowerExecutor` calls it when the run config's ``secure-aggregation`` is on.
The protocol, its options and its quantization are described in :mod:`fedlit.flower.secagg` (which this module
imports); the clients' side is :mod:`fedlit.flower.secagg_client`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Error, Message, RecordDict
from flwr.common import (
    FitIns,
    FitRes,
    Parameters,
    bytes_to_ndarray,
    ndarrays_to_parameters,
    parameters_to_ndarrays,
)
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS, Key, Stage
from flwr.server import strategy as flwr_strategy
from flwr.server.compat.grid_client_proxy import GridClientProxy
from flwr.server.compat.legacy_context import LegacyContext
from flwr.server.workflow.constant import MAIN_CONFIGS_RECORD, MAIN_PARAMS_RECORD
from flwr.server.workflow.constant import Key as WorkflowKey
from flwr.serverapp.grid import Grid
from torch import Tensor
from typing_extensions import override

from fedlit.core.errors import ConfigError
from fedlit.core.tensors import nbytes as state_nbytes
from fedlit.engine.loop.client import ClientTurn
from fedlit.flower.remote import describe_error, replies_by_node
from fedlit.flower.secagg import (
    _FAULT,
    _PREFIX,
    MODULUS,
    OPTION,
    SecAggOptions,
    _dtype,
    _numpy,
    check_secure_aggregation,
)
from fedlit.strategies.base import ClientUpdate

if TYPE_CHECKING:
    from fedlit.engine.loop.run import Run
    from fedlit.engine.loop.tasks import FitTask


def secure_fit(
    grid: Grid, fed: Run, server_round: int, tasks: list[FitTask], node_ids: Mapping[str, int], options: SecAggOptions
) -> list[ClientTurn | str]:
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
    context = LegacyContext(Context(run_id=0, node_id=0, node_config={}, state=state, run_config={}), strategy=adapter)
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
            update = ClientUpdate(
                task.client_id,
                int(fault["num_examples"]),
                {},
                {"loss": float(fault["loss"]), "steps": float(fault["steps"])},
            )
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
        raise ConfigError(
            f"{OPTION}: clients of one round share a Flower node ({shared}); SecAgg+ masks one upload "
            "per node, so start one SuperNode per client."
        )
    with_extras = [t.client_id for t in tasks if t.received_extras]
    if with_extras:
        raise ConfigError(
            f"{OPTION}: the strategy sends extras (configure_client_extras) to {with_extras[:5]}, "
            "which the secure path does not carry; use a strategy without extras."
        )
    if len(tasks) < 2:
        raise ConfigError(
            f"{OPTION}: a round of {len(tasks)} client cannot hide its upload (the mean is the upload); "
            "select at least 2 clients per round (3 or more: with 2, each learns the other's)."
        )
    if len(tasks) * options.quantization_range >= MODULUS:
        raise ConfigError(
            f"{OPTION}.quantization_range={options.quantization_range}: {len(tasks)} clients' sum "
            f"would overflow the masks' modulus 2^32; lower it below {MODULUS // len(tasks)}."
        )
    shares, threshold = options.resolved(len(tasks))
    neighbours = min(2 * (shares // 2) + 1, len(tasks))
    if threshold > neighbours:
        raise ConfigError(
            f"{OPTION}.reconstruction_threshold={options.reconstruction_threshold} needs {threshold} "
            f"shares, but with {len(tasks)} clients (num_shares={options.num_shares}) a client has "
            f"{neighbours} neighbours; lower it (a fraction such as 0.67 adapts to the round)."
        )


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
            array = bytes_to_ndarray(cast(bytes, res.metrics[_PREFIX + "clear:" + name]))  # the client's bytes
            state[name] = torch.from_numpy(array.copy()).to(device, _dtype(dtype))
    metrics = {"loss": float(res.metrics["loss"]), "steps": float(res.metrics["steps"])}
    update = ClientUpdate(task.client_id, int(res.num_examples), state, metrics)
    return ClientTurn(update, download)


class _LegacyStrategy(flwr_strategy.Strategy):
    """The Flower strategy the workflow drives: one FitIns per node with its task's tensors; keeps the results."""

    def __init__(
        self, tasks: list[FitTask], node_ids: Mapping[str, int], server_round: int, options: SecAggOptions, grid: Grid
    ) -> None:
        self.instructions = [
            (GridClientProxy(node_ids[t.client_id], grid, 0), _fit_ins(t, server_round, options)) for t in tasks
        ]
        self.results: list[tuple[Any, FitRes]] | None = None

    @override
    def initialize_parameters(self, client_manager: Any) -> Parameters | None:
        return None

    @override
    def configure_fit(self, server_round: int, parameters: Parameters, client_manager: Any) -> list[Any]:
        return list(self.instructions)

    @override
    def aggregate_fit(self, server_round: int, results: list[Any], failures: list[Any]) -> tuple[None, dict]:
        # Every FitRes holds the unmasked weighted mean now; the fedlit strategy aggregates, not Flower.
        self.results = list(results)
        return None, {}

    @override
    def configure_evaluate(self, server_round: int, parameters: Parameters, client_manager: Any) -> list[Any]:
        return []

    @override
    def aggregate_evaluate(self, server_round: int, results: list[Any], failures: list[Any]) -> tuple[None, dict]:
        return None, {}

    @override
    def evaluate(self, server_round: int, parameters: Parameters) -> None:
        return None


def _fit_config(task: FitTask, server_round: int | None) -> dict[str, Any]:
    # The legacy FitIns config holds scalars only: the names and dtypes travel as JSON lists.
    names = list(task.received)
    config: dict[str, Any] = {
        _PREFIX + "names": json.dumps(names),
        _PREFIX + "dtypes": json.dumps([str(task.received[n].dtype).removeprefix("torch.") for n in names]),
        _PREFIX + "client_id": task.client_id,
    }
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

    @override
    def set_run(self, run: Any) -> None:
        self.grid.set_run(run)

    @override
    @property
    def run(self) -> Any:
        return self.grid.run

    @override
    def create_message(self, *args: Any, **kwargs: Any) -> Message:
        return self.grid.create_message(*args, **kwargs)

    @override
    def get_node_ids(self) -> Iterable[int]:
        return self.grid.get_node_ids()

    @override
    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        return self.grid.push_messages(messages)

    @override
    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        return self.grid.pull_messages(message_ids)

    @override
    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> Iterable[Message]:
        messages = list(messages)
        stage = str(messages[0].content.config_records[RECORD_KEY_CONFIGS][Key.STAGE]) if messages else "?"
        replies = list(self.grid.send_and_receive(messages, timeout=timeout))
        by_node = replies_by_node(messages, replies)  # by message id: the SuperLink sends a gone node's error
        answered = set(by_node)
        self.answered[stage] = answered
        for node, reply in by_node.items():
            if reply.has_error() and node not in self.faults:
                self.faults[node] = _fault_of(reply.error, stage)
        for message in messages:
            node = message.metadata.dst_node_id
            if node not in answered and node not in self.faults:
                self.faults[node] = {"kind": "error", "detail": f"SecAgg+ stage {stage!r}: no reply in time"}
        return replies

    def halt_reason(self, node: int, options: SecAggOptions) -> str:
        """Why a client that did not fail itself has no result: the round was halted."""
        reached = [s for s in Stage.all() if s in self.answered]
        last = reached[-1] if reached else Stage.SETUP
        return (
            f"the protocol halted after stage {last!r}: too few clients answered to rebuild the masks "
            f"(reconstruction_threshold={options.reconstruction_threshold}; faults: "
            f"{[f['detail'] for f in self.faults.values()][:3]})"
        )


def _fault_of(error: Error, stage: str) -> dict[str, Any]:
    reason = error.reason or ""
    found = re.search(_FAULT + r" (\{.*\})", reason, re.DOTALL)
    if found:
        try:
            return dict(json.loads(found.group(1)))
        except ValueError:
            pass
    return {
        "kind": "error",
        "detail": f"SecAgg+ stage {stage!r}: the node answered with an error: {describe_error(error)}",
    }


def _is_float(name: str) -> bool:
    return _dtype(name).is_floating_point
