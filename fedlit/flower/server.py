"""The server's side of a Flower deployment: the ordinary fedlit loop with the clients' turns sent as messages.

The ServerApp (:data:`app`) builds the recipe's :class:`~fedlit.federation.Federation` exactly as ``fedlit fit``
does (same parser, seed, model, strategy, callbacks, out_dir, resume), with two changes:

- the data module is a :class:`~fedlit.flower.remote.RemoteData`: the server never builds the clients' data, nor
  constructs the recipe's data module (its section is parsed and validated only,
  :class:`~fedlit.config.build.DataSection`: a constructor that looks for the sites' files never runs here, so the
  server needs no data folder). Before round 1 it sends a ``query`` message to every node and keeps what each
  answers about its client (id, split sizes, class counts, manifest entry, task); that is all the loop asks a data
  module outside a client's turn. It waits until the expected number of nodes has connected (the run config's
  ``client-ids``, else ``num-clients``, else the number of clients the data section's options give, e.g. the length
  of its ``sites``), and stops with the missing clients named after ``connect-timeout`` seconds.
- ``fed.executor`` is a :class:`FlowerExecutor`: each client's turn (or evaluation) is one message to the node
  that holds it, with what the strategy computed on the server (:class:`~fedlit.engine.loop.executor.FitTask`); the
  replies are checked against what the server sent and knows (:mod:`fedlit.flower.replies`) and decoded into
  :class:`~fedlit.engine.loop.client.ClientTurn` and :class:`~fedlit.engine.loop.executor.EvaluateResult`, in task
  order.

Everything else (selection, aggregation, server state, evaluation bookkeeping, history, ``metrics.csv``,
``results.json``, TensorBoard, checkpoints, resume with ``ckpt-path``) is the unchanged loop; communication is
counted from the same tensors as in simulation. A node that answers ``error`` (its turn raised), that Flower
reports as failed (its process died) or that does not answer within the timeout (``federation.client_timeout``
when the federation has it, else the run config's ``client-timeout``), or whose reply fails a check, gives the
error string of its client: with ``federation.on_client_error: skip`` the client is left out of the round with a
warning naming it and ``min_clients`` applies; with ``raise`` the run stops with an error naming the client, the
last checkpoint kept.

Not available in deployment (refused when the run starts, with the reason): ``federation.unseen_clients`` (the
unseen clients are evaluated and fine-tuned on the server, which holds no data); a run folder inside a Flower app
folder, which ``flwr run`` would ship to every node (:mod:`fedlit.flower.bundle`). Every built-in strategy deploys
with the simulation's results (``tests/flower/test_inprocess.py`` checks each one): their client-side hooks use
only what the client receives and keeps.

This module holds the executor, the run config and the ServerApp; how the server reaches the nodes
(:class:`~fedlit.flower.remote.Transport`, :class:`~fedlit.flower.remote.GridTransport`) and what it knows of their
data (:class:`~fedlit.flower.remote.RemoteData`) are in :mod:`fedlit.flower.remote` (re-exported here); the SecAgg+
round is :func:`fedlit.flower.secagg_server.secure_fit`.
"""

from __future__ import annotations

import json
import shlex
import tempfile
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flwr.app import ConfigRecord, Context, RecordDict
from flwr.serverapp import Grid, ServerApp

from fedlit.core.errors import ConfigError, FedlitError
from fedlit.core.tensors import nbytes as state_nbytes
from fedlit.engine.loop.client import ClientTurn
from fedlit.engine.loop.tasks import EvaluateResult, EvaluateTask, FitTask
from fedlit.flower import bundle, codec, replies, secagg
from fedlit.flower.defaults import deployment_argv
from fedlit.flower.registry import NodeRegistry
from fedlit.flower.remote import GridTransport, RemoteData, Transport
from fedlit.flower.secagg_server import secure_fit

if TYPE_CHECKING:
    from fedlit.config.build import DataSection
    from fedlit.engine.loop.run import Run

#: What this module defines, and the names it re-exports from :mod:`fedlit.flower.remote` (their home before the
#: split).
__all__ = [
    "RUN_CONFIG",
    "FlowerExecutor",
    "GridTransport",
    "RemoteData",
    "Transport",
    "app",
    "run_server",
    "server_argv",
]

