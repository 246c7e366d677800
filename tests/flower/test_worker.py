"""The thin ClientApp and the node worker: messages answered in one long-lived process per node, the same answers as
a fresh process gives (:func:`fedlit.flower.client.handle_message`), and a worker that never outlives its reasons.

Every worker a test starts watches the test process (it exits within a second once pytest is gone, even killed)
and is killed at the test's end by the pid it wrote next to its socket.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

pytest.importorskip("flwr.app", reason="flwr is not installed (pip install 'fedlit[flower]'): no Flower deployment")

from flwr.app import ConfigRecord, Context, Message, RecordDict  # noqa: E402
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS  # noqa: E402
from flwr.supercore.task_identity import TaskIdentity  # noqa: E402

from fedlit.flower import clientapp, codec  # noqa: E402
from fedlit.flower.client import handle_message  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
OVERRIDES = (
    "--data.init_args.num_clients 2 --data.init_args.samples_per_client 20 --data.init_args.image_size 8 "
    "--model.init_args.backbone.init_args.width 4 --federation.rounds 2"
)
EXIT = "\ncallbacks:\n  - class_path: tests.flower.faults.ExitAt\n    init_args: {client_id: site_1, server_round: 2}\n"


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _gone(pid: int, within: float = 60.0) -> bool:
    """Whether the worker ``pid`` (started by this process, so its child until reaped) ended."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            if os.waitpid(pid, os.WNOHANG)[0] == pid:
                return True
        except ChildProcessError:
            return not Path(f"/proc/{pid}").exists()
        time.sleep(0.1)
    return False


@pytest.fixture
def folder(monkeypatch):
    """A short folder (a Unix socket path holds about 100 bytes) for state-dirs and as the temporary folder (where a
    node without state-dir has its worker's socket); every worker that wrote a pid file under it is killed at the
    end."""
    path = Path(tempfile.mkdtemp(prefix="fw", dir="/tmp"))
    monkeypatch.setattr(tempfile, "tempdir", str(path))
    yield path
    for pid_file in path.rglob("*.pid"):
        _kill(int(pid_file.read_text()))
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def make_context(tmp_path, monkeypatch):
    for attr, value in (("_run_id", 9), ("_node_id", 0), ("_task_id", 0)):  # what a ServerApp process has
        monkeypatch.setattr(TaskIdentity, attr, value)

    def make(node_config, recipe_extra=""):
        run_config = {
            "recipe": (ROOT / "recipes" / "quickstart.yaml").read_text() + recipe_extra,
            "overrides": OVERRIDES,
            "out-dir": str(tmp_path / "server_run"),
        }
        return Context(
            run_id=9,
            node_id=42,
            node_config={"client-id": "site_1", "worker-idle-s": 120, **node_config},
            state=RecordDict(),
            run_config=run_config,
        )

    return make


def _received():
    from fedlit.cli import prepare

    with tempfile.TemporaryDirectory() as probe:
        shared = prepare(
            ["fit", "--config", str(ROOT / "recipes" / "quickstart.yaml"), *OVERRIDES.split(), "--out_dir", probe]
        ).federation
        shared.setup()
        return {n: t.detach().clone() for n, t in shared.module.named_tensors("shared").items()}


def _messages(received):
    """query, train rounds 1 and 2 (from the same received tensors), evaluate round 2."""
    out = [Message(RecordDict(), 42, "query", group_id="q")]
    for server_round in (1, 2):
        content = RecordDict({"task": ConfigRecord({"client-id": "site_1", "round": server_round, "checkpointed": 0})})
        for name, tree in (("received", received), ("extras", {}), ("schedule", None)):
            codec.put_tree(content, name, tree)
        out.append(Message(content, 42, "train", group_id=str(server_round)))
    content = RecordDict(
        {
            "task": ConfigRecord(
                {
                    "client-id": "site_1",
                    "round": 2,
                    "checkpointed": 0,
                    "splits": json.dumps(["val", "test"]),
                    "images": False,
                }
            )
        }
    )
    codec.put_tree(content, "received", received)
    codec.put_tree(content, "global", None)
    out.append(Message(content, 42, "evaluate", group_id="2"))
    return out


def _worker_pid(context) -> int:
    return int(Path(f"{clientapp.socket_path(context)}.pid").read_text())


