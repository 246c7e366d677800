"""Clients sharded over Fabric ranks: ownership, result order, failures, checkpoints, and 2 gloo processes on CPU
against 1 process through the real CLI. The exchange of results between ranks also runs with the tensors on one
CUDA device under the ``gpu`` marker (``make test-gpu``; the ``accelerator`` fixture): they cross on the CPU and
arrive on the device."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from lightning.pytorch import Callback

from fedlit.core.store import ClientStore
from fedlit.engine.loop import ranks
from fedlit.engine.loop.ranks import RankError, RankExecutor, assign_clients
from fedlit.engine.loop.tasks import FitTask
from fedlit.engine.records.progress import Progress
from tests.children import run_child

ROOT = Path(__file__).resolve().parents[3]
RECIPE = ROOT / "recipes" / "quickstart.yaml"


# ------------------------------------------------------------------------------------------------ ownership
def test_ownership_is_longest_processing_time_greedy_by_train_size():
    ids = ["c0", "c1", "c2", "c3"]

    def sizes(*values):
        return dict(zip(ids, values, strict=True))

    # 10 -> rank 0 (0, 0 tie: the lower rank); 7 -> rank 1; 5 -> rank 1 (7 < 10); 3 -> rank 0 (10 < 12)
    assert assign_clients(ids, sizes(10, 7, 5, 3), 2) == {0: ["c0", "c3"], 1: ["c1", "c2"]}
    # not round-robin: the big client alone on rank 0, the three small ones on rank 1 (loads 9 and 3)
    assert assign_clients(ids, sizes(1, 9, 1, 1), 2) == {0: ["c1"], 1: ["c0", "c2", "c3"]}
    # equal sizes keep the data set's order, each to the least loaded rank, the lower on a tie
    assert assign_clients(ids, dict.fromkeys(ids, 5), 3) == {0: ["c0", "c3"], 1: ["c1"], 2: ["c2"]}
    assert assign_clients(ids, sizes(10, 7, 5, 3), 1) == {0: ids}
    assert assign_clients(["a"], {"a": 4}, 2) == {0: ["a"], 1: []}


# ------------------------------------------------------------------------------------ gathering (faked ranks)
class Pending(Exception):
    """A faked collective that still waits for a rank that runs later."""


class FakeGroup:
    """The ranks of a group run one after the other, ``rank`` telling whose turn it is: a collective records the
    rank's part and, once every rank gave one, returns them all; before that it raises :class:`Pending`."""

    def __init__(self, monkeypatch, world_size=2):
        self.parts: dict[int, object] = {}
        self.rank = 0
        self.world_size = world_size
        monkeypatch.setattr(ranks.dist, "all_gather_object", self.all_gather_object)
        monkeypatch.setattr(ranks.dist, "gather_object", self.gather_object)

    def all_gather_object(self, out, obj):
        self.parts[self.rank] = obj
        if len(self.parts) < self.world_size:
            raise Pending
        out[:] = [self.parts[r] for r in range(self.world_size)]

    def gather_object(self, obj, out, dst=0):
        self.parts[self.rank] = obj
        if out is not None:
            out[:] = [self.parts[r] for r in range(self.world_size)]


def fake_fed(rank, world_size=2, store=None, device="cpu"):
    """A run on ``rank`` (its live module on ``device``): its client contexts carry that rank's Fabric."""
    fabric = SimpleNamespace(world_size=world_size, global_rank=rank, device=torch.device(device))
    return SimpleNamespace(
        fabric=fabric,
        progress=Progress(),
        store=store,
        client_ids=["c0", "c1", "c2", "c3"],
        client_context=lambda client_id: SimpleNamespace(client_id=client_id, fabric=fabric),
    )


def run_ranks(group, executor, tasks, run, device="cpu"):
    """Rank 1 (its part recorded), then rank 0 (every part there): rank 0's results."""
    group.rank = 1
    with pytest.raises(Pending):
        executor._run(fake_fed(1, device=device), 1, tasks, run, "turn")
    group.rank = 0
    return executor._run(fake_fed(0, device=device), 1, tasks, run, "turn")


