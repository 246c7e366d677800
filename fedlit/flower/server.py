"""The server's side of a Flower deployment: the ordinary fedlit loop with the clients' turns sent as messages.

The ServerApp (:data:`app`) builds the recipe's :class:`~fedlit.federation.Federation` exactly as ``fedlit fit``
does (same parser, seed, model, strategy, callbacks, out_dir, resume), with two changes:

- the data module is a :class:`RemoteData`: the server never builds the clients' data. Before round 1 it sends a
  ``query`` message to every node and keeps what each answers about its client (id, split sizes, class counts,
  manifest entry, task); that is all the loop asks a data module outside a client's turn. It waits until the
  expected number of nodes has connected (the run config's ``client-ids``, else ``num-clients``, else the
  recipe's data section's ``expected_num_clients()``), and stops with the missing clients named after
  ``connect-timeout`` seconds.
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
"""

from __future__ import annotations

import json
import shlex
import tempfile
import time
import warnings
from collections.abc import Mapping
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, Protocol

from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.serverapp import Grid, ServerApp

from fedlit.core.errors import ConfigError, DataError, FedlitError
from fedlit.engine.client import ClientTurn
from fedlit.engine.tasks import EvaluateResult, EvaluateTask, FitTask
from fedlit.flower import codec, secagg
from fedlit.flower.secagg_server import secure_fit
from fedlit.strategies.base import ClientUpdate

if TYPE_CHECKING:
    from fedlit.engine.run import Run

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


class Transport(Protocol):
    """How the server reaches the nodes (Flower's Grid, or an in-process stand-in for tests)."""

    def node_ids(self) -> list[int]:
        """The nodes connected now."""

    def exchange(self, messages: list[tuple[int, str, RecordDict]], group: str,
                 timeout: float | None) -> list[RecordDict | str]:
        """Send each ``(node, message type, content)`` and return each reply's content in the same order, or a
        description of why there is none (the node failed, or did not answer within ``timeout`` seconds)."""


class GridTransport:
    """:class:`Transport` over a Flower :class:`~flwr.serverapp.Grid`.

    Args:
        grid: The ServerApp's grid.
    """

    def __init__(self, grid: Grid) -> None:
        self.grid = grid

    def node_ids(self) -> list[int]:
        """The nodes connected to the SuperLink."""
        return list(self.grid.get_node_ids())

    def exchange(self, messages: list[tuple[int, str, RecordDict]], group: str,
                 timeout: float | None) -> list[RecordDict | str]:
        """One message per node, replies matched by node (the loop never sends a node two messages at once)."""
        sent = [Message(content, node, message_type, group_id=group) for node, message_type, content in messages]
        replies = {reply.metadata.src_node_id: reply for reply in self.grid.send_and_receive(sent, timeout=timeout)}
        out: list[RecordDict | str] = []
        for node, _, _ in messages:
            reply = replies.get(node)
            if reply is None:
                out.append(f"no reply from node {node} within {timeout} s (timed out, or the node is gone)")
            elif reply.has_error():
                out.append(f"node {node} failed: {reply.error.reason}")
            else:
                out.append(reply.content)
        return out