@pytest.mark.parametrize("with_state_dir", [True, False], ids=["state-dir", "context-state"])
def test_worker_answers_as_a_fresh_process_and_is_reused(make_context, folder, with_state_dir):
    received = _received()
    node = {"state-dir": str(folder / "state")} if with_state_dir else {}
    inline, worker = make_context({**node, "worker": False}), make_context(node)
    if with_state_dir:  # the two nodes must not share snapshot files
        inline.node_config["state-dir"] = str(folder / "inline")
    pids, trained = set(), []
    for msg in _messages(received):
        expected = handle_message(msg, inline).content
        got = clientapp.answer(msg, worker, watch_pid=os.getpid()).content
        assert "error" not in got.config_records, got.config_records.get("error")
        pids.add(_worker_pid(worker))
        trained.append(codec.get_tree(got, "state") if msg.metadata.message_type == "train" else None)
        if msg.metadata.message_type == "query":
            assert dict(got["query"]) == dict(expected["query"])
        elif msg.metadata.message_type == "train":
            mine, theirs = codec.get_tree(got, "state"), codec.get_tree(expected, "state")
            assert set(mine) == set(theirs) and all((mine[n] == theirs[n]).all() for n in mine)
            assert codec.get_tree(got, "metrics") == codec.get_tree(expected, "metrics")
        else:
            assert codec.get_tree(got, "metrics") == codec.get_tree(expected, "metrics")
    assert len(pids) == 1  # one worker answered all four messages
    if with_state_dir:
        assert sorted(p.name for p in (folder / "state").rglob("*.pt")) == ["round_1.pt", "round_2.pt"]
        assert oct(os.stat(folder / "state" / ".fedlit-worker").st_mode & 0o777) == "0o700"
        # the node's user's alone: snapshots, marker, socket, pid and lock files 0600, every folder 0700
        modes = {(p.is_dir(), oct(p.stat().st_mode & 0o777)) for p in (folder / "state").rglob("*")}
        assert modes == {(True, "0o700"), (False, "0o600")}
        assert {p.suffix for p in (folder / "state" / ".fedlit-worker").iterdir()} == {".sock", ".pid", ".lock"}
    else:  # the snapshots travel back in context.state, as in a fresh process
        assert set(worker.state.config_records) == set(inline.state.config_records)
        assert (
            worker.state.config_records[next(iter(worker.state.config_records))].keys()
            == inline.state.config_records[next(iter(inline.state.config_records))].keys()
        )
    # Round 1 again (a server started afresh on the same run folder): no snapshot before round 1, so the kept client
    # starts from a fresh entry, not from what it trained, and answers as the first time.
    again = codec.get_tree(clientapp.answer(_messages(received)[1], worker, watch_pid=os.getpid()).content, "state")
    assert all((again[n] == trained[1][n]).all() for n in again)
    assert not all((again[n] == trained[2][n]).all() for n in again)


def test_thin_module_imports_no_torch():
    code = "import fedlit.flower.clientapp, fedlit.flower.worker, sys; print('torch' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert out.stdout.strip() == "False"


def test_worker_false_answers_in_this_process(make_context, folder):
    context = make_context({"state-dir": str(folder / "state"), "worker": "false"})
    reply = clientapp.answer(_messages(_received())[0], context, watch_pid=os.getpid())
    assert reply.content["query"]["client-id"] == "site_1"
    assert not (folder / "state" / ".fedlit-worker").exists()


@pytest.mark.long
def test_a_worker_that_dies_mid_message_is_an_error_reply_and_a_new_one_starts(make_context, folder):
    context = make_context({"state-dir": str(folder / "state")}, EXIT)
    query, train_1, train_2, _ = _messages(_received())
    assert "query" in clientapp.answer(query, context, watch_pid=os.getpid()).content.config_records
    first = _worker_pid(context)
    assert "turn" in clientapp.answer(train_1, context, watch_pid=os.getpid()).content.config_records
    # what answering raises in the worker (a SecAgg+ turn left out) is raised again here, its text kept for Flower
    secure = Message(RecordDict({RECORD_KEY_CONFIGS: ConfigRecord({})}), 42, "train", group_id="1")
    with pytest.raises(clientapp.WorkerRaised, match="a SecAgg\\+ message reached the train function before the "):
        clientapp.answer(secure, context, watch_pid=os.getpid())
    reply = clientapp.answer(train_2, context, watch_pid=os.getpid())  # ExitAt ends the worker in round 2
    assert reply.content["error"]["detail"] == (
        "the node's fedlit worker failed: WorkerError: the connection closed before the whole answer arrived"
    )
    assert _gone(first)
    assert "query" in clientapp.answer(query, context, watch_pid=os.getpid()).content.config_records
    assert _worker_pid(context) != first


def _start(folder: Path, idle_s: float, watch_pid: int) -> tuple[subprocess.Popen, Path]:
    path = folder / "w.sock"
    worker = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "fedlit.flower.worker",
            "--socket",
            str(path),
            "--idle-s",
            str(idle_s),
            "--watch-pid",
            str(watch_pid),
        ],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    deadline = time.monotonic() + 60
    while not Path(f"{path}.pid").exists() and worker.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert Path(f"{path}.pid").read_text().strip() == str(worker.pid)
    return worker, path


def test_worker_exits_when_idle_its_socket_goes_terminated_or_the_watched_process_ends(folder):
    worker, path = _start(folder, 0.5, os.getpid())
    try:
        assert worker.wait(timeout=60) == 0 and not path.exists() and not Path(f"{path}.pid").exists()
    finally:
        worker.kill()
    worker, path = _start(folder, 600, os.getpid())
    try:
        path.unlink()
        assert worker.wait(timeout=60) == 0
    finally:
        worker.kill()
    worker, path = _start(folder, 600, os.getpid())
    try:  # as the SuperNode's process group is stopped: the socket and pid files go with the worker
        worker.terminate()
        assert worker.wait(timeout=60) == 0 and not path.exists() and not Path(f"{path}.pid").exists()
    finally:
        worker.kill()
    watched = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        worker, path = _start(folder, 600, watched.pid)
        watched.kill()
        watched.wait()
        assert worker.wait(timeout=60) == 0
    finally:
        watched.kill()
        worker.kill()


def test_a_folder_others_may_enter_is_refused(make_context, folder):
    context = make_context({"state-dir": str(folder / "state")})
    (folder / "state" / ".fedlit-worker").mkdir(parents=True, mode=0o755)
    os.chmod(folder / "state" / ".fedlit-worker", 0o755)
    reply = clientapp.answer(_messages(_received())[0], context, watch_pid=os.getpid())
    assert "must be a folder of this user that only it may enter (mode 0700)" in reply.content["error"]["detail"]
