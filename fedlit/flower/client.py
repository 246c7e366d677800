"""The client's side of a Flower deployment: one site's process, its data, its store entry.

A SuperNode of Flower 1.41 starts a fresh ``flwr-clientapp`` process for every message it receives (its SuperExec
launches one task per message) and keeps ``context.state`` between them. fedlit's ClientApp
(:mod:`fedlit.flower.clientapp`) forwards each message to the node's long-lived worker
(:mod:`fedlit.flower.worker`), which builds the client once per run and keeps it; with the node config
``worker=false`` (or this module's ``app``) each message's process builds it (:func:`handle_message`). Either way
the client is built from the recipe (:func:`node_run`: model, data, strategy and callbacks straight from the run
config's recipe, with the same seed and overrides as the server, no command line and no recipe file; a
:class:`ClientRuntime` sets them up as a run of one client that never fits by itself and builds that client's
:class:`~fedlit.engine.loop.client_context.ClientContext`, which every turn and evaluation takes), restores the client's
store entry (its personal tensors, optimizer state and the per-client state of the strategy and callbacks) from the
snapshots before every message, answers, and saves the entry again, so a kept client answers as a fresh one. The
entry (a ``torch.save`` of :meth:`~fedlit.core.store.ClientStore.client_state`, loaded with ``weights_only=True``)
is kept per round (:class:`~fedlit.flower.snapshots.Snapshots`, so a resumed server finds the state of its
checkpoint's round) in ``context.state`` (record ``fedlit.<run>``), or, when the node is started with
``--node-config "... state-dir='/path'"``, in ``<state-dir>/<run>/<client-id>/round_<r>.pt``, which outlives the
SuperNode process (:func:`snapshots_of`). The entry never leaves the node.

What the data module builds: the recipe's data section with the node's own ``overrides`` (node config) on top,
told before ``setup()`` to build the node's ``client-id`` only
(:meth:`~fedlit.data.FederatedDataModule.only_site`, through :class:`~fedlit.flower.node_data.OwnClientData`): a
site data set (``FedHeartDisease``, ``SiteTable``, ``SiteFolders``, the segmentation sites) reads that site's files
alone and builds it exactly as among all the sites, so a node's folder holds its own site only (point the node's
``overrides`` at it, e.g. ``--data.init_args.root /data/site_0``). A data set that generates every client from one
seed (``SyntheticImages``) generates them all on every node (synthetic data: nothing private); loaders, sizes and
class counts of the other clients are never used.

Messages (see :mod:`fedlit.flower.codec` for how tensors travel):

- ``query``: the client's id, whether it trains, its split sizes, class counts and manifest entry;
- ``train``: :meth:`ClientRuntime.train` (:func:`fedlit.engine.loop.client.train_client` on what the server sent);
  replies the update's shared tensors, extras, metrics, ``num_examples``, the download bytes and the ``problem``
  of a quarantined turn, or ``error`` with what the turn raised;
- ``evaluate``: :func:`fedlit.engine.loop.executor.run_evaluate_task`; replies the client's id, the metrics per split
  and the download bytes.

The server checks every reply before it uses it (:mod:`fedlit.flower.replies`).

This module holds the runtime, the replies and the in-process ClientApp; the node's view of its data is in
:mod:`fedlit.flower.node_data`, the per-round store entries in :mod:`fedlit.flower.snapshots` (both re-exported
here), and the SecAgg+ train messages are answered by :mod:`fedlit.flower.secagg_client`.
"""

from __future__ import annotations

import hashlib
import io
import json
import shlex
import tempfile
import traceback
from collections.abc import Callable, Mapping, MutableMapping
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

import torch
from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp
from torch import Tensor

from fedlit.config import imports
from fedlit.config.build import build_objects
from fedlit.config.parser import load_recipe
from fedlit.core.errors import ConfigError
from fedlit.core.names import check_client_id
from fedlit.engine import speedups
from fedlit.engine.loop import lifecycle
from fedlit.engine.loop.client import ClientTurn, train_client
from fedlit.engine.loop.executor import run_evaluate_task
from fedlit.engine.loop.run import Run
from fedlit.engine.loop.tasks import EvaluateTask
from fedlit.flower import codec
from fedlit.flower.node_data import OwnClientData
from fedlit.flower.secagg_client import client_mods, handle_secure_train, is_secure_train
from fedlit.flower.snapshots import MARKER, FolderTable, Snapshots

