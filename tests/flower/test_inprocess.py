"""Every strategy deployed in-process (fedlit.flower.inprocess) gives the simulation's results.

Each message of the deployment goes through the codec and is answered by a client runtime built afresh for it (as a
SuperNode's per-message process: a fresh strategy instance, a store holding only that client's entry, restored from
the bytes its node kept), so a strategy whose client-side hooks read server state a client never receives, or keep
state between turns outside ``client_state``, gives other numbers than the simulation and fails here.
"""

from __future__ import annotations

import csv
import math
import re
import warnings

import pytest
import torch
from lightning.pytorch import Callback

pytest.importorskip("flwr.app", reason="flwr is not installed (pip install 'fedlit[flower]'): no Flower deployment")

import tests.conftest  # noqa: E402
from fedlit import RoleRule  # noqa: E402
from fedlit import strategies as S  # noqa: E402
from fedlit.core.errors import ConfigError, DataError, FedlitError  # noqa: E402
from fedlit.flower.inprocess import InProcessTransport, deploy  # noqa: E402
from fedlit.flower.server import RemoteData  # noqa: E402
from tests.conftest import TinyMLP, make_federation  # noqa: E402
from tests.flower.faults import RaiseAt  # noqa: E402
from tests.strategies.test_epfl import LORA_ROLES, LoRAMLP  # noqa: E402
from tests.strategies.test_fedsa import LoRANet  # noqa: E402
from tests.strategies.test_fedsca import ADAPTER_ROLES, AdapterNet  # noqa: E402

CLIENTS = ["c0", "c1", "c2"]
LORA_SHARED = [RoleRule("backbone.*", "frozen"), RoleRule("*lora_*", "shared")]

# name: (strategy factory, backbone, roles (None: everything shared), Federation keyword arguments)
CASES = {
    "FedAvg": (S.FedAvg, TinyMLP, None, {}),
    "FedAvg-persist": (S.FedAvg, TinyMLP, None, {"optimizer_state": "persist", "clients_per_round": 2}),
    "FedProx": (lambda: S.FedProx(mu=0.5), TinyMLP, None, {}),
    "FedAvgFT": (lambda: S.FedAvgFT(finetune_steps=2), TinyMLP, None, {}),
    "FedBN": (S.FedBN, TinyMLP, None, {}),
    "SiloBN": (S.SiloBN, TinyMLP, None, {}),
    "FedPxN": (lambda: S.FedPxN(mu=0.5), TinyMLP, None, {}),
    "Local": (S.Local, TinyMLP, None, {}),
    "FedAdam": (lambda: S.FedAdam(eta=0.05, beta_2=0.5), TinyMLP, None, {}),
    "FedAdagrad": (lambda: S.FedAdagrad(eta=0.05), TinyMLP, None, {}),
    "FedYogi": (lambda: S.FedYogi(eta=0.05, beta_2=0.5), TinyMLP, None, {}),
    "SCAFFOLD": (S.SCAFFOLD, TinyMLP, None, {"clients_per_round": 2}),
    "FedDyn": (lambda: S.FedDyn(alpha=0.1), TinyMLP, None, {"clients_per_round": 2}),
    "FedSLD": (S.FedSLD, TinyMLP, None, {}),
    "FedMedian": (S.FedMedian, TinyMLP, None, {}),
    "FedTrimmedAvg": (lambda: S.FedTrimmedAvg(beta=0.2), TinyMLP, None, {}),
    "Krum": (lambda: S.Krum(num_selected=2), TinyMLP, None, {}),
    "FedHEAL": (S.FedHEAL, TinyMLP, None, {}),
    "APPLE": (lambda: S.APPLE(lr_p=0.1, decay_rounds=2), TinyMLP, None, {}),
    "APPLE-limited": (lambda: S.APPLE(lr_p=0.1, decay_rounds=2, max_downloads=1), TinyMLP, None, {}),
    "FedRoD": (S.FedRoD, TinyMLP, None, {}),
    "FedFomo": (S.FedFomo, TinyMLP, None, {}),
    "FedDBE": (lambda: S.FedDBE(kappa=0.5), TinyMLP, None, {}),
    "PGFed": (S.PGFed, TinyMLP, None, {}),
    "PGFedMo": (lambda: S.PGFedMo(beta=0.5), TinyMLP, None, {}),
    "FedMetaMed": (lambda: S.FedMetaMed(schedule_rounds=2), TinyMLP, None, {}),
    "APFL": (S.APFL, TinyMLP, None, {}),
    "FedALA": (S.FedALA, TinyMLP, None, {}),
    "Ditto": (S.Ditto, TinyMLP, None, {}),
    "pFedMe": (S.pFedMe, TinyMLP, None, {}),
    "PerFedAvg": (lambda: S.PerFedAvg(alpha=0.1), TinyMLP, None, {}),
    "EPFL": (S.EPFL, LoRAMLP, LORA_ROLES, {}),
    "FedSA": (S.FedSA, LoRANet, LORA_SHARED, {}),
    "FedSCA": (lambda: S.FedSCA(num_shared_adapters=3, alpha=1.0, beta=0.5), AdapterNet, ADAPTER_ROLES, {}),
    "FedRA": (lambda: S.FedRA(block_counts=[1], seed=3), AdapterNet, ADAPTER_ROLES, {}),
    "MetaFed": (lambda: S.MetaFed(warmup_rounds=0, threshold=0.0), TinyMLP, None, {}),
}