class RemoteData:
    """What the server knows of the clients' data: the nodes' answers to the ``query`` message.

    Args:
        recipe_data: The recipe's data module, built but never set up (only ``expected_num_clients()`` is read).
        transport: How to reach the nodes.
        client_ids: The expected clients, in the run's order; empty: any ``num_clients`` clients, ordered as the
            data set orders them.
        num_clients: The expected number of clients when ``client_ids`` is empty (0: the recipe's data section).
        connect_timeout: Seconds to wait for the nodes.
    """

    def __init__(self, recipe_data: Any, transport: Transport, *, client_ids: list[str] | None = None,
                 num_clients: int = 0, connect_timeout: float = 600.0) -> None:
        self.recipe_data, self.transport = recipe_data, transport
        self.expected_ids = list(client_ids or [])
        self.expected = len(self.expected_ids) or num_clients or recipe_data.expected_num_clients()
        if not self.expected:
            raise ConfigError(f"{type(recipe_data).__name__} cannot tell its number of clients before it is built: "
                              "give the run config client-ids (comma-separated) or num-clients.")
        self.connect_timeout = connect_timeout
        self.nodes: dict[str, int] = {}
        self.info: dict[str, dict[str, Any]] = {}

    def setup(self) -> None:
        """Wait for the nodes, ask each one about its client (only the first call does work)."""
        if self.info:
            return
        deadline = time.monotonic() + self.connect_timeout
        answers: dict[int, dict[str, Any]] = {}
        problems: dict[int, str] = {}
        while True:
            new = [n for n in self.transport.node_ids() if n not in answers]
            if new:
                replies = self.transport.exchange([(n, "query", RecordDict()) for n in new], "query",
                                                  max(1.0, deadline - time.monotonic()))
                for node, reply in zip(new, replies, strict=True):
                    if isinstance(reply, str) or "error" in reply.config_records:
                        problems[node] = reply if isinstance(reply, str) else str(reply["error"]["detail"])
                    else:
                        answers[node] = dict(reply.config_records["query"])
                        problems.pop(node, None)
            found = {str(a["client-id"]) for a in answers.values()}
            done = set(self.expected_ids) <= found if self.expected_ids else len(found) >= self.expected
            if done or time.monotonic() > deadline:
                break
            time.sleep(1.0)
        self._keep(answers, problems, done)

    def _keep(self, answers: dict[int, dict[str, Any]], problems: dict[int, str], done: bool) -> None:
        by_client: dict[str, list[int]] = {}
        for node, answer in answers.items():
            by_client.setdefault(str(answer["client-id"]), []).append(node)
        twice = {c: n for c, n in by_client.items() if len(n) > 1}
        if twice:
            raise ConfigError(f"Several SuperNodes hold the same client: {twice}. Give each node its own "
                              "--node-config client-id.")
        if not done:
            missing = ([c for c in self.expected_ids if c not in by_client] if self.expected_ids
                       else f"{self.expected - len(by_client)} more")
            failed = "".join(f"; node {n}: {p}" for n, p in problems.items())
            raise DataError(f"After {self.connect_timeout:g} s (run config connect-timeout) {len(by_client)} of "
                            f"{self.expected} clients answered: {sorted(by_client)}; missing: {missing}{failed}. "
                            "Start a SuperNode for each missing client (--node-config \"client-id='...'\").")
        order = self.expected_ids or sorted(by_client, key=lambda c: (int(answers[by_client[c][0]]["position"]), c))
        if not self.expected_ids and len(order) > self.expected:
            warnings.warn(f"{len(order)} nodes answered, {self.expected} expected: the federation has them all "
                          f"({order}).", stacklevel=2)
        self.nodes = {c: by_client[c][0] for c in order}
        self.info = {c: answers[self.nodes[c]] for c in order}

    # ------------------------------------------------------------------------------- the data module's answers
    def _first(self) -> dict[str, Any]:
        if not self.info:
            self.setup()
        return next(iter(self.info.values()))

    @property
    def task(self) -> str:
        """The data set's task (as the nodes report it)."""
        return str(self._first()["task"])

    @property
    def num_classes(self) -> int:
        """The data set's number of classes."""
        return int(self._first()["num-classes"])

    @property
    def client_ids(self) -> list[str]:
        """Every client, in the run's order."""
        self._first()
        return list(self.info)

    @property
    def evaluation_only(self) -> frozenset[str]:
        """Clients whose node says they never train."""
        return frozenset(c for c, i in self.info.items() if not i["trains"])

    @property
    def train_client_ids(self) -> list[str]:
        """The clients that train."""
        return [c for c in self.client_ids if c not in self.evaluation_only]

    def expected_num_clients(self) -> int:
        """The number of clients the server waits for."""
        return self.expected

    def num_examples(self, client_id: str, split: str) -> int:
        """Samples of ``client_id`` in ``split``, as its node reported."""
        self._first()
        return int(json.loads(str(self.info[client_id]["num-examples"]))[split])

    def class_counts(self) -> dict[str, dict[str, list[int]]] | None:
        """Each client's samples per class and split, as its node reported (None for a task without classes)."""
        counts = {c: json.loads(str(i["class-counts"])) for c, i in self.info.items()}
        return None if any(v is None for v in counts.values()) else counts

    def manifest(self) -> dict[str, Any]:
        """The data set's manifest: the first node's description, each client's entry from its own node."""
        manifest = dict(json.loads(str(self._first()["manifest"])))
        manifest["clients"] = {c: json.loads(str(i["manifest"]))["clients"][c] for c, i in self.info.items()}
        return manifest

    @property
    def data(self) -> Any:
        """The manifest's description (``name``, ``partitioner``...), as the run's hyperparameters read it."""
        manifest = self.manifest()
        return SimpleNamespace(name=manifest.get("dataset"), partitioner=manifest.get("partitioner"),
                               task=self.task, num_classes=self.num_classes)

    def _no_data(self, *args: Any) -> Any:
        raise DataError("The server of a Flower deployment holds no client data: this needs a client's samples on "
                        "the server (federation.unseen_clients, or a callback or strategy hook that reads data on "
                        "the server).")

    train_dataloader = val_dataloader = test_dataloader = _no_data


class FlowerExecutor:
    """The clients' turns and evaluations as messages to the nodes that hold them.

    Args:
        transport: How to reach the nodes.
        data: The server's :class:`RemoteData` (which node holds which client).
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