#: Run config keys of fedlit's Flower app and their defaults (``fedlit flower-app`` writes them).
RUN_CONFIG: dict[str, Any] = {
    "recipe": "",  # the recipe's YAML text
    "overrides": "",  # command-line overrides of the recipe, for the server and every node
    "out-dir": "",  # the server's run folder (absolute)
    "imports": "",  # the recipe's own code: its .py files and --import options (fedlit.config.imports.ship)
    "ckpt-path": "",  # resume: a checkpoint path or "last" (of out-dir)
    "client-ids": "",  # the expected clients, comma-separated (optional; their order is the run's order)
    "num-clients": 0,  # the expected number of nodes when client-ids is empty (0: from the data section)
    "connect-timeout": 600.0,  # seconds to wait for the nodes to connect and answer the query
    "client-timeout": 3600.0,  # seconds a node has for one turn or evaluation (federation.client_timeout wins)
    "secure-aggregation": False,  # SecAgg+ for the training uploads (fedlit.flower.secagg)
    "node-registry": "",  # the operator's file binding node keys to client ids (fedlit.flower.registry); "": none
}


class FlowerExecutor:
    """The clients' turns and evaluations as messages to the nodes that hold them.

    Args:
        transport: How to reach the nodes.
        data: The server's :class:`~fedlit.flower.remote.RemoteData` (which node holds which client).
        timeout: Seconds a node has to answer one turn or evaluation when the federation has no
            ``client_timeout``; None: no limit.
        secure_aggregation: Train with SecAgg+ (:mod:`fedlit.flower.secagg`): ``True`` for the default options, a
            mapping of options or its JSON text, :class:`~fedlit.flower.secagg.SecAggOptions`; None or False: off.
    """

    def __init__(
        self, transport: Transport, data: RemoteData, *, timeout: float | None = 3600.0, secure_aggregation: Any = None
    ) -> None:
        self.transport, self.data, self.timeout = transport, data, timeout
        self.secure_aggregation = secagg.SecAggOptions.from_config(secure_aggregation)
        self.resumed_round = 0

    def setup(self, fed: Run) -> None:
        """Refuse what cannot run where the server holds no data and the clients only what they receive."""
        problems = []
        if fed.settings.unseen_clients:
            problems.append(
                f"federation.unseen_clients={fed.settings.unseen_clients}: unseen clients are evaluated "
                "and fine-tuned on the server, which holds no data in a deployment; leave it null"
            )
        if self.secure_aggregation:
            secagg.check_secure_aggregation(fed.strategy)
            clipped = [type(cb).__name__ for cb in fed.callbacks if type(cb).__name__ == "ClientLevelDP"]
            if clipped:
                problems.append(
                    "secure-aggregation = true with ClientLevelDP: it clips each client's update on the "
                    "server, which SecAgg+ hides (the server sees only the mean); use one of them, or "
                    "SampleLevelDP on the sites"
                )
            options = self.secure_aggregation
            over = {c: n for c in fed.train_client_ids if (n := fed.num_examples(c, "train")) > options.max_weight}
            if over:
                largest = max(over.values())
                problems.append(
                    f"secure-aggregation.max_weight={options.max_weight:g} is below the training examples "
                    f"of {', '.join(f'{c} ({n})' for c, n in over.items())}, which could never upload; "
                    f"set max_weight to at least {largest}, e.g. flwr run APP CONNECTION --run-config "
                    f'\'secure-aggregation="{{\\"max_weight\\": {largest}}}"\''
                )
            if fed.lr_schedule is not None:
                problems.append(
                    "secure-aggregation = true with a learning-rate schedule of interval 'round': the "
                    "SecAgg+ train message carries no schedule, so the nodes would train at the initial "
                    "rate; use a schedule of interval 'step' or no schedule"
                )
        if problems:
            raise ConfigError("Not available in a Flower deployment: " + "; ".join(problems) + ".")
        self.resumed_round = fed.state.round  # 0, or the round of the checkpoint the run resumes

    def _checkpointed(self, fed: Run, server_round: int) -> int:
        """The round of the newest ``last.ckpt`` a resume could start from while ``server_round`` runs (the nodes
        keep their client's state from it on)."""
        saved = [r for r in range(1, server_round) if r % fed.settings.checkpoint_every == 0]
        return max([self.resumed_round, *saved])

    def _timeout(self, fed: Run) -> float | None:
        return float(fed.settings.client_timeout) if fed.settings.client_timeout is not None else self.timeout

    def fit(self, fed: Run, server_round: int, tasks: list[FitTask]) -> list[ClientTurn | str]:
        """Each task's turn on its node, in task order (an error string for a node that failed or timed out)."""
        if self.secure_aggregation:
            grid = getattr(self.transport, "grid", None)
            if grid is None:
                raise ConfigError("secure-aggregation = true needs Flower's grid: it runs on a SuperLink only.")
            turns = secure_fit(grid, fed, server_round, tasks, self.data.nodes, self.secure_aggregation)
            return self._secure_turns(fed, server_round, tasks, turns)
        schedule = _schedule(fed)
        messages = []
        for task in tasks:
            content = RecordDict(
                {
                    "task": ConfigRecord(
                        {
                            "client-id": task.client_id,
                            "round": server_round,
                            "checkpointed": self._checkpointed(fed, server_round),
                        }
                    )
                }
            )
            codec.put_tree(content, "received", task.received)
            codec.put_tree(content, "extras", task.received_extras)
            codec.put_tree(content, "schedule", schedule)
            messages.append((self.data.nodes[task.client_id], "train", content))
        answers = self.transport.exchange(messages, str(server_round), self._timeout(fed))
        return [self._turn(fed, server_round, task, reply) for task, reply in zip(tasks, answers, strict=True)]

    def _turn(self, fed: Run, server_round: int, task: FitTask, reply: RecordDict | str) -> ClientTurn | str:
        """The reply's turn, checked (:mod:`fedlit.flower.replies`); a failed or refused reply goes to
        :meth:`_failed`."""
        if isinstance(reply, str) or "error" in reply.config_records:
            return self._failed(fed, server_round, task.client_id, _error(reply))
        turn = replies.train_reply(
            reply,
            task,
            expected=fed.strategy.expected_upload_names(server_round, task.client_id, task.received),
            train_size=self.data.num_examples(task.client_id, "train"),
            download_bytes=state_nbytes(task.received) + state_nbytes(task.received_extras),
        )
        if isinstance(turn, str):
            return self._failed(fed, server_round, task.client_id, turn)
        turn.update.state = {n: t.to(fed.store.device) for n, t in turn.update.state.items()}
        return turn

    def _secure_turns(
        self, fed: Run, server_round: int, tasks: list[FitTask], turns: list[ClientTurn | str]
    ) -> list[ClientTurn | str]:
        """The SecAgg+ turns, checked as far as the protocol lets the server see (:mod:`fedlit.flower.replies`):
        ``state`` is the round's mean (its names, shapes, dtypes and finiteness: a bad mean fails every client),
        ``num_examples`` and ``metrics`` are each client's; the client id is the task's by construction (the reply
        comes from the client's node). A refused client's upload is already in the mean, which cannot be taken
        apart: every client whose update is that mean is left out with it (the refused ones first, so ``raise``
        names one of them)."""
        reasons: dict[int, str] = {}
        for i, (task, turn) in enumerate(zip(tasks, turns, strict=True)):
            if isinstance(turn, str):
                reasons[i] = turn
                continue
            # A quarantined turn uploads nothing through SecAgg+: its state is empty.
            expected = (
                []
                if turn.problem is not None
                else fed.strategy.expected_upload_names(server_round, task.client_id, task.received)
            )
            why = replies.update_problem(
                turn.update,
                turn.problem,
                task,
                expected=expected,
                train_size=self.data.num_examples(task.client_id, "train"),
            )
            if why is not None:
                reasons[i] = why
        in_mean = [i for i, t in enumerate(turns) if isinstance(t, ClientTurn) and t.problem is None]
        tainted = [tasks[i].client_id for i in in_mean if i in reasons]
        out = list(turns)
        for i, why in reasons.items():
            out[i] = self._failed(fed, server_round, tasks[i].client_id, why)
        for i in in_mean if tainted else []:
            if i not in reasons:
                out[i] = self._failed(
                    fed,
                    server_round,
                    tasks[i].client_id,
                    f"its update is the SecAgg+ mean of the round, which holds the refused upload "
                    f"of client {tainted[0]!r}",
                )
        return out

    def _failed(self, fed: Run, server_round: int, client_id: str, detail: str, what: str = "turn") -> str:
        node = self.data.nodes.get(client_id)
        if fed.settings.on_client_error == "raise":
            raise FedlitError(
                f"Round {server_round}: the {what} of client {client_id!r} (Flower node {node}) "
                f"failed: {detail.rstrip('.')}. Set federation.on_client_error: skip to leave such a "
                "client out of the round."
            )
        warnings.warn(
            f"Round {server_round}: client {client_id!r} (Flower node {node}) failed: {detail}; it is left "
            f"out of this round's {what}s (federation.on_client_error=skip).",
            stacklevel=3,
        )
        return detail

    def evaluate(self, fed: Run, server_round: int, tasks: list[EvaluateTask]) -> list[EvaluateResult]:
        """Each task's metrics from its node, in task order (no metrics for a node that failed, with ``skip``)."""
        messages = []
        for task in tasks:
            content = RecordDict(
                {
                    "task": ConfigRecord(
                        {
                            "client-id": task.client_id,
                            "round": server_round,
                            "checkpointed": self._checkpointed(fed, server_round),
                            "splits": json.dumps(list(task.splits)),
                            "images": task.images,
                            "finetune-steps": task.finetune_steps,
                        }
                    )
                }
            )
            codec.put_tree(content, "received", task.received)
            codec.put_tree(content, "global", task.global_state)
            # the steps of fine-tuning before evaluating take this round's learning rate
            codec.put_tree(content, "schedule", _schedule(fed) if task.finetune_steps else None)
            messages.append((self.data.nodes[task.client_id], "evaluate", content))
        answers = self.transport.exchange(messages, f"{server_round}-evaluate", self._timeout(fed))
        results = []
        for task, reply in zip(tasks, answers, strict=True):
            result = (
                _error(reply)
                if isinstance(reply, str) or "error" in reply.config_records
                else (
                    replies.evaluate_reply(
                        reply, task, sent_bytes=state_nbytes(task.received) + state_nbytes(task.global_state)
                    )
                )
            )
            if isinstance(result, str):
                self._failed(fed, server_round, task.client_id, result, "evaluation")
                result = EvaluateResult({}, 0)
            results.append(result)
        return results

    def teardown(self, fed: Run) -> None:
        """Nothing to release: the nodes keep running for the next run."""