def _builder(path, case, **extra):
    factory, _, roles, kwargs = CASES[case]
    return lambda: make_federation(path, factory(), roles=roles, **{**kwargs, **extra})


def _close(a, b, path=""):
    """``a`` and ``b`` (nested dicts and lists of numbers) agree to 1e-6."""
    if isinstance(a, dict):
        assert set(a) == set(b), path
        for key in a:
            _close(a[key], b[key], f"{path}.{key}")
    elif isinstance(a, list):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _close(x, y, f"{path}[{i}]")
    elif isinstance(a, float):
        assert (math.isnan(a) and math.isnan(b)) or a == pytest.approx(b, rel=1e-6, abs=1e-6), path
    else:
        assert a == b, path


def _without_pooled(block):
    """A ``results.json`` block without the simulation's ``pooled`` metrics (in ``last``, ``best``, ``global``)."""
    if not isinstance(block, dict):
        return block
    return {k: _without_pooled(v) for k, v in block.items() if k != "pooled"}


@pytest.mark.parametrize("case", list(CASES))
def test_deployed_in_process_equals_simulation(tmp_path, monkeypatch, case):
    monkeypatch.setattr(tests.conftest, "TinyMLP", CASES[case][1])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        simulated = _builder(tmp_path / "sim", case)().fit()
        transport = InProcessTransport({c: _builder(tmp_path / "node", case) for c in CLIENTS})
        deployed = deploy(_builder(tmp_path / "dep", case)(), transport)
    for key in ("last", "best", "global", "comm", "compute"):
        assert (key in simulated) == (key in deployed), key
        if key in simulated:
            _close(_without_pooled(simulated[key]), deployed[key], key)
    # the pooled metrics need every patient's prediction in one place: a node never sends them
    assert "pooled" in simulated["last"] and "pooled" not in deployed["last"]
    # the server sent one query per node, then trained and evaluated each client through messages
    kinds = [k for _, k in transport.sent]
    assert kinds[:3] == ["query"] * 3 and kinds.count("evaluate") == 2 * len(CLIENTS)
    assert not (tmp_path / "node").exists()  # a node writes no run folder


# --- faults ---------------------------------------------------------------------------------------------------------


def _fed(path, **kwargs):
    return lambda: make_federation(path, S.FedAvg(), callbacks=[RaiseAt("c1", 2)], **kwargs)