def test_results_come_back_in_task_order_whoever_ran_them(monkeypatch, accelerator):
    group = FakeGroup(monkeypatch)
    executor = RankExecutor()
    executor.owner = {"c0": 0, "c1": 1, "c2": 1, "c3": 0}
    ran = []

    def run(fed, server_round, task):
        ran.append((fed.fabric.global_rank, task.client_id))
        state = torch.tensor([float(task.client_id[1])], device=fed.fabric.device)
        return {"who": f"{task.client_id}@{fed.fabric.global_rank}", "state": state, "upload": state.cpu()}

    tasks = [FitTask(c, {}) for c in ("c2", "c0", "c3", "c1")]
    results = run_ranks(group, executor, tasks, run, accelerator)
    assert [r["who"] for r in results] == ["c2@1", "c0@0", "c3@0", "c1@1"]
    assert [r["state"].item() for r in results] == [2.0, 0.0, 3.0, 1.0]
    # a tensor on the device comes back on the device, one on the CPU (an upload, in the store) on the CPU
    assert {r["state"].device.type for r in results} == {accelerator}
    assert {r["upload"].device.type for r in results} == {"cpu"}
    assert sorted(ran) == [(0, "c0"), (0, "c3"), (1, "c1"), (1, "c2")]  # each client once, by its owner


def test_a_client_that_raises_stops_every_rank_with_its_name(monkeypatch):
    group = FakeGroup(monkeypatch)
    executor = RankExecutor()
    executor.owner = {"c0": 0, "c1": 1}

    def run(fed, server_round, task):
        if task.client_id == "c1":
            raise ValueError("broken batch")
        return task.client_id

    tasks = [FitTask("c0", {}), FitTask("c1", {})]
    group.rank = 0
    with pytest.raises(Pending):
        executor._run(fake_fed(0), 3, tasks, run, "turn")
    group.rank = 1
    with pytest.raises(ValueError, match="broken batch"):  # the owner: the original error and its traceback
        executor._run(fake_fed(1), 3, tasks, run, "turn")
    group.rank = 0
    with pytest.raises(RankError, match=r"Round 3: the turn of client 'c1' raised on rank 1: ValueError: broken"):
        executor._run(fake_fed(0), 3, tasks, run, "turn")


def test_the_checkpoint_gathers_every_ranks_store_entries_in_client_order(monkeypatch):
    group = FakeGroup(monkeypatch)
    stores = []
    for client, value in (("c2", 2.0), ("c1", 1.0)):  # rank 0 holds c2, rank 1 holds c1
        store = ClientStore()
        store.set_initial({"w": torch.zeros(2)})
        store.save_from(client, {"w": torch.full((2,), value)})
        store.set_optimizer_state(client, {"state": {0: {"momentum_buffer": torch.full((2,), value * 10)}}})
        store.extra(client, "SCAFFOLD")["c_i"] = torch.full((2,), -value)
        stores.append(store)
    group.rank = 1
    assert ranks.gather_store(fake_fed(1, store=stores[1])) is None  # rank 1 sends, rank 0 writes
    group.rank = 0
    merged = ranks.gather_store(fake_fed(0, store=stores[0]))
    assert list(merged["tensors"]) == ["c1", "c2"]  # the data set's order, not the ranks'
    assert merged["tensors"]["c1"]["w"].tolist() == [1.0, 1.0] and merged["tensors"]["c2"]["w"].tolist() == [2, 2]
    assert merged["optimizer"]["c1"]["state"][0]["momentum_buffer"].tolist() == [10.0, 10.0]
    assert merged["extra"]["c2"]["SCAFFOLD"]["c_i"].tolist() == [-2.0, -2.0]
    assert merged["initial"]["w"].tolist() == [0.0, 0.0]
    # a rank that loads it keeps its own clients only
    loaded = ClientStore()
    loaded.retain({"c2"})
    loaded.load_state_dict(merged)
    assert loaded.client_ids == ["c2"] and loaded.optimizer_state("c1") is None
    assert loaded.extra("c2", "SCAFFOLD")["c_i"].tolist() == [-2.0, -2.0]


# ----------------------------------------------------------------------------- 2 gloo processes, real CLI
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def fedlit_fit(cwd: Path, out_dir: str, devices: int, rounds: int, *extra: str) -> subprocess.CompletedProcess:
    # One thread per process in both runs: the same float reductions, and 2 processes on a 2-core machine.
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        "OMP_NUM_THREADS": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
    }
    for key in ("RANK", "LOCAL_RANK", "NODE_RANK", "GROUP_RANK", "WORLD_SIZE", "SLURM_PROCID"):
        env.pop(key, None)
    args = [
        "--config",
        str(RECIPE),
        "--federation.rounds",
        str(rounds),
        "--federation.local_epochs",
        "1",
        "--federation.accelerator",
        "cpu",
        "--federation.devices",
        str(devices),
        "--federation.optimizer_state",
        "persist",
        "--federation.progress_bar",
        "false",
        "--out_dir",
        out_dir,
        "--data.init_args.samples_per_client",
        "40",
    ]
    return run_child([sys.executable, "-m", "fedlit", "fit", *args, *extra], cwd=cwd, env=env)