def _schedule(fed: Run) -> list[dict[str, Any]] | None:
    """The hyperparameters of the run's schedule of interval ``round`` as they are now (None without one)."""
    if fed.lr_schedule is None:
        return None
    return [{k: v for k, v in g.items() if k != "params"} for g in fed.lr_schedule.optimizer.param_groups]


def _error(reply: RecordDict | str) -> str:
    """What a failed node's reply says (a transport's description, or the node's ``error`` record)."""
    if isinstance(reply, str):
        return reply
    return str(reply.config_records["error"].get("detail", "an error reply without detail"))


# ------------------------------------------------------------------------------------------------ the ServerApp
def server_argv(run_config: Mapping[str, Any], recipe_file: Path) -> list[str]:
    """The ``fedlit fit`` command line of the server: a deployment's defaults (:mod:`fedlit.flower.defaults`), the
    recipe, the run's overrides, ``out-dir``, ``ckpt-path``."""
    overrides = shlex.split(str(run_config.get("overrides", "")))
    argv = ["fit", *deployment_argv(), "--config", str(recipe_file), *overrides]  # the recipe wins over the defaults
    if run_config.get("out-dir"):
        argv += ["--out_dir", str(run_config["out-dir"])]
    if run_config.get("ckpt-path"):
        argv += ["--ckpt_path", str(run_config["ckpt-path"])]
    return argv