def test_a_client_that_raises_in_round_2_is_left_out_with_a_warning(tmp_path):
    transport = InProcessTransport({c: _fed(tmp_path / "node", on_client_error="skip") for c in CLIENTS})
    with pytest.warns(UserWarning, match=r"Round 2: client 'c1' \(Flower node 102\) failed: RuntimeError: disk full"):
        results = deploy(_fed(tmp_path / "dep", on_client_error="skip")(), transport)
    assert results["faults"] == [
        {"round": 2, "client": "c1", "kind": "error", "detail": "RuntimeError: disk full on c1"}
    ]
    rows = list(csv.reader((tmp_path / "dep" / "metrics.csv").open()))[1:]
    trained = {(r[0], r[1]) for r in rows if r[2:4] == ["train", "loss"]}
    assert trained == {("1", "c0"), ("1", "c1"), ("1", "c2"), ("2", "c0"), ("2", "c2")}
    assert set(results["last"]["clients"]) == set(CLIENTS)  # c1 is still evaluated with its round-1 state


def test_a_client_that_raises_stops_the_run_naming_it_with_raise(tmp_path):
    transport = InProcessTransport({c: _fed(tmp_path / "node") for c in CLIENTS})
    with pytest.raises(
        FedlitError,
        match=r"Round 2: the turn of client 'c1' \(Flower node 102\) failed: "
        r"RuntimeError: disk full on c1",
    ):
        deploy(_fed(tmp_path / "dep")(), transport)
    assert torch.load(tmp_path / "dep" / "checkpoints" / "last.ckpt", weights_only=True)["server_round"] == 1


def test_dead_nodes_below_min_clients_stop_the_run_and_keep_the_checkpoint(tmp_path):
    def die(client_id, message_type, server_round):
        if server_round == 2 and message_type == "train" and client_id != "c0":
            raise ConnectionError("node process killed")

    builder = lambda: make_federation(tmp_path / "node", S.FedAvg(), on_client_error="skip", min_clients=2)  # noqa: E731
    transport = InProcessTransport({c: builder for c in CLIENTS}, fail=die)
    server = make_federation(tmp_path / "dep", S.FedAvg(), on_client_error="skip", min_clients=2)
    with (
        pytest.warns(UserWarning, match="client 'c2'"),
        pytest.raises(FedlitError, match=r"Round 2: only 1 of 3 clients .*min_clients=2.*last good checkpoint"),
    ):
        deploy(server, transport)
    assert torch.load(tmp_path / "dep" / "checkpoints" / "last.ckpt", weights_only=True)["server_round"] == 1


def test_missing_nodes_are_named(tmp_path):
    transport = InProcessTransport({c: _fed(tmp_path / "node") for c in CLIENTS[:2]})
    server = _fed(tmp_path / "dep")()
    data = RemoteData(server.datamodule, transport, client_ids=CLIENTS, connect_timeout=0.1)
    with pytest.raises(DataError, match=r"2 of 3 clients answered: \['c0', 'c1'\]; missing: \['c2'\]"):
        data.setup()


def test_client_ids_the_nodes_report_are_checked_as_names(tmp_path):
    from flwr.app import ConfigRecord, RecordDict

    class Nodes:  # two SuperNodes, one started with a client-id that is a path
        def node_ids(self):
            return [1, 2]

        def exchange(self, messages, message_type, timeout):
            return [
                RecordDict({"query": ConfigRecord({"client-id": c, "position": i})})
                for i, c in enumerate(["c0", "../../x"])
            ]

    data = RemoteData(_fed(tmp_path / "dep")().datamodule, Nodes(), num_clients=2, connect_timeout=0.1)
    with pytest.raises(
        DataError,
        match=r"^--node-config client-id of the SuperNodes: client ids that are not safe "
        r"as file names: '\.\./\.\./x' holds a path separator\.",
    ):
        data.setup()


