"""What the server of a Flower deployment accepts from a node: each reply checked against what it sent and knows.

A node runs code and holds data the server does not control, so its reply may be malformed, mistaken or forged.
Before a ``train`` reply becomes a :class:`~fedlit.engine.loop.client.ClientTurn` (:func:`train_reply`) and an
``evaluate`` reply an :class:`~fedlit.engine.loop.tasks.EvaluateResult` (:func:`evaluate_reply`), it is checked here; a
reply that fails a check gives a one-line reason naming the client and what was wrong (``client 'site_1' replied a
state whose 'head.weight' has shape (1,), not (3, 8) as sent``), which
:class:`~fedlit.flower.server.FlowerExecutor` handles as a failed node: left out of the round with a warning under
``federation.on_client_error: skip``, the run stopped naming the client under ``raise``. Never aggregated.

A ``train`` reply must be readable (a ``turn`` record and the ``state``, ``update-extras`` and ``metrics`` trees)
and (:func:`update_problem`, which the SecAgg+ path applies to its turns too):

- name the task's client;
- give ``num_examples`` as the int its node declared as its train size at the ``query``, when the run started (a
  client's weight is fixed for the run: a reply that changes it is refused);
- upload in ``state`` exactly the tensors the strategy expects back
  (:meth:`~fedlit.strategies.base.Strategy.expected_upload_names`; by default every shared tensor sent), each with
  the shape and dtype it was sent with;
- hold finite floating tensors in ``state`` and ``update-extras``, and finite numbers in ``metrics`` (``loss`` and
  ``steps`` >= 0 among them), unless it reports a ``problem`` (a quarantined turn, left out of aggregation anyway:
  its loss may be NaN and its tensors are not checked for finiteness).

An ``evaluate`` reply must name the task's client, report only the splits asked (and ``global/<split>`` when a
global model was sent), each a dict of numbers (NaN allowed: a metric that is undefined on the split, as AUROC with
one class; never +-inf), and download bytes between 0 and what was sent.

Not checked, for the server cannot know them: the values of an update beyond finiteness (a bounded but poisoned
update passes the reply's checks: the server's norm bounds, :mod:`fedlit.engine.loop.screening`, and the robust
aggregators, FedMedian, FedTrimmedAvg, Krum, are for that); that the size a node declared is its real train size
(the operator's node registry may fix it, :mod:`fedlit.flower.registry`; ``federation.max_client_weight`` caps its
weight); the names and shapes of the extras (each strategy's own, read by its ``aggregate``); the rest of what the
node reported at the ``query``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

from flwr.app import RecordDict
from torch import Tensor

from fedlit.core.tensors import non_finite_name
from fedlit.engine.loop.client import ClientTurn
from fedlit.engine.loop.evaluate import GLOBAL
from fedlit.engine.loop.tasks import EvaluateResult, EvaluateTask, FitTask
from fedlit.flower import codec
from fedlit.strategies.base import ClientUpdate


def train_reply(
    reply: RecordDict, task: FitTask, *, expected: Sequence[str], train_size: int, download_bytes: int
) -> ClientTurn | str:
    """The turn a ``train`` reply holds, or why the server refuses it.

    Args:
        reply: The reply's content (not an ``error`` reply).
        task: What the server sent the client.
        expected: The names of the tensors the client must upload in ``state``.
        train_size: The client's train split, as its node declared it at the ``query``: the only ``num_examples``
            allowed.
        download_bytes: Bytes of what the server sent (the reply's own count is not used).
    """
    try:
        turn: Mapping[str, Any] = reply.config_records["turn"]  # a node's values: checked by update_problem
        update = ClientUpdate(
            turn["client-id"],
            turn["num-examples"],
            codec.get_tree(reply, "state"),
            codec.get_tree(reply, "metrics"),
            codec.get_tree(reply, "update-extras"),
        )
        problem = json.loads(str(turn["problem"]))
        # a reply of an older client has no kind: its problem was a non-finite value (timeouts came later)
        kind = str(turn["problem-kind"]) if "problem-kind" in turn else "non-finite"
    except Exception as err:  # noqa: BLE001  (whatever a malformed reply breaks: a missing record, bad JSON)
        return f"client {task.client_id!r} sent a train reply the server cannot read ({type(err).__name__}: {err})"
    if kind not in PROBLEM_KINDS:
        return f"client {task.client_id!r} sent a train reply with problem-kind {kind!r}, not one of {PROBLEM_KINDS}"
    why = update_problem(update, problem, task, expected=expected, train_size=train_size)
    return why if why is not None else ClientTurn(update, download_bytes, problem, kind)


#: The kinds of problem a turn may report (:class:`~fedlit.engine.loop.client.ClientTurn`'s ``problem_kind``).
PROBLEM_KINDS = ("non-finite", "timeout")


def update_problem(
    update: ClientUpdate, problem: Any, task: FitTask, *, expected: Sequence[str], train_size: int
) -> str | None:
    """Why the server refuses ``update`` (of a turn that reported ``problem``) as the reply to ``task``, or None."""
    why = (
        _client(update.client_id, task.client_id)
        or _num_examples(update.num_examples, train_size)
        or _problem(problem)
        or state_problem(update.state, task.received, expected)
        or metrics_problem(update.metrics, quarantined=problem is not None)
    )
    if why is None and problem is None:
        why = non_finite(update.state, "a state") or _extras(update.extras)
    return None if why is None else f"client {task.client_id!r} replied {why}"


def state_problem(state: Any, sent: Mapping[str, Tensor], expected: Sequence[str]) -> str | None:
    """Why ``state`` is not the upload of the tensors ``expected`` with the shapes and dtypes ``sent``, or None."""
    if not isinstance(state, Mapping):
        return f"a state of type {type(state).__name__}, not a dict of tensors"
    missing = [n for n in expected if n not in state]
    if missing:
        return f"a state without {_names(missing)} ({len(state)} tensors, {len(expected)} expected)"
    extra = [n for n in state if n not in expected]
    if extra:
        return f"a state with {_names(extra)}, which the server did not send or does not expect back"
    for name in expected:
        tensor, like = state[name], sent[name]
        if not isinstance(tensor, Tensor):
            return f"a state whose {name!r} is a {type(tensor).__name__}, not a tensor"
        if tensor.shape != like.shape:
            return f"a state whose {name!r} has shape {tuple(tensor.shape)}, not {tuple(like.shape)} as sent"
        if tensor.dtype != like.dtype:
            return f"a state whose {name!r} is {_dtype(tensor)}, not {_dtype(like)} as sent"
    return None


def metrics_problem(metrics: Any, *, quarantined: bool = False) -> str | None:
    """Why ``metrics`` are not a turn's finite numbers with ``loss`` and ``steps`` >= 0 (a ``quarantined`` turn's
    loss may be NaN), or None."""
    if not isinstance(metrics, Mapping):
        return f"metrics of type {type(metrics).__name__}, not a dict of numbers"
    missing = [k for k in ("loss", "steps") if k not in metrics]
    if missing:
        return f"metrics without {_names(missing)}"
    for key, value in metrics.items():
        if not _is_number(value):
            return f"a metric {key!r} of type {type(value).__name__}, not a number"
        nan_loss = quarantined and key == "loss" and math.isnan(value)
        if not math.isfinite(value) and not nan_loss:
            return f"a metric {key!r} = {value}" + ("" if quarantined else " with no problem reported")
    if metrics["steps"] < 0:
        return f"a metric 'steps' = {metrics['steps']}, below 0"
    return None


def non_finite(tree: Any, what: str) -> str | None:
    """``"<what> whose 'name' is not finite..."`` for the first floating tensor of ``tree`` with NaN or Inf, or
    None."""
    name = non_finite_name(tree)
    return None if name is None else f"{what} whose {name!r} is not finite, with no problem reported"


def evaluate_reply(reply: RecordDict, task: EvaluateTask, *, sent_bytes: int) -> EvaluateResult | str:
    """The result an ``evaluate`` reply holds, or why the server refuses it.

    Args:
        reply: The reply's content (not an ``error`` reply).
        task: What the server sent the client.
        sent_bytes: Bytes of the tensors sent (``received`` and the global model): the most it downloaded.
    """
    try:
        record: Mapping[str, Any] = reply.config_records["evaluation"]  # a node's values: checked below
        claimed, download = record["client-id"], record["download-bytes"]
        metrics, image = codec.get_tree(reply, "metrics"), codec.get_tree(reply, "image")
    except Exception as err:  # noqa: BLE001  (whatever a malformed reply breaks)
        return (
            f"client {task.client_id!r} sent an evaluation reply the server cannot read ({type(err).__name__}: {err})"
        )
    splits = [*task.splits, *([f"{GLOBAL}/{s}" for s in task.splits] if task.global_state is not None else [])]
    why = (
        _client(claimed, task.client_id)
        or evaluation_problem(metrics, splits)
        or _download(download, sent_bytes)
        or _image(image)
    )
    if why is not None:
        return f"client {task.client_id!r} replied {why}"
    # The fine-tuning steps are what the server asked for, counted for a client that evaluated its own model.
    steps = task.finetune_steps if any(s in metrics for s in task.splits) else 0
    return EvaluateResult(metrics, download, image, steps)


def evaluation_problem(metrics: Any, splits: Sequence[str]) -> str | None:
    """Why ``metrics`` are not a dict of numbers (NaN allowed, not +-inf) per split of ``splits``, or None."""
    if not isinstance(metrics, Mapping):
        return f"evaluation metrics of type {type(metrics).__name__}, not a dict per split"
    for split, values in metrics.items():
        if split not in splits:
            return f"evaluation metrics for {split!r}, which the server did not ask for (asked: {list(splits)})"
        if not isinstance(values, Mapping):
            return f"evaluation metrics for {split!r} of type {type(values).__name__}, not a dict of numbers"
        for key, value in values.items():
            if not isinstance(key, str) or not _is_number(value):
                return f"an evaluation metric {split}/{key} of type {type(value).__name__}, not a number"
            if math.isinf(value):
                return f"an evaluation metric {split}/{key} = {value}"
    return None


# ------------------------------------------------------------------------------------------------------ helpers
def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _client(claimed: Any, client_id: str) -> str | None:
    return None if claimed == client_id else f"as client {claimed!r} (the task was for {client_id!r})"


def _int_in(value: Any, low: int, high: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def _num_examples(value: Any, train_size: int) -> str | None:
    return (
        None
        if _int_in(value, train_size, train_size)
        else f"num_examples={value!r}, not {train_size} (the train size its node declared when the run started: a "
        "client's weight is fixed for the run)"
    )


def _problem(problem: Any) -> str | None:
    return (
        None
        if problem is None or isinstance(problem, str)
        else (f"a problem of type {type(problem).__name__}, not a string or null")
    )


def _extras(extras: Any) -> str | None:
    if not isinstance(extras, Mapping):
        return f"extras of type {type(extras).__name__}, not a dict"
    return non_finite(extras, "an extra")


def _download(value: Any, sent_bytes: int) -> str | None:
    return (
        None
        if _int_in(value, 0, sent_bytes)
        else (f"download bytes {value!r}, not an int in 0..{sent_bytes} (what the server sent)")
    )


def _image(image: Any) -> str | None:
    return (
        None
        if image is None or isinstance(image, Tensor)
        else (f"a validation image of type {type(image).__name__}, not a tensor")
    )


def _names(names: Sequence[str]) -> str:
    shown = ", ".join(repr(n) for n in names[:3])
    return shown + (f" and {len(names) - 3} more" if len(names) > 3 else "")


def _dtype(tensor: Tensor) -> str:
    return str(tensor.dtype).removeprefix("torch.")
