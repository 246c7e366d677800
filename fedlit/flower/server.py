"""The server's side of a Flower deployment: the ordinary fedlit loop with the clients' turns sent as messages.

The ServerApp (:data:`app`) builds the recipe's :class:`~fedlit.federation.Federation` exactly as ``fedlit fit``
does (same parser, seed, model, strategy, callbacks, out_dir, resume), with two changes:

- the data module is a :class:`~fedlit.flower.remote.RemoteData`: the server never builds the clients' data.
  Before round 1 it sends a ``query`` message to every node and keeps what each answers about its client (id,
  split sizes, class counts, manifest entry, task); that is all the loop asks a data module outside a client's
  turn. It waits until the expected number of nodes has connected (the run config's ``client-ids``, else
  ``num-clients``, else the recipe's data section's ``expected_num_clients()``), and stops with the missing clients
  named after ``connect-timeout`` seconds.
- ``fed.executor`` is a :class:`FlowerExecutor`: each client's turn (or evaluation) is one message to the node
  that holds it, with what the strategy computed on the server (:class:`~fedlit.engine.executor.FitTask`); the
  replies are decoded into :class:`~fedlit.engine.client.ClientTurn` and
  :class:`~fedlit.engine.executor.EvaluateResult`, in task order.

Everything else (selection, aggregation, server state, evaluation bookkeeping, history, ``metrics.csv``,
``results.json``, TensorBoard, checkpoints, resume with ``ckpt-path``) is the unchanged loop; communication is
counted from the same tensors as in simulation. A node that answers ``error`` (its turn raised), that Flower
reports as failed (its process died) or that does not answer within the timeout (``federation.client_timeout``
when the federation has it, else the run config's ``client-timeout``) gives the error string of its client: with
``federation.on_client_error: skip`` the client is left out of the round with a warning naming it and
``min_clients`` applies; with ``raise`` the run stops with an error naming the client, the last checkpoint kept.

Not available in deployment (refused when the run starts, with the reason): ``federation.unseen_clients`` (the
unseen clients are evaluated and fine-tuned on the server, which holds no data). Every built-in strategy deploys
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
from fedlit.engine.client import ClientTurn
from fedlit.engine.tasks import EvaluateResult, EvaluateTask, FitTask
from fedlit.flower import codec, secagg
from fedlit.flower.remote import GridTransport, RemoteData, Transport
from fedlit.flower.secagg_server import secure_fit
from fedlit.strategies.base import ClientUpdate

if TYPE_CHECKING:
    from fedlit.engine.run import Run

#: What this module defines, and the names it re-exports from :mod:`fedlit.flower.remote` (their home before the
#: split).
__all__ = ["RUN_CONFIG", "FlowerExecutor", "GridTransport", "RemoteData", "Transport", "app", "run_server",
           "server_argv"]

#: Run config keys of fedlit's Flower app and their defaults (``fedlit flower-app`` writes them).
RUN_CONFIG: dict[str, Any] = {
    "recipe": "",             # the recipe's YAML text
    "overrides": "",          # command-line overrides of the recipe, for the server and every node
    "out-dir": "",            # the server's run folder (absolute)
    "ckpt-path": "",          # resume: a checkpoint path or "last" (of out-dir)
    "client-ids": "",         # the expected clients, comma-separated (optional; their order is the run's order)
    "num-clients": 0,         # the expected number of nodes when client-ids is empty (0: from the data section)
    "connect-timeout": 600.0,  # seconds to wait for the nodes to connect and answer the query
    "client-timeout": 3600.0,  # seconds a node has for one turn or evaluation (federation.client_timeout wins)
    "secure-aggregation": False,  # SecAgg+ for the training uploads (fedlit.flower.secagg)
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

    def __init__(self, transport: Transport, data: RemoteData, *, timeout: float | None = 3600.0,
                 secure_aggregation: Any = None) -> None:
        self.transport, self.data, self.timeout = transport, data, timeout
        self.secure_aggregation = secagg.SecAggOptions.from_config(secure_aggregation)
        self.resumed_round = 0

    def setup(self, fed: Run) -> None:
        """Refuse what cannot run where the server holds no data and the clients only what they receive."""
        problems = []
        if fed.unseen_clients:
            problems.append(f"federation.unseen_clients={fed.unseen_clients}: unseen clients are evaluated and "
                            "fine-tuned on the server, which holds no data in a deployment; leave it null")
        if self.secure_aggregation:
            secagg.check_secure_aggregation(fed.strategy)
            clipped = [type(cb).__name__ for cb in fed.callbacks if type(cb).__name__ == "ClientLevelDP"]
            if clipped:
                problems.append("secure-aggregation = true with ClientLevelDP: it clips each client's update on the "
                                "server, which SecAgg+ hides (the server sees only the mean); use one of them, or "
                                "SampleLevelDP on the sites")
            if fed.lr_schedule is not None:
                problems.append("secure-aggregation = true with a learning-rate schedule of interval 'round': the "
                                "SecAgg+ train message carries no schedule, so the nodes would train at the initial "
                                "rate; use a schedule of interval 'step' or no schedule")
        if problems:
            raise ConfigError("Not available in a Flower deployment: " + "; ".join(problems) + ".")
        self.resumed_round = fed.server_round  # 0, or the round of the checkpoint the run resumes

    def _checkpointed(self, fed: Run, server_round: int) -> int:
        """The round of the newest ``last.ckpt`` a resume could start from while ``server_round`` runs (the nodes
        keep their client's state from it on)."""
        saved = [r for r in range(1, server_round) if r % fed.checkpoint_every == 0]
        return max([self.resumed_round, *saved])

    def _timeout(self, fed: Run) -> float | None:
        return float(fed.client_timeout) if fed.client_timeout is not None else self.timeout

    def fit(self, fed: Run, server_round: int, tasks: list[FitTask]) -> list[ClientTurn | str]:
        """Each task's turn on its node, in task order (an error string for a node that failed or timed out)."""
        if self.secure_aggregation:
            grid = getattr(self.transport, "grid", None)
            if grid is None:
                raise ConfigError("secure-aggregation = true needs Flower's grid: it runs on a SuperLink only.")
            turns = secure_fit(grid, fed, server_round, tasks, self.data.nodes, self.secure_aggregation)
            return [self._failed(fed, server_round, t.client_id, r) if isinstance(r, str) else r
                    for t, r in zip(tasks, turns, strict=True)]
        schedule = None if fed.lr_schedule is None else [
            {k: v for k, v in g.items() if k != "params"} for g in fed.lr_schedule.optimizer.param_groups]
        messages = []
        for task in tasks:
            content = RecordDict({"task": ConfigRecord({"client-id": task.client_id, "round": server_round,
                                                        "checkpointed": self._checkpointed(fed, server_round)})})
            codec.put_tree(content, "received", task.received)
            codec.put_tree(content, "extras", task.received_extras)
            codec.put_tree(content, "schedule", schedule)
            messages.append((self.data.nodes[task.client_id], "train", content))
        replies = self.transport.exchange(messages, str(server_round), self._timeout(fed))
        return [self._turn(fed, server_round, task.client_id, reply)
                for task, reply in zip(tasks, replies, strict=True)]

    def _turn(self, fed: Run, server_round: int, client_id: str, reply: RecordDict | str) -> ClientTurn | str:
        if isinstance(reply, str) or "error" in reply.config_records:
            return self._failed(fed, server_round, client_id,
                                reply if isinstance(reply, str) else str(reply["error"]["detail"]))
        turn = reply.config_records["turn"]
        update = ClientUpdate(client_id=str(turn["client-id"]), num_examples=int(turn["num-examples"]),
                              state=codec.get_tree(reply, "state"), metrics=codec.get_tree(reply, "metrics"),
                              extras=codec.get_tree(reply, "update-extras"))
        update.state = {n: t.to(fed.store.device) for n, t in update.state.items()}
        return ClientTurn(update, int(turn["download-bytes"]), json.loads(str(turn["problem"])))

    def _failed(self, fed: Run, server_round: int, client_id: str, detail: str, what: str = "turn") -> str:
        node = self.data.nodes.get(client_id)
        if fed.on_client_error == "raise":
            raise FedlitError(f"Round {server_round}: the {what} of client {client_id!r} (Flower node {node}) "
                              f"failed: {detail.rstrip('.')}. Set federation.on_client_error: skip to leave such a "
                              "client out of the round.")
        warnings.warn(f"Round {server_round}: client {client_id!r} (Flower node {node}) failed: {detail}; it is left "
                      f"out of this round's {what}s (federation.on_client_error=skip).", stacklevel=3)
        return detail

    def evaluate(self, fed: Run, server_round: int, tasks: list[EvaluateTask]) -> list[EvaluateResult]:
        """Each task's metrics from its node, in task order (no metrics for a node that failed, with ``skip``)."""
        messages = []
        for task in tasks:
            content = RecordDict({"task": ConfigRecord({"client-id": task.client_id, "round": server_round,
                                                        "checkpointed": self._checkpointed(fed, server_round),
                                                        "splits": json.dumps(list(task.splits)),
                                                        "images": task.images})})
            codec.put_tree(content, "received", task.received)
            codec.put_tree(content, "global", task.global_state)
            messages.append((self.data.nodes[task.client_id], "evaluate", content))
        replies = self.transport.exchange(messages, f"{server_round}-evaluate", self._timeout(fed))
        results = []
        for task, reply in zip(tasks, replies, strict=True):
            if isinstance(reply, str) or "error" in reply.config_records:
                self._failed(fed, server_round, task.client_id,
                             reply if isinstance(reply, str) else str(reply["error"]["detail"]), "evaluation")
                results.append(EvaluateResult({}, 0))
                continue
            results.append(EvaluateResult(codec.get_tree(reply, "metrics"),
                                          int(reply["evaluation"]["download-bytes"]), codec.get_tree(reply, "image")))
        return results

    def teardown(self, fed: Run) -> None:
        """Nothing to release: the nodes keep running for the next run."""


# ------------------------------------------------------------------------------------------------ the ServerApp
def server_argv(run_config: Mapping[str, Any], recipe_file: Path) -> list[str]:
    """The ``fedlit fit`` command line of the server: the recipe, the run's overrides, ``out-dir``, ``ckpt-path``."""
    argv = ["fit", "--config", str(recipe_file), *shlex.split(str(run_config.get("overrides", "")))]
    if run_config.get("out-dir"):
        argv += ["--out_dir", str(run_config["out-dir"])]
    if run_config.get("ckpt-path"):
        argv += ["--ckpt_path", str(run_config["ckpt-path"])]
    return argv


def run_server(transport: Transport, run_config: Mapping[str, Any]) -> dict[str, Any]:
    """Build the recipe's federation on the server (no client data) and fit it through ``transport``."""
    from fedlit.config.build import build_run, remove_if_empty
    from fedlit.config.parser import parse, recipe_parser, root_parser

    config = {**RUN_CONFIG, **run_config}
    if not str(config["recipe"]).strip():
        raise ConfigError("The run config has no recipe: write the app with `fedlit flower-app --config R.yaml`.")
    ids = [c.strip() for c in str(config["client-ids"]).split(",") if c.strip()]
    holder: dict[str, RemoteData] = {}

    def remote(recipe_data: Any) -> RemoteData:
        holder["data"] = RemoteData(recipe_data, transport, client_ids=ids, num_clients=int(config["num-clients"]),
                                    connect_timeout=float(config["connect-timeout"]))
        return holder["data"]

    with tempfile.TemporaryDirectory(prefix="fedlit-server-") as folder:
        recipe = Path(folder) / "recipe.yaml"
        recipe.write_text(str(config["recipe"]))
        root = root_parser({"fit": ("The server's run.", recipe_parser("fit", "The server's run."))})
        built = build_run(root, parse(root, server_argv(config, recipe)), "fit", wrap_data=remote)
    timeout = float(config["client-timeout"])
    built.federation.executor = FlowerExecutor(transport, holder["data"], timeout=timeout if timeout > 0 else None,
                                               secure_aggregation=config["secure-aggregation"])
    try:
        return built.federation.fit(ckpt_path=built.ckpt_path)
    finally:
        remove_if_empty(built.created)


#: The ServerApp of fedlit's Flower app (``[tool.flwr.app.components] serverapp = "fedlit.flower.server:app"``).
app = ServerApp()


@app.main()
def _main(grid: Grid, context: Context) -> None:
    run_server(GridTransport(grid), context.run_config)