def per_client(results: dict) -> dict:
    return {
        (when, c, m): v
        for when in ("last", "best")
        for c, values in results[when]["clients"].items()
        for m, v in values.items()
    }


def assert_same_results(a: dict, b: dict) -> None:
    assert a["last"]["round"] == b["last"]["round"] and a["best"]["round"] == b["best"]["round"]
    ours, theirs = per_client(a), per_client(b)
    assert ours.keys() == theirs.keys() and len(ours) >= 2 * 4 * 5
    for key, value in ours.items():
        assert theirs[key] == pytest.approx(value, abs=1e-6, nan_ok=True), key
    assert a["comm"] == b["comm"]


@pytest.mark.long
def test_two_gloo_processes_match_one_process_and_resume_either_way(tmp_path):
    start = time.perf_counter()
    one = fedlit_fit(tmp_path, "one", 1, 2)
    assert one.returncode == 0, one.stderr[-3000:]
    two = fedlit_fit(tmp_path, "two", 2, 2)
    assert two.returncode == 0, two.stderr[-3000:]
    assert "Initializing distributed: GLOBAL_RANK: 1, MEMBER: 2/2" in two.stderr + two.stdout
    assert two.stdout.count("# Results:") == 1 and two.stdout.count("fedlit fit: out_dir=") == 1  # rank 0 prints
    results = {name: json.loads((tmp_path / name / "results.json").read_text()) for name in ("one", "two")}
    assert_same_results(results["one"], results["two"])
    assert results["two"]["comm"]["upload_bytes"] > 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["one", "two"]  # no folder made by rank 1

    # written once by rank 0, with every client's entries from both ranks (4 clients: 2 per rank)
    ckpts = {
        name: torch.load(tmp_path / name / "checkpoints" / "last.ckpt", weights_only=True)["store"]
        for name in ("one", "two")
    }
    clients = ["site_0", "site_1", "site_2", "site_3"]
    assert list(ckpts["two"]["tensors"]) == clients and list(ckpts["two"]["optimizer"]) == clients
    for client in clients:
        for name, tensor in ckpts["one"]["tensors"][client].items():
            torch.testing.assert_close(ckpts["two"]["tensors"][client][name], tensor, rtol=1e-5, atol=1e-6)

    # a 2-process checkpoint resumed in 1 process, a 1-process checkpoint in 2: the same round 3
    for name, devices in (("two", 1), ("one", 2)):
        resumed = fedlit_fit(tmp_path, name, devices, 3, "--ckpt_path", f"{name}/checkpoints/last.ckpt")
        assert resumed.returncode == 0, resumed.stderr[-3000:]
    again = {name: json.loads((tmp_path / name / "results.json").read_text()) for name in ("one", "two")}
    assert again["two"]["last"]["round"] == 3
    assert_same_results(again["one"], again["two"])
    print(f"4 CLI runs in {time.perf_counter() - start:.1f} s")


class RaiseOnClient(Callback):
    """Raises in ``on_client_fit_start`` of one client (in every round)."""

    def __init__(self, client: str) -> None:
        self.client = client

    def on_client_fit_start(self, trainer, pl_module, server_round, client_id, **kwargs) -> None:
        if client_id == self.client:
            raise ValueError(f"client {client_id} cannot read its data")


@pytest.mark.slow
@pytest.mark.parametrize("on_error", ["raise", "skip"])
def test_a_failing_client_on_rank_1_ends_every_process_or_is_skipped_everywhere(tmp_path, on_error):
    # quickstart's 4 clients have 120 training samples each: site_0, site_2 on rank 0, site_1, site_3 on rank 1
    callback = f"[{{class_path: {__name__}.RaiseOnClient, init_args: {{client: site_1}}}}]"
    done = fedlit_fit(tmp_path, "run", 2, 1, "--callbacks", callback, "--federation.on_client_error", on_error)
    if on_error == "raise":
        assert done.returncode != 0
        assert "client site_1 cannot read its data" in done.stderr
        return
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert [(f["client"], f["kind"]) for f in results["faults"]] == [("site_1", "error")]
    assert "cannot read its data" in results["faults"][0]["detail"]
    assert sorted(results["last"]["clients"]) == ["site_0", "site_1", "site_2", "site_3"]  # still evaluated
    # 3 uploads of the 4,851 shared float32 parameters (the failing turn uploads nothing, its download not counted)
    assert results["comm"]["upload_bytes"] == results["comm"]["download_bytes"] == 3 * 4851 * 4