#: What this module defines, and the names it re-exports from :mod:`fedlit.flower.node_data` and
#: :mod:`fedlit.flower.snapshots` (their home before the split).
__all__ = [
    "STATE_RECORD",
    "ClientRuntime",
    "FolderTable",
    "OwnClientData",
    "Snapshots",
    "app",
    "encode_turn",
    "answer",
    "error_content",
    "handle_message",
    "node_run",
    "runtime_from_context",
    "snapshots_of",
]

#: The record of ``context.state`` that keeps the client's store entry (when the node has no ``state-dir``).
STATE_RECORD = "fedlit"
_RENAME = "Give the node the id of its site as the data names it, and rename sites whose names are not file names"


class ClientRuntime:
    """One client of the recipe, built in this process: answers the server's messages.

    Args:
        build: Builds the recipe's run (:class:`~fedlit.engine.loop.run.Run`: its objects, not set up).
        client_id: The node's client.
        snapshots: Where its store entry is restored from before a turn or an evaluation and saved to after.
    """

    def __init__(self, build: Callable[[], Run], client_id: str, snapshots: Snapshots | None = None) -> None:
        self.client_id = client_id
        #: Where the client's store entry is kept between messages (None: in this object only).
        self.snapshots = snapshots
        #: The round of the server's last checkpoint, as the last task said.
        self.checkpointed: int | None = None
        run = build()
        run.datamodule = OwnClientData(run.datamodule, client_id)
        # The node's run has one client, which the server selects: no selection, no unseen clients, no quorum here.
        run.settings.clients_per_round, run.settings.unseen_clients = None, None
        run.settings.min_clients = 1
        lifecycle.setup(run)
        # What a simulation's process has run before the first turn (FedRA takes the seed, FedMetaMed the rounds).
        run.hooks.call("on_fit_start", trainer=run.server_context(), pl_module=run.module)
        self.run = run
        #: What the client's turns and evaluations take (built once per runtime, for its one client).
        self.context = run.client_context(client_id)
        # The entry of a client that has not trained: what a message without a snapshot starts from, even when this
        # runtime answered other messages before (the node worker keeps it across a run's messages).
        self._fresh = self.dump_state()

    # ---------------------------------------------------------------------------------------- the store entry
    def load_state(self, blob: bytes | None) -> None:
        """Restore the client's store entry from :meth:`dump_state`'s bytes (None: a client that has not trained)."""
        state = torch.load(io.BytesIO(blob or self._fresh), map_location=self.run.store.device, weights_only=True)
        self.run.store.load_client_state(self.client_id, state)

    def dump_state(self) -> bytes:
        """The client's store entry, as bytes."""
        buffer = io.BytesIO()
        torch.save(self.run.store.client_state(self.client_id), buffer)
        return buffer.getvalue()

    # ------------------------------------------------------------------------------------------- the messages
    def query(self) -> RecordDict:
        """What the server asks every node before round 1."""
        data = cast(OwnClientData, self.run.datamodule)  # a node's run holds its own client's data
        counts = data.class_counts()
        info: dict[str, Any] = {
            "client-id": self.client_id,
            "trains": bool(data.train_client_ids),
            "position": data.position(),
            "num-examples": json.dumps({s: data.num_examples(self.client_id, s) for s in ("train", "val", "test")}),
            "class-counts": json.dumps(None if counts is None else counts[self.client_id]),
            "manifest": json.dumps(data.manifest()),
            "task": str(data.task),
            "num-classes": int(data.num_classes),
        }
        return RecordDict({"query": ConfigRecord(info)})

    def train(
        self, client_id: str, server_round: int, received: Mapping[str, Tensor], received_extras: Mapping[str, Any]
    ) -> ClientTurn:
        """The client's turn on what the server sent (the callable the secure-aggregation path calls too)."""
        self._check(client_id)
        self.run.state.round = server_round
        if self.snapshots is not None:
            self.load_state(self.snapshots.before(server_round))
        turn = train_client(self.context, server_round, dict(received), dict(received_extras))
        if self.snapshots is not None:  # a quarantined turn left the entry as it was: saved all the same
            self.snapshots.save(server_round, self.dump_state(), self.checkpointed)
        return turn

    def handle_train(self, content: RecordDict) -> RecordDict:
        """A ``train`` message: the turn, or ``error`` with what it raised."""
        task: Mapping[str, Any] = content.config_records["task"]  # what the server's train message holds
        server_round = int(task["round"])
        self.checkpointed = int(task["checkpointed"])
        self._take_schedule(content)
        turn = self.train(
            str(task["client-id"]), server_round, codec.get_tree(content, "received"), codec.get_tree(content, "extras")
        )
        return encode_turn(turn)

    def _take_schedule(self, content: RecordDict) -> None:
        """The server's schedule of interval "round" is where the server is: take this round's hyperparameters."""
        schedule = codec.get_tree(content, "schedule")
        if schedule is not None and self.run.lr_schedule is not None:
            for group, values in zip(self.run.lr_schedule.optimizer.param_groups, schedule, strict=True):
                group.update(values)

    def handle_evaluate(self, content: RecordDict) -> RecordDict:
        """An ``evaluate`` message: the metrics of the personalized model (and of the global one if sent)."""
        task: Mapping[str, Any] = content.config_records["task"]  # what the server's evaluate message holds
        client_id, server_round = str(task["client-id"]), int(task["round"])
        self._check(client_id)
        self.run.state.round = server_round
        if self.snapshots is not None:
            self.load_state(self.snapshots.before(server_round, inclusive=True))
        if "schedule.tree" in content.config_records:  # sent with fine-tuning before evaluating (FedAvg-FT)
            self._take_schedule(content)
        evaluate = EvaluateTask(
            client_id,
            codec.get_tree(content, "received"),
            codec.get_tree(content, "global"),
            tuple(json.loads(str(task["splits"]))),
            bool(task["images"]),
            int(task.get("finetune-steps", 0)),
        )
        result = run_evaluate_task(self.context, server_round, evaluate)
        if self.snapshots is not None:  # a strategy may keep what an evaluation computes in client_state
            self.snapshots.save(server_round, self.dump_state(), int(task["checkpointed"]))
        reply = RecordDict(
            {"evaluation": ConfigRecord({"client-id": client_id, "download-bytes": int(result.download_bytes)})}
        )
        codec.put_tree(reply, "metrics", result.metrics)
        codec.put_tree(reply, "image", result.image)
        return reply

    def handle(self, message_type: str, content: RecordDict) -> RecordDict:
        """Answer one message; what a turn or an evaluation raises is answered as ``error`` (and printed here)."""
        if message_type == "query":
            return self.query()
        handler = {"train": self.handle_train, "evaluate": self.handle_evaluate}.get(message_type.split(".")[0])
        if handler is None:
            return error_content(f"unknown message type {message_type!r}")
        try:
            return handler(content)
        except Exception as err:  # noqa: BLE001  (the server decides: federation.on_client_error)
            traceback.print_exc()
            return error_content(f"{type(err).__name__}: {err}")

    def _check(self, client_id: str) -> None:
        if client_id != self.client_id:
            raise ConfigError(
                f"The server sent a task for client {client_id!r} to the node of client "
                f"{self.client_id!r}: two SuperNodes were started with the same node config client-id?"
            )


