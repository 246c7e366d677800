"""SecAgg+ for fedlit: which strategies may use it, and one round of Flower's real protocol (server workflow, client
mod, key agreement, Shamir shares, masks) over an in-process grid that carries every message in Flower's wire
format to a ClientApp per node. Expected means are worked out by hand."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any
from uuid import uuid4

import pytest
import torch

flwr = pytest.importorskip("flwr")

from flwr.app import Context, Error, Message, RecordDict  # noqa: E402
from flwr.clientapp import ClientApp  # noqa: E402
from flwr.common import bytes_to_ndarray  # noqa: E402
from flwr.common.constant import ErrorCode  # noqa: E402
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS, Key, Stage  # noqa: E402
from flwr.common.serde import message_from_proto, message_to_proto  # noqa: E402
from flwr.serverapp.grid import Grid  # noqa: E402
from flwr.supercore.task_identity import TaskIdentity  # noqa: E402

from fedlit.core.errors import ConfigError, DataError, FedlitError  # noqa: E402
from fedlit.engine.loop.client import ClientTurn, train_client  # noqa: E402
from fedlit.engine.loop.executor import LocalExecutor  # noqa: E402
from fedlit.engine.loop.tasks import FitTask  # noqa: E402
from fedlit.flower.secagg import SecAggOptions, check_secure_aggregation  # noqa: E402
from fedlit.flower.secagg_client import client_mods, handle_secure_train, is_secure_train  # noqa: E402
from fedlit.flower.secagg_server import secure_fit  # noqa: E402
from fedlit.strategies import (  # noqa: E402
    APFL,
    SCAFFOLD,
    FedAdam,
    FedALA,
    FedAvg,
    FedBN,
    FedMedian,
    FedProx,
    FedSCA,
    Krum,
    SiloBN,
)
from fedlit.strategies.base import ClientUpdate  # noqa: E402
from tests.conftest import make_federation  # noqa: E402


@pytest.fixture(autouse=True)
def _server_task(monkeypatch: pytest.MonkeyPatch) -> None:
    """What Flower's runtime sets in a ServerApp process (the server's messages carry it)."""
    for name, value in (("_run_id", 1), ("_node_id", 0), ("_task_id", 0)):
        monkeypatch.setattr(TaskIdentity, name, value)


def _wire(msg: Message) -> Message:
    """``msg`` as the other side receives it (serialized and parsed: no object is shared across the 'network')."""
    return message_from_proto(message_to_proto(msg))


class InProcessGrid(Grid):
    """Delivers each message to ``app`` with the Context of its node, as a SuperNode would, one after the other.

    ``silent``: node -> stage at which the node stops answering (as a dropped connection). Every reply whose
    content holds masked parameters is kept in ``masked`` (node -> reply) for inspection."""

    def __init__(self, app: ClientApp, nodes: list[int], silent: dict[int, str] | None = None) -> None:
        self.app = app
        self.contexts = {
            n: Context(run_id=1, node_id=n, node_config={}, state=RecordDict(), run_config={}) for n in nodes
        }
        self.silent = silent or {}
        self.masked: dict[int, Message] = {}

    def set_run(self, run: Any) -> None:
        pass

    @property
    def run(self) -> Any:
        return SimpleNamespace(run_id=1)

    def create_message(
        self, content: RecordDict, message_type: str, dst_node_id: int, group_id: str, ttl: float | None = None
    ) -> Message:
        return Message(content, dst_node_id, message_type, group_id=group_id)

    def get_node_ids(self) -> list[int]:
        return list(self.contexts)

    def push_messages(self, messages: Any) -> Any:
        raise AssertionError("the workflow only uses send_and_receive")

    def pull_messages(self, message_ids: Any) -> Any:
        raise AssertionError("the workflow only uses send_and_receive")

    def send_and_receive(self, messages: Any, *, timeout: float | None = None) -> list[Message]:
        replies = []
        for msg in messages:
            msg.metadata.__dict__["_message_id"] = str(uuid4())  # as Flower's grids do when they push a message
            node = msg.metadata.dst_node_id
            stage = msg.content.config_records[RECORD_KEY_CONFIGS][Key.STAGE]
            if node in self.silent and Stage.all().index(stage) >= Stage.all().index(self.silent[node]):
                continue
            msg = _wire(msg)
            try:
                reply = self.app(msg, self.contexts[node])
            except Exception as ex:  # noqa: BLE001  (as Flower's runtime: the exception becomes an error reply)
                reply = Message(Error(ErrorCode.CLIENT_APP_RAISED_EXCEPTION, f"{type(ex)}:<'{ex}'>"), reply_to=msg)
            reply = _wire(reply)
            if reply.has_content() and Key.MASKED_PARAMETERS in reply.content.config_records.get(
                RECORD_KEY_CONFIGS, {}
            ):
                self.masked[node] = reply
            replies.append(reply)
        return replies


P = torch.tensor([[1.0, -2.0, 0.5], [4.0, 0.0, -3.0]])
N = {"a": 10, "b": 20, "c": 30}
#: Client k uploads w = c_k P + d_k, b = d_k, the counter t_k. By hand (weights 10, 20, 30, total 60):
#: sum n c / 60 = (6 + 6 - 6) / 60 = 0.1, sum n d / 60 = (10 - 40 + 15) / 60 = -0.25, so the weighted mean is
#: w = 0.1 P - 0.25, b = -0.25; the uniform mean would be w = 0.2333 P - 0.1667. Counters: (50 + 140 + 270) / 60
#: = 7.67, rounded to 8.
C = {"a": 0.6, "b": 0.3, "c": -0.2}
D = {"a": 1.0, "b": -2.0, "c": 0.5}
T = {"a": 5, "b": 7, "c": 9}
WEIGHTED_W = 0.1 * P - 0.25
WEIGHTED_B = torch.full((3,), -0.25)


def _upload(cid: str) -> dict[str, torch.Tensor]:
    return {
        "w": C[cid] * P + D[cid],
        "b": torch.full((3,), D[cid]),
        "bn.num_batches_tracked": torch.tensor(T[cid]),
        "s": torch.tensor([1.5], dtype=torch.bfloat16),
    }


def _received() -> dict[str, torch.Tensor]:
    return {
        "w": torch.zeros(2, 3),
        "b": torch.ones(3),
        "bn.num_batches_tracked": torch.tensor(0),
        "s": torch.tensor([1.25], dtype=torch.bfloat16),
    }


def _client_app(train: Any) -> ClientApp:
    app = ClientApp(mods=client_mods())

    @app.train()
    def _train(msg: Message, context: Context) -> Message:
        assert is_secure_train(msg)
        return handle_secure_train(msg, context, train)

    return app


def _run(
    ids: list[str], train: Any, options: SecAggOptions, strategy: Any = None, silent: dict[int, str] | None = None
) -> tuple[list[ClientTurn | str], InProcessGrid]:
    nodes = {cid: 100 + i for i, cid in enumerate(ids)}
    grid = InProcessGrid(_client_app(train), list(nodes.values()), silent)
    tasks = [FitTask(cid, _received()) for cid in ids]
    fed = SimpleNamespace(strategy=strategy or FedAvg())
    return secure_fit(grid, fed, 3, tasks, nodes, options), grid


def _train(got: dict[str, Any]) -> Any:
    def train(client_id: str, server_round: int, received: dict[str, torch.Tensor], extras: dict) -> ClientTurn:
        got[client_id] = (server_round, received, extras)
        update = ClientUpdate(client_id, N[client_id], _upload(client_id), {"loss": 0.5, "steps": 4.0})
        return ClientTurn(update, 0)

    return train


def _bound(options: SecAggOptions, k: int, total: int, peak: float) -> float:
    """The quantization error bound of the module docstring: K W (2C + max|x|) / (Q sum n)."""
    return k * options.max_weight * (2 * options.clipping_range + peak) / (options.quantization_range * total)


# ---- which strategies --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("strategy", [FedAvg(), FedProx(), FedBN(), SiloBN(), FedAdam(), APFL(), FedALA()], ids=repr)
def test_weighted_mean_strategies_may_aggregate_securely(strategy: Any) -> None:
    check_secure_aggregation(strategy)


@pytest.mark.parametrize(
    ("strategy", "why"),
    [
        (SCAFFOLD(), "needs each client's upload"),
        (Krum(), "needs each client's upload"),
        (FedSCA(), "needs each client's upload"),
        (FedMedian(), "needs each client's upload"),
        (FedAvg(weighting="uniform"), "weighting='uniform'"),
    ],
    ids=lambda x: x if isinstance(x, str) else type(x).__name__,
)
def test_other_strategies_are_refused_with_their_name_and_the_compatible_ones(strategy: Any, why: str) -> None:
    with pytest.raises(ConfigError) as err:
        check_secure_aggregation(strategy)
    message = str(err.value)
    assert type(strategy).__name__ in message and why in message and "secure-aggregation" in message
    compatible = message.split("need no more: ")[1].split(".")[0].split(", ")
    assert {"FedAvg", "FedProx", "FedBN", "SiloBN", "FedAdam", "FedYogi", "FedAdagrad"} <= set(compatible)
    assert not {
        "SCAFFOLD",
        "Krum",
        "FedSCA",
        "FedMedian",
        "FedTrimmedAvg",
        "FedSLD",
        "FedDyn",
        "PGFed",
        "EPFL",
        "APPLE",
        "FedMetaMed",
        "FedHEAL",
        "Local",
    } & set(compatible)


def test_a_subclass_that_overrides_aggregate_must_declare_it_again() -> None:
    class Reweighted(FedAvg):
        def aggregate(self, server_round: int, updates: list) -> dict:
            return super().aggregate(server_round, updates[:1])

    with pytest.raises(ConfigError, match="Reweighted overrides aggregate after FedAvg declared"):
        check_secure_aggregation(Reweighted())

    class Declared(Reweighted):
        secure_aggregation = True

    check_secure_aggregation(Declared())


# ---- options -----------------------------------------------------------------------------------------------------


def test_options_from_config() -> None:
    assert SecAggOptions.from_config(None) is None and SecAggOptions.from_config(False) is None
    assert SecAggOptions.from_config(True) == SecAggOptions()
    assert SecAggOptions.from_config({"max_weight": 50}).max_weight == 50
    # the run config's text: `--run-config 'secure-aggregation="{\"max_weight\": 50}"'` or `true`
    assert SecAggOptions.from_config('{"max_weight": 50}') == SecAggOptions(max_weight=50)
    assert SecAggOptions.from_config("true") == SecAggOptions() and SecAggOptions.from_config("false") is None
    with pytest.raises(ConfigError, match="secure-aggregation='max_weight=50' must be true, false or a JSON"):
        SecAggOptions.from_config("max_weight=50")
    with pytest.raises(ConfigError, match="'num_share' \\(did you mean 'num_shares'\\?\\)"):
        SecAggOptions.from_config({"num_share": 3})
    with pytest.raises(ConfigError) as err:
        SecAggOptions(num_shares=2, reconstruction_threshold=1.5, clipping_range=0, quantization_range=2**31)
    for name in ("num_shares=2", "reconstruction_threshold=1.5", "clipping_range=0", "quantization_range="):
        assert f"secure-aggregation.{name}" in str(err.value)
    with pytest.raises(ConfigError, match="reconstruction_threshold=3 must be below num_shares=3"):
        SecAggOptions(num_shares=3, reconstruction_threshold=3)


# ---- one round of the protocol -----------------------------------------------------------------------------------


def test_secure_round_gives_the_weighted_mean_to_every_client_and_fedavg_the_same_model() -> None:
    options = SecAggOptions(max_weight=30)
    got: dict[str, Any] = {}
    turns, grid = _run(["a", "b", "c"], _train(got), options)
    bound = _bound(options, 3, 60, peak=float(max((C[k] * P + D[k]).abs().max() for k in C)))
    assert bound < 1e-5
    for cid, turn in zip("abc", turns, strict=True):
        assert isinstance(turn, ClientTurn) and turn.problem is None
        # What the client received: the server's tensors, dtypes kept, with the round and no extras.
        server_round, received, extras = got[cid]
        assert server_round == 3 and extras == {}
        assert {n: (t.dtype, t.tolist()) for n, t in received.items()} == {
            n: (t.dtype, t.tolist()) for n, t in _received().items()
        }
        update = turn.update
        assert update.client_id == cid and update.num_examples == N[cid]
        assert update.metrics == {"loss": 0.5, "steps": 4.0}
        assert turn.download_bytes == 6 * 4 + 3 * 4 + 8 + 2
        assert update.state["w"].dtype == torch.float32
        assert (update.state["w"] - WEIGHTED_W).abs().max() <= bound
        assert (update.state["b"] - WEIGHTED_B).abs().max() <= bound
        assert update.state["bn.num_batches_tracked"].item() == T[cid]  # integer tensors travel in the clear
        assert update.state["s"].dtype == torch.bfloat16 and update.state["s"].item() == 1.5
    assert (turns[0].update.state["w"] - (0.2333 * P - 0.1667)).abs().max() > 0.01  # not the uniform mean
    # FedAvg's aggregate of the secure turns equals its aggregate of the plain uploads, to the bound.
    secure, plain = FedAvg(), FedAvg()
    for strategy in (secure, plain):
        strategy.initialize(_received(), ["a", "b", "c"])
    new_secure = secure.aggregate(3, [t.update for t in turns])
    new_plain = plain.aggregate(3, [ClientUpdate(c, N[c], _upload(c)) for c in "abc"])
    assert (new_plain["w"] - WEIGHTED_W).abs().max() < 1e-6
    assert (new_secure["w"] - new_plain["w"]).abs().max() <= bound
    assert (new_secure["b"] - new_plain["b"]).abs().max() <= bound
    assert new_secure["bn.num_batches_tracked"].item() == new_plain["bn.num_batches_tracked"].item() == 8


def test_what_a_client_uploads_is_masked() -> None:
    options = SecAggOptions(max_weight=30)
    _, grid = _run(["a", "b", "c"], _train({}), options)
    assert sorted(grid.masked) == [100, 101, 102]
    for node, cid in zip((100, 101, 102), "abc", strict=True):
        reply = grid.masked[node]
        # The mod emptied the FitRes parameters: no plain tensor leaves the client.
        assert all(len(record) == 0 for record in reply.content.array_records.values())
        vectors = [bytes_to_ndarray(b) for b in reply.content.config_records[RECORD_KEY_CONFIGS][Key.MASKED_PARAMETERS]]
        weight, w = vectors[0], vectors[1]
        # Unmasked, the weight would be round(n / W * Q) and w its quantized weighted values, within one step.
        plain_weight = round(N[cid] / options.max_weight * options.quantization_range)
        plain_w = (
            ((C[cid] * P + D[cid]).double().numpy() * N[cid] / options.max_weight + options.clipping_range)
            * options.quantization_range
            / (2 * options.clipping_range)
        )
        assert abs(int(weight[0]) - plain_weight) > 1000
        assert (abs(w - plain_w) > 1000).all()
        assert ((w >= 0) & (w < 2**32)).all()


def test_dropped_and_quarantined_clients_are_left_out_of_the_sum() -> None:
    # a and d train; b raises, c's update is non-finite. 4 clients, all neighbours, 2 shares rebuild a secret.
    n = {"a": 10, "b": 20, "c": 30, "d": 40}

    def train(client_id: str, server_round: int, received: dict, extras: dict) -> ClientTurn:
        if client_id == "b":
            raise DataError("Client 'b' has no training batch")
        value = {"a": 1.0, "c": float("nan"), "d": -0.5}[client_id]
        state = {
            "w": torch.full((2, 3), value),
            "b": torch.zeros(3),
            "bn.num_batches_tracked": torch.tensor(1),
            "s": torch.ones(1, dtype=torch.bfloat16),
        }
        update = ClientUpdate(client_id, n[client_id], state, {"loss": 0.25, "steps": 2.0})
        return ClientTurn(update, 0, "non-finite tensor 'w'" if client_id == "c" else None)

    options = SecAggOptions(reconstruction_threshold=2, max_weight=40)
    turns, _ = _run(["a", "b", "c", "d"], train, options)
    # By hand: (10 * 1.0 + 40 * -0.5) / 50 = -0.2 (neither b's nor c's weight counts).
    bound = _bound(options, 2, 50, peak=1.0)
    for turn in (turns[0], turns[3]):
        assert isinstance(turn, ClientTurn) and turn.problem is None
        assert (turn.update.state["w"] + 0.2).abs().max() <= bound
    assert isinstance(turns[1], str) and turns[1] == "DataError: Client 'b' has no training batch"
    quarantined = turns[2]
    assert isinstance(quarantined, ClientTurn) and quarantined.problem == "non-finite tensor 'w'"
    assert quarantined.update.state == {} and quarantined.update.metrics == {"loss": 0.25, "steps": 2.0}


def test_too_few_live_clients_halt_the_round() -> None:
    # With 3 clients and 2 shares needed, a client that stops answering after the key exchange is recovered;
    # two of them leave one client, whose mask nobody can remove: every turn is an error.
    options = SecAggOptions(reconstruction_threshold=2, max_weight=30)
    turns, _ = _run(["a", "b", "c"], _train({}), options, silent={101: Stage.COLLECT_MASKED_VECTORS})
    assert isinstance(turns[1], str) and "no reply in time" in turns[1]
    # By hand: (10 (0.6 P + 1) + 30 (-0.2 P + 0.5)) / 40 = 25 / 40 = 0.625 everywhere; a's values reach 3.4.
    assert (turns[0].update.state["w"] - 0.625).abs().max() <= _bound(options, 2, 40, peak=3.4)
    turns, _ = _run(
        ["a", "b", "c"],
        _train({}),
        options,
        silent={101: Stage.COLLECT_MASKED_VECTORS, 102: Stage.COLLECT_MASKED_VECTORS},
    )
    assert isinstance(turns[0], str) and "halted" in turns[0]
    assert all(isinstance(t, str) and "no reply in time" in t for t in turns[1:])


def test_a_value_that_would_be_clipped_is_refused_by_its_client() -> None:
    # Weighted peaks |x| n / W: a 3.4 * 10/30 = 1.13, b 2.9 * 20/30 = 1.93, c 1.1 * 30/30 = 1.1.
    options = SecAggOptions(max_weight=30, clipping_range=1.5)
    turns, _ = _run(["a", "b", "c"], _train({}), options)
    assert isinstance(turns[0], ClientTurn) and isinstance(turns[2], ClientTurn) and isinstance(turns[1], str)
    assert "tensor 'w' reaches 2.9" in turns[1] and "secure-aggregation.clipping_range=1.5" in turns[1]
    assert "above 1.933" in turns[1]
    options = SecAggOptions(max_weight=25)
    turns, _ = _run(["a", "b", "c"], _train({}), options)
    assert isinstance(turns[2], str) and "30 training examples exceed secure-aggregation.max_weight=25" in turns[2]
    # the fix, as the operator types it, with this client's count
    assert """--run-config 'secure-aggregation="{\\"max_weight\\": 30}"'""" in turns[2]


def test_secure_fit_refuses_rounds_it_cannot_protect() -> None:
    options = SecAggOptions()
    app = _client_app(_train({}))
    fed = SimpleNamespace(strategy=FedAvg())
    tasks = [FitTask(c, _received()) for c in "abc"]
    with pytest.raises(ConfigError, match="share a Flower node"):
        secure_fit(InProcessGrid(app, [1, 2]), fed, 1, tasks, {"a": 1, "b": 1, "c": 2}, options)
    with pytest.raises(ConfigError, match="sends extras"):
        secure_fit(
            InProcessGrid(app, [1, 2]),
            fed,
            1,
            [FitTask("a", {}, {"c": torch.zeros(1)}), FitTask("b", {})],
            {"a": 1, "b": 2},
            options,
        )
    with pytest.raises(ConfigError, match="at least 2 clients"):
        secure_fit(InProcessGrid(app, [1]), fed, 1, tasks[:1], {"a": 1}, options)
    with pytest.raises(ConfigError, match="SCAFFOLD"):
        secure_fit(
            InProcessGrid(app, [1, 2, 3]),
            SimpleNamespace(strategy=SCAFFOLD()),
            1,
            tasks,
            {"a": 1, "b": 2, "c": 3},
            options,
        )


# ---- the executor's checks of the secure turns ----------------------------------------------------------------------


def _executor_fit(reported: dict[str, int], on_client_error: str = "skip") -> list[ClientTurn | str]:
    """One secure round of clients a, b, c through FlowerExecutor, whose nodes reported ``reported`` train sizes."""
    from fedlit.flower.server import FlowerExecutor

    nodes = {cid: 100 + i for i, cid in enumerate("abc")}
    data = SimpleNamespace(nodes=nodes, num_examples=lambda client_id, split: reported[client_id])
    grid = InProcessGrid(_client_app(_train({})), list(nodes.values()))
    executor = FlowerExecutor(SimpleNamespace(grid=grid), data, secure_aggregation={"max_weight": 30})
    fed = SimpleNamespace(strategy=FedAvg(), settings=SimpleNamespace(on_client_error=on_client_error))
    return executor.fit(fed, 3, [FitTask(cid, _received()) for cid in "abc"])


def test_the_executor_keeps_secure_turns_that_pass_its_checks() -> None:
    turns = _executor_fit(dict(N))
    assert all(isinstance(t, ClientTurn) for t in turns)


def test_a_client_whose_weight_exceeds_its_train_size_spoils_the_secure_mean_for_all() -> None:
    # c uploads with num_examples 30 where its node reported 25: its weight is in the mean, which no one can use.
    with pytest.warns(UserWarning) as caught:
        turns = _executor_fit({**N, "c": 25})
    assert (
        turns[2] == "client 'c' replied num_examples=30, not 25 (the train size its node declared when the run "
        "started: a client's weight is fixed for the run)"
    )
    assert (
        turns[0] == turns[1] == "its update is the SecAgg+ mean of the round, which holds the refused upload of "
        "client 'c'"
    )
    assert [str(w.message).split(" failed:")[0] for w in caught] == [
        "Round 3: client 'c' (Flower node 102)",
        "Round 3: client 'a' (Flower node 100)",
        "Round 3: client 'b' (Flower node 101)",
    ]
    with pytest.raises(
        FedlitError,
        match=r"Round 3: the turn of client 'c' \(Flower node 102\) failed: client 'c' "
        r"replied num_examples=30",
    ):
        _executor_fit({**N, "c": 25}, on_client_error="raise")


# ---- a real federation ---------------------------------------------------------------------------------------------


class SecureExecutor(LocalExecutor):
    """Every round's turns through SecAgg+: one node per client, whose ClientApp trains it with fedlit's local turn
    (``train_client``) in this process; evaluation as the local executor."""

    def __init__(self, options: SecAggOptions) -> None:
        self.options = options

    def fit(self, fed: Any, server_round: int, tasks: list[FitTask]) -> list[ClientTurn | str]:
        def train(client_id: str, rnd: int, received: dict, extras: dict) -> ClientTurn:
            return train_client(fed.client_context(client_id), rnd, received, extras)

        nodes = {c: 100 + i for i, c in enumerate(fed.train_client_ids)}
        grid = InProcessGrid(_client_app(train), list(nodes.values()))
        return secure_fit(grid, fed, server_round, tasks, nodes, self.options)


def test_a_federation_trained_through_secagg_matches_the_plain_one(tmp_path: Any) -> None:
    plain = make_federation(tmp_path / "plain", FedAvg(), rounds=2)
    plain.fit()
    secure = make_federation(tmp_path / "secure", FedAvg(), rounds=2)
    secure.executor = SecureExecutor(SecAggOptions(max_weight=15))  # 15 training examples per client
    secure.fit()
    # Round 1 starts from the same model: the same local training, so the same losses and bytes.
    assert secure.state.comm == plain.state.comm
    gaps = {}
    for name, tensor in plain.strategy.global_state.items():
        other = secure.strategy.global_state[name]
        assert other.dtype == tensor.dtype
        gaps[name] = float((other.double() - tensor.double()).abs().max())
    assert max(gaps.values()) < 1e-4
    assert max(gaps.values()) > 0  # the model did go through the quantized protocol
    assert gaps["backbone.1.num_batches_tracked"] == 0  # integer tensors: the plain mean of the clear values