def test_unseen_clients_are_refused_in_deployment(tmp_path):
    transport = InProcessTransport({c: _fed(tmp_path / "node") for c in CLIENTS})
    with pytest.raises(ConfigError, match="federation.unseen_clients=1: unseen clients are evaluated"):
        deploy(_fed(tmp_path / "dep", unseen_clients=1)(), transport)


def _scheduled(path, **kwargs):
    """The tiny federation with a learning rate halved every round (a schedule of interval ``round``)."""
    from fedlit import Federation
    from fedlit.tasks import ClassificationModule

    def build():
        torch.manual_seed(0)
        module = ClassificationModule(
            backbone=TinyMLP(),
            num_classes=3,
            lr=0.1,
            momentum=0.9,
            roles=[RoleRule("backbone.*", "shared")],
            lr_scheduler=lambda optimizer: torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5),
            lr_scheduler_interval="round",
        )
        return Federation(
            module,
            tests.conftest.TinyTabular(),
            S.FedAvg(),
            rounds=3,
            out_dir=path,
            progress_bar=False,
            accelerator="cpu",
            **kwargs,
        )

    return build


def test_the_servers_round_schedule_reaches_the_clients(tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        simulated = _scheduled(tmp_path / "sim")().fit()
        transport = InProcessTransport({c: _scheduled(tmp_path / "node") for c in CLIENTS})
        deployed = deploy(_scheduled(tmp_path / "dep")(), transport)
    _close(_without_pooled(simulated["last"]), deployed["last"], "last")


def test_secure_aggregation_refuses_a_round_schedule(tmp_path):
    from fedlit.flower.server import FlowerExecutor, RemoteData

    transport = InProcessTransport({c: _scheduled(tmp_path / "node") for c in CLIENTS})
    server = _scheduled(tmp_path / "dep")()
    server.datamodule = RemoteData(server.datamodule, transport, num_clients=len(CLIENTS), connect_timeout=1.0)
    server.executor = FlowerExecutor(transport, server.datamodule, secure_aggregation=True)
    with pytest.raises(ConfigError, match="secure-aggregation = true with a learning-rate schedule of interval"):
        server.fit()


def test_secure_aggregation_refuses_client_level_dp(tmp_path):
    from fedlit.flower.server import FlowerExecutor, RemoteData
    from fedlit.privacy import ClientLevelDP

    transport = InProcessTransport({c: _fed(tmp_path / "node") for c in CLIENTS})
    server = make_federation(
        tmp_path / "dep", S.FedAvg(), callbacks=[ClientLevelDP(noise_multiplier=1.0, clip_norm=1.0)]
    )
    server.datamodule = RemoteData(server.datamodule, transport, num_clients=len(CLIENTS), connect_timeout=1.0)
    server.executor = FlowerExecutor(transport, server.datamodule, secure_aggregation=True)
    with pytest.raises(ConfigError, match="secure-aggregation = true with ClientLevelDP"):
        server.fit()


def test_secure_aggregation_refuses_a_max_weight_below_a_clients_train_size_before_round_one(tmp_path):
    """SecAgg+ weights an upload by num_examples / max_weight: a client above max_weight could never upload, so
    the server stops before any round, naming the clients, their sizes and the max_weight that fits."""
    from fedlit.flower.server import FlowerExecutor, RemoteData

    counted = make_federation(tmp_path / "count", S.FedAvg()).datamodule
    counted.setup()
    train = {c: counted.num_examples(c, "train") for c in CLIENTS}
    transport = InProcessTransport({c: lambda: make_federation(tmp_path / "node", S.FedAvg()) for c in CLIENTS})
    server = make_federation(tmp_path / "dep", S.FedAvg())
    server.datamodule = RemoteData(server.datamodule, transport, num_clients=len(CLIENTS), connect_timeout=1.0)
    limit = min(train.values()) - 1
    server.executor = FlowerExecutor(transport, server.datamodule, secure_aggregation={"max_weight": limit})
    listed = ", ".join(f"{c} ({train[c]})" for c in CLIENTS if train[c] > limit)
    with pytest.raises(
        ConfigError,
        match=re.escape(
            f"secure-aggregation.max_weight={limit} is below the training examples of {listed}, which could never "
            f"upload; set max_weight to at least {max(train.values())}"
        ),
    ):
        server.fit()
    assert not (tmp_path / "dep" / "metrics.csv").exists()


class CrashAt(Callback):
    """A server-side callback that kills the server after the clients' turns of one round, before its checkpoint."""

    def __init__(self, server_round: int) -> None:
        self.server_round = server_round

    def on_round_end(self, server_round):
        if server_round == self.server_round:
            raise KeyboardInterrupt("server killed")


def test_a_resumed_server_gets_the_nodes_state_of_its_checkpoint(tmp_path):
    """The server dies in round 3, after the nodes trained (their state moved on) but before its checkpoint (the
    last one is round 2's): resumed, the nodes restart from their round-2 state and the run ends as if never
    interrupted."""

    def build(path, *callbacks):
        return lambda: make_federation(
            path, S.FedBN(), rounds=4, checkpoint_every=2, optimizer_state="persist", callbacks=list(callbacks)
        )

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        nodes = InProcessTransport({c: build(tmp_path / "n") for c in CLIENTS})
        straight = deploy(build(tmp_path / "straight")(), nodes)
        transport = InProcessTransport({c: build(tmp_path / "n") for c in CLIENTS})
        with pytest.raises(KeyboardInterrupt):
            deploy(build(tmp_path / "dep", CrashAt(3))(), transport)
        assert {k for t in transport.tables.values() for k in t} == {"round_2", "round_3"}
        resumed = deploy(build(tmp_path / "dep")(), transport, ckpt_path=tmp_path / "dep" / "checkpoints" / "last.ckpt")
    _close(straight["last"], resumed["last"], "last")
    _close(straight["comm"], resumed["comm"], "comm")
    assert {k for t in transport.tables.values() for k in t} == {"round_2", "round_3", "round_4"}


def test_a_node_uses_its_own_client_only(tmp_path):
    from fedlit.flower.client import ClientRuntime

    runtime = ClientRuntime(_fed(tmp_path / "node"), "c1")
    data, fed = runtime.run.datamodule, runtime.run
    assert fed.client_ids == fed.train_client_ids == ["c1"] and data.position() == 1
    assert list(data.manifest()["clients"]) == ["c1"] and list(data.class_counts()) == ["c1"]
    assert len(data.train_dataloader("c1", torch.Generator()).dataset) == 15  # TinyTabular: half of 30 samples
    for read in (
        lambda: data.train_dataloader("c0", torch.Generator()),
        lambda: data.test_dataloader("c2"),
        lambda: data.num_examples("c0", "train"),
    ):
        with pytest.raises(KeyError, match="This node holds client 'c1', not"):
            read()
    with pytest.raises(DataError, match="node config client-id='c7' is not a client of TinyTabular"):
        ClientRuntime(_fed(tmp_path / "node"), "c7")


def test_a_turn_that_timed_out_on_its_node_is_recorded_as_a_timeout(tmp_path, monkeypatch):
    from fedlit.engine.loop import client as local
    from tests.engine.loop.test_client import SlowFor

    clock = [0.0]
    monkeypatch.setattr(local, "_clock", lambda: clock[0])

    def fed(path):
        return lambda: make_federation(
            path, S.FedAvg(), client_timeout=10.0, callbacks=[SlowFor(clock, "c2", round=2, seconds=30.0)]
        )

    transport = InProcessTransport({c: fed(tmp_path / "node") for c in CLIENTS})
    with pytest.warns(UserWarning, match=r"Round 2: client 'c2' timed out"):
        results = deploy(fed(tmp_path / "dep")(), transport)
    assert [(f["round"], f["client"], f["kind"]) for f in results["faults"]] == [(2, "c2", "timeout")]
    assert results["faults"][0]["detail"].startswith("timed out: 30 s after 1 steps")