def encode_turn(turn: ClientTurn) -> RecordDict:
    """A :class:`~fedlit.engine.loop.client.ClientTurn` as a reply's content."""
    update = turn.update
    content = RecordDict(
        {
            "turn": ConfigRecord(
                {
                    "client-id": update.client_id,
                    "num-examples": int(update.num_examples),
                    "download-bytes": int(turn.download_bytes),
                    "problem": json.dumps(turn.problem),
                    "problem-kind": turn.problem_kind,
                }
            )
        }
    )
    codec.put_tree(content, "state", update.state)
    codec.put_tree(content, "update-extras", update.extras)
    codec.put_tree(content, "metrics", update.metrics)
    return content


def error_content(detail: str) -> RecordDict:
    """A reply saying that the client's work raised ``detail``."""
    return RecordDict({"error": ConfigRecord({"detail": detail})})


# ------------------------------------------------------------------------------------------------ the ClientApp
def node_run(run_config: Mapping[str, Any], node_config: Mapping[str, Any], out_dir: Path) -> Run:
    """The node's run, built directly from the run config's recipe and overrides, then the node config's
    ``overrides`` (no command line, no recipe file): the recipe's model, data module (not set up), strategy and
    callbacks, with its settings; one process, no progress bar, no run folder of its own (``out_dir`` is never
    written)."""
    recipe = load_recipe(str(run_config["recipe"]), "the run config's recipe") or {}
    if not isinstance(recipe, Mapping):
        raise ConfigError(
            "The run config's recipe is not a YAML mapping: write the app with `fedlit flower-app --config R.yaml`."
        )
    folder = out_dir.parent / "recipe"  # the recipe's own code, written where its relative imports find it
    overrides = [
        *shlex.split(str(run_config.get("overrides", ""))),
        *shlex.split(str(node_config.get("overrides", ""))),
        *imports.unship(str(run_config.get("imports", "")), folder),
    ]
    objects = build_objects(recipe, overrides, folder=folder, where="the run config's recipe")
    settings = replace(objects.federation, progress_bar=False, devices=1, num_nodes=1, loggers=[])
    return Run(
        objects.model,
        objects.data,
        objects.strategy,
        settings,
        callbacks=objects.callbacks,
        out_dir=out_dir,
        speedups=speedups.BUILT_IN,
    )


