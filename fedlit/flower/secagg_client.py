"""The client side of SecAgg+ in a Flower deployment: a node's turn answered as a FitRes for Flower to mask.

:func:`client_mods` goes into the ``ClientApp`` (Flower's ``secaggplus_mod``, applied to SecAgg+ messages only); its
train function hands the messages for which :func:`is_secure_train` holds to :func:`handle_secure_train`, which runs
the client's turn and replies with its floating shared tensors, or raises :class:`SecureTrainFault` for a turn that
must not enter the masked sum. :mod:`fedlit.flower.client` wires them into fedlit's ClientApp. The protocol, its
options and its quantization are described in :mod:`fedlit.flower.secagg` (which this module imports); the
server's side is :mod:`fedlit.flower.secagg_server`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

import torch
from flwr.app import Context, Message
from flwr.app.message_type import MessageType
from flwr.client.mod import secaggplus_mod
from flwr.common import (
    Code,
    FitRes,
    Status,
    ndarray_to_bytes,
    ndarrays_to_parameters,
    parameters_to_ndarrays,
)
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS
from flwr.compat.common import recorddict_compat as compat
from torch import Tensor

from fedlit.core.errors import ConfigError
from fedlit.engine.loop.client import ClientTurn
from fedlit.flower.secagg import _FAULT, _PREFIX, OPTION, _dtype, _numpy
from fedlit.strategies.base import ClientUpdate

TrainFn = Callable[[str, int, dict[str, Tensor], dict[str, Any]], ClientTurn]


class SecureTrainFault(Exception):
    """A client's turn that must not enter the masked sum; its text carries the fault for
    :func:`~fedlit.flower.secagg_server.secure_fit`."""

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
    return (
        msg.metadata.message_type == MessageType.TRAIN
        and msg.has_content()
        and RECORD_KEY_CONFIGS in msg.content.config_records
    )


def handle_secure_train(msg: Message, context: Context, train: TrainFn) -> Message:
    """Train the client named in ``msg`` and reply with its FitRes, for ``secaggplus_mod`` to mask.

    ``train(client_id, server_round, received, received_extras)`` runs the client's turn (fedlit's
    :func:`~fedlit.engine.loop.client.train_client` where the client lives). The reply's parameters are the client's
    floating shared tensors in the order the server named them (float64), ``num_examples`` its count, metrics its
    ``loss`` and ``steps`` and its integer tensors (in the clear). A turn that raised, is quarantined, uploads
    extras or would be clipped raises :class:`SecureTrainFault` instead: the client drops out of the round.
    """
    if "fitins.config" not in msg.content.config_records:
        raise ConfigError(
            f"{OPTION}: a SecAgg+ message reached the train function before the protocol's mod: build "
            "the ClientApp with mods=fedlit.flower.secagg_client.client_mods()."
        )
    ins = compat.recorddict_to_fitins(msg.content, keep_input=True)
    config = ins.config
    names, dtypes = json.loads(str(config[_PREFIX + "names"])), json.loads(str(config[_PREFIX + "dtypes"]))
    client_id, server_round = str(config[_PREFIX + "client_id"]), int(config[_PREFIX + "round"])  # type: ignore[arg-type]
    received = {
        n: torch.from_numpy(a.copy()).to(_dtype(d))
        for n, d, a in zip(names, dtypes, parameters_to_ndarrays(ins.parameters), strict=True)
    }
    try:
        turn = train(client_id, server_round, received, {})
    except Exception as err:  # noqa: BLE001  (the server gets the description; the client drops out)
        raise SecureTrainFault(kind="error", detail=f"{type(err).__name__}: {err}") from err
    update = turn.update
    if turn.problem is not None:
        raise SecureTrainFault(
            kind="problem",
            detail=turn.problem,
            num_examples=update.num_examples,
            loss=float(update.metrics.get("loss", math.nan)),
            steps=float(update.metrics.get("steps", 0.0)),
        )
    problem = _upload_problem(
        update,
        names,
        float(config[_PREFIX + "clipping_range"]),  # type: ignore[arg-type]
        float(config[_PREFIX + "max_weight"]),
    )  # type: ignore[arg-type]
    if problem is not None:
        raise SecureTrainFault(kind="error", detail=f"client {client_id!r}: {problem}")
    floats = [
        update.state[n].detach().to("cpu", torch.float64).numpy() for n in names if update.state[n].is_floating_point()
    ]
    metrics: dict[str, Any] = {
        "loss": float(update.metrics["loss"]),
        "steps": float(update.metrics["steps"]),
        _PREFIX + "client_id": client_id,
    }
    for n in names:
        if not update.state[n].is_floating_point():
            metrics[_PREFIX + "clear:" + n] = ndarray_to_bytes(_numpy(update.state[n]))
    res = FitRes(Status(Code.OK, "Success"), ndarrays_to_parameters(floats), int(update.num_examples), metrics)
    return Message(compat.fitres_to_recorddict(res, keep_input=True), reply_to=msg)


def _upload_problem(update: ClientUpdate, names: list[str], clipping_range: float, max_weight: float) -> str | None:
    if update.extras:
        return (
            f"it uploads extras {sorted(update.extras)[:5]}, which SecAgg+ cannot mask; use a strategy without extras"
        )
    if sorted(update.state) != sorted(names):
        return f"it uploads tensors {sorted(update.state)[:5]} instead of the shared ones it received {names[:5]}"
    n = update.num_examples
    if n > max_weight:
        return (
            f"its {n} training examples exceed {OPTION}.max_weight={max_weight:g}, so it cannot upload; set "
            "max_weight to at least the largest client's number of training examples, e.g. `flwr run APP "
            f'CONNECTION --run-config \'secure-aggregation="{{\\"max_weight\\": {n}}}"\'` (or fedlit '
            f"flower-app --secure_aggregation '{{\"max_weight\": {n}}}')"
        )
    for name in names:
        tensor = update.state[name]
        if not tensor.is_floating_point() or tensor.numel() == 0:
            continue
        peak = float(tensor.detach().abs().max())
        if peak * n / max_weight > clipping_range:
            return (
                f"tensor {name!r} reaches {peak:.4g}, which weighted by num_examples / max_weight = {n}/"
                f"{max_weight:g} exceeds {OPTION}.clipping_range={clipping_range:g} and would be clipped; raise "
                f"clipping_range above {peak * n / max_weight:.4g} (or make the tensor personal)"
            )
    return None