def run_server(transport: Transport, run_config: Mapping[str, Any]) -> dict[str, Any]:
    """Build the recipe's federation on the server (no client data) and fit it through ``transport``."""
    from fedlit.config import imports
    from fedlit.config.build import build_run, remove_if_empty
    from fedlit.config.parser import load, recipe_parser
    from fedlit.config.resolve import resolve_run, run_root

    config = {**RUN_CONFIG, **run_config}
    if not str(config["recipe"]).strip():
        raise ConfigError("The run config has no recipe: write the app with `fedlit flower-app --config R.yaml`.")
    ids = [c.strip() for c in str(config["client-ids"]).split(",") if c.strip()]
    holder: dict[str, RemoteData] = {}
    registry = NodeRegistry.load(str(config["node-registry"])) if str(config["node-registry"]) else None

    def remote(recipe_data: DataSection) -> RemoteData:
        holder["data"] = RemoteData(
            recipe_data,
            transport,
            client_ids=ids,
            num_clients=int(config["num-clients"]),
            connect_timeout=float(config["connect-timeout"]),
            registry=registry,
        )
        return holder["data"]

    with tempfile.TemporaryDirectory(prefix="fedlit-server-") as folder:
        recipe = Path(folder) / "recipe.yaml"
        recipe.write_text(str(config["recipe"]))
        code = imports.unship(str(config["imports"]), Path(folder))  # beside the recipe: its imports find them
        loaded = load([*server_argv(config, recipe), *code], recipe_parser("fit", "The server's run."))
        out_dir, ckpt_path = resolve_run(loaded.options, "fit")
        bundle.check_out_dir(out_dir or run_root(loaded.options), "The server's run folder (out-dir)")
        built = build_run(loaded, out_dir, ckpt_path, wrap_data=remote)
    timeout = float(config["client-timeout"])
    built.federation.executor = FlowerExecutor(
        transport,
        holder["data"],
        timeout=timeout if timeout > 0 else None,
        secure_aggregation=config["secure-aggregation"],
    )
    try:
        return built.federation.fit(ckpt_path=built.ckpt_path)
    finally:
        remove_if_empty(built.created)


#: The ServerApp of fedlit's Flower app (``[tool.flwr.app.components] serverapp = "fedlit.flower.server:app"``).
app = ServerApp()


@app.main()
def _main(grid: Grid, context: Context) -> None:
    run_server(GridTransport(grid), context.run_config)