def runtime_from_context(context: Context, workdir: Path) -> ClientRuntime:
    """Build the node's client from the run config (the recipe) and the node config (``client-id``); ``workdir``
    is a scratch folder (the client writes no run folder)."""
    node = context.node_config
    if "client-id" not in node:
        raise ConfigError(
            "This SuperNode has no client id: start it with --node-config \"client-id='site_0'\" "
            "(the id of the recipe's client it holds)."
        )
    check_client_id(str(node["client-id"]), "--node-config client-id of this SuperNode", _RENAME)
    return ClientRuntime(lambda: node_run(context.run_config, node, workdir / "run"), str(node["client-id"]))


def snapshots_of(context: Context) -> Snapshots:
    """Where this node keeps its client's snapshots for this run: ``<state-dir>/<run>/<client-id>/`` with the node
    config ``state-dir``, else the record ``fedlit.<run>`` of ``context.state``. ``<run>`` names the server's run
    folder (the run config's ``out-dir``), so a resumed run finds its snapshots and another run starts afresh."""
    out_dir = str(context.run_config.get("out-dir", ""))
    run = hashlib.sha256(out_dir.encode()).hexdigest()[:16] if out_dir else f"run{context.run_id}"
    folder = context.node_config.get("state-dir")
    if folder:
        client_id = str(context.node_config["client-id"])
        check_client_id(client_id, "--node-config client-id of this SuperNode", _RENAME)  # a folder under state-dir
        return Snapshots(FolderTable(Path(str(folder)) / run / client_id, marker=Path(str(folder)) / run / MARKER))
    name = f"{STATE_RECORD}.{run}"
    if name not in context.state.config_records:
        context.state[name] = ConfigRecord()
    return Snapshots(cast("MutableMapping[str, bytes]", context.state.config_records[name]))  # bytes values only


def handle_message(msg: Message, context: Context) -> Message:
    """Build the node's client and answer ``msg`` (restoring and saving its store entry, :class:`Snapshots`)."""
    with tempfile.TemporaryDirectory(prefix="fedlit-client-") as workdir:
        try:
            runtime = runtime_from_context(context, Path(workdir))
            runtime.snapshots = snapshots_of(context)
        except Exception as err:  # noqa: BLE001  (a node that cannot build its client answers why)
            traceback.print_exc()
            return Message(error_content(f"{type(err).__name__}: {err}"), reply_to=msg)
        return answer(runtime, msg, context)


def answer(runtime: ClientRuntime, msg: Message, context: Context) -> Message:
    """``msg`` answered by ``runtime`` (its snapshots set for ``context``); a SecAgg+ turn left out of the masked
    sum raises (:class:`~fedlit.flower.secagg_client.SecureTrainFault`), for Flower to report."""
    if is_secure_train(msg):
        return handle_secure_train(msg, context, runtime.train)
    return Message(runtime.handle(msg.metadata.message_type, msg.content), reply_to=msg)


#: The ClientApp that answers in its own process (what ``fedlit.flower.client:app`` apps of earlier fedlit name;
#: ``fedlit flower-app`` now writes :mod:`fedlit.flower.clientapp`'s, which forwards to the node's worker).
app = ClientApp(mods=client_mods())


@app.query()
def _query(msg: Message, context: Context) -> Message:
    return handle_message(msg, context)


@app.train()
def _train(msg: Message, context: Context) -> Message:
    return handle_message(msg, context)


@app.evaluate()
def _evaluate(msg: Message, context: Context) -> Message:
    return handle_message(msg, context)
