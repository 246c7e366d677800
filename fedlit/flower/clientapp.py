"""fedlit's ClientApp: a thin process per message that hands the message to the node's long-lived worker.

A SuperNode of Flower 1.41 starts a fresh ``flwr-clientapp`` process for every message. Answering in that process
(:func:`fedlit.flower.client.handle_message`) pays torch's and Lightning's imports and the recipe's build on every
message. This module imports only flwr and the standard library: its ``app`` sends the Message and the Context
(Flower's own protobuf serialization) over a Unix socket to the node's worker (:mod:`fedlit.flower.worker`, started
here on first need), which keeps the node's client built for the run and answers as
:func:`~fedlit.flower.client.handle_message` does, restoring and saving the client's store entry in the snapshots
as before (so resuming is unchanged). The reply and the updated ``context.state`` come back here; Flower keeps the
state as usual. SecAgg+ runs in this process (Flower's ``secaggplus_mod`` keeps its protocol state in
``context.state``); only the stage that trains reaches the worker.

Node config (``flower-supernode --node-config "..."``):

- ``worker`` (default true): false answers in this process, as before (no worker);
- ``worker-idle-s`` (default 600): the worker exits after this many seconds without a message.

The worker's socket lies in a private folder (mode 0700): ``<state-dir>/.fedlit-worker/`` with the node config
``state-dir``, else ``<temp>/fedlit-worker-<uid>/``; its name hashes the node config and the SuperNode's node id, so
the processes of one SuperNode share one worker. The worker answers one message at a time and exits when idle,
when its socket file is removed, or when the process that launched this one (the SuperNode's SuperExec) is gone;
it stays in the SuperNode's process group. A worker that dies mid-message makes this process answer with an
``error`` content naming it (the server then treats the client as failed), never hang.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import socket
import stat
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.app.message_type import MessageType
from flwr.client.mod import secaggplus_mod
from flwr.clientapp import ClientApp
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS
from flwr.common.serde import context_to_proto, message_to_proto, recorddict_from_proto

from fedlit.core.errors import broken
from fedlit.flower.snapshots import private_folder

#: Node config keys of the worker, with their defaults.
WORKER, IDLE = "worker", "worker-idle-s"
DEFAULT_IDLE_S = 600.0
#: Seconds a new worker has to open its socket (an interpreter start and flwr's import, on a loaded machine).
START_TIMEOUT_S = 120.0
_UNIX_PATH_MAX = 100  # sun_path holds 108 bytes on Linux, 104 on macOS
_LENGTH = struct.Struct(">Q")


class WorkerError(Exception):
    """The node's worker could not be reached or died before it answered."""


class WorkerRaised(Exception):  # noqa: N818  (carries the text of what the worker's answer raised)
    """What answering raised in the worker (a SecAgg+ turn left out of the masked sum), raised again here for Flower
    to report; its text is the original exception's."""


def error_content(detail: str) -> RecordDict:
    """A reply saying that the client's work raised ``detail`` (as :func:`fedlit.flower.client.error_content`)."""
    return RecordDict({"error": ConfigRecord({"detail": detail})})


# ------------------------------------------------------------------------------------------ frames on a socket
def send_frames(sock: socket.socket, frames: list[bytes]) -> None:
    """Send ``frames`` as a count and length-prefixed byte strings."""
    sock.sendall(_LENGTH.pack(len(frames)) + b"".join(_LENGTH.pack(len(f)) + f for f in frames))


def recv_frames(sock: socket.socket) -> list[bytes]:
    """Receive what :func:`send_frames` sent; :class:`WorkerError` when the other side closed before the end."""
    count = _LENGTH.unpack(_recv_exactly(sock, _LENGTH.size))[0]
    return [_recv_exactly(sock, _LENGTH.unpack(_recv_exactly(sock, _LENGTH.size))[0]) for _ in range(count)]


def _recv_exactly(sock: socket.socket, size: int) -> bytes:
    chunks, left = [], size
    while left:
        chunk = sock.recv(min(left, 1 << 20))
        if not chunk:
            raise WorkerError("the connection closed before the whole answer arrived")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


# ------------------------------------------------------------------------------------------------- the worker
def uses_worker(node_config: Mapping[str, Any]) -> bool:
    """Whether the node config asks for the worker (``worker``, default true)."""
    value = node_config.get(WORKER, True)
    return value if isinstance(value, bool) else str(value).strip().lower() not in ("false", "0", "no", "off")


def socket_path(context: Context) -> Path:
    """The worker's socket for this SuperNode (its folder made private: created with mode 0700, refused when
    another user owns it or others may enter it)."""
    identity = json.dumps(
        {"node-config": dict(context.node_config), "node-id": int(context.node_id), "uid": os.getuid()},
        sort_keys=True,
        default=str,
    )
    name = f"{hashlib.sha256(identity.encode()).hexdigest()[:16]}.sock"
    candidates = [Path(tempfile.gettempdir()) / f"fedlit-worker-{os.getuid()}"]
    if context.node_config.get("state-dir"):
        candidates.insert(0, Path(str(context.node_config["state-dir"])).absolute() / ".fedlit-worker")
    folder = next((c for c in candidates if len(str(c / name)) <= _UNIX_PATH_MAX), candidates[-1])
    private_folder(folder)  # and the state-dir above it, when this makes it
    info = os.lstat(folder)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
        raise WorkerError(
            f"{folder} must be a folder of this user that only it may enter (mode 0700); remove it "
            "or set the node config worker=false"
        )
    return folder / name


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with os.fdopen(os.open(path.with_suffix(".lock"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _connect(path: Path) -> socket.socket | None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(str(path))
    except (FileNotFoundError, ConnectionRefusedError):
        sock.close()
        return None
    return sock


def connect(path: Path, idle_s: float, watch_pid: int) -> socket.socket:
    """A connection to the worker listening on ``path``; one is started first when none listens (under a lock, so
    that two messages arriving together start one): ``python -m fedlit.flower.worker``, in this process group,
    exiting after ``idle_s`` idle seconds or once ``watch_pid`` is gone."""
    sock = _connect(path)
    if sock is not None:
        return sock
    with _locked(path):
        sock = _connect(path)
        if sock is not None:
            return sock
        with contextlib.suppress(FileNotFoundError):
            path.unlink()  # a socket nobody listens on: its worker died
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
            stdin=subprocess.DEVNULL,
            close_fds=True,
        )
        deadline = time.monotonic() + START_TIMEOUT_S
        while sock is None:
            if worker.poll() is not None:
                raise WorkerError(
                    f"the node worker exited with code {worker.returncode} before it listened on "
                    f"{path} (its output is in the SuperNode's)"
                )
            if time.monotonic() > deadline:
                worker.kill()
                raise WorkerError(f"the node worker did not listen on {path} within {START_TIMEOUT_S:g} s")
            time.sleep(0.05)
            sock = _connect(path)
        return sock


def ask_worker(msg: Message, context: Context, watch_pid: int | None = None) -> tuple[RecordDict | None, str | None]:
    """Send ``msg`` and ``context`` to the node's worker; return its reply's content and what answering raised
    (one of them None), after replacing ``context.state`` by the worker's. ``watch_pid``: the process whose end
    ends a worker started here (default: this process's parent, the SuperExec that launched it)."""
    idle_s = float(context.node_config.get(IDLE, DEFAULT_IDLE_S))
    path = socket_path(context)
    request = [message_to_proto(msg).SerializeToString(), context_to_proto(context).SerializeToString()]
    for attempt in range(3):
        try:
            with connect(path, idle_s, os.getppid() if watch_pid is None else watch_pid) as sock:
                send_frames(sock, request)
                header, content, state = recv_frames(sock)
            break
        except (ConnectionResetError, BrokenPipeError):
            # A worker that closed with the request unread (it was exiting) never answered it: ask again, a new
            # worker if need be. A worker that read the request and then died gives WorkerError, not this.
            if attempt == 2:
                raise
            time.sleep(0.2)
    from flwr.proto.recorddict_pb2 import RecordDict as ProtoRecordDict

    answer = json.loads(header)
    if answer["state"]:  # in place: Flower's mods hold this context
        new_state = recorddict_from_proto(ProtoRecordDict.FromString(state))
        for key in list(context.state.keys()):
            del context.state[key]
        for key, record in new_state.items():
            context.state[key] = record
    if answer["raised"] is not None:
        return None, str(answer["raised"])
    return recorddict_from_proto(ProtoRecordDict.FromString(content)), None


def answer(msg: Message, context: Context, watch_pid: int | None = None) -> Message:
    """Answer ``msg`` in the node's worker (or here with the node config ``worker=false``); ``watch_pid`` as for
    :func:`ask_worker`."""
    if not uses_worker(context.node_config):
        from fedlit.flower.client import handle_message

        return handle_message(msg, context)
    try:
        content, raised = ask_worker(msg, context, watch_pid)
    except (OSError, WorkerError, ValueError) as err:
        return Message(error_content(f"the node's fedlit worker failed: {type(err).__name__}: {err}"), reply_to=msg)
    if raised is not None:
        raise WorkerRaised(raised)
    if not (content is not None):  # ask_worker gives the content or what answering raised
        raise broken("ask_worker gives the content or what answering raised")
    return Message(content, reply_to=msg)


# ---------------------------------------------------------------------------------------------- the ClientApp
def _secaggplus_for_secure_train(msg: Message, context: Context, call_next: Callable[..., Message]) -> Message:
    # As fedlit.flower.secagg_client.client_mods (which imports torch): Flower's mod takes every "train" message;
    # the deployment's plain train messages carry no SecAgg+ config.
    if msg.metadata.message_type == MessageType.TRAIN and RECORD_KEY_CONFIGS in msg.content.config_records:
        return secaggplus_mod(msg, context, call_next)
    return call_next(msg, context)


#: fedlit's ClientApp (``[tool.flwr.app.components] clientapp = "fedlit.flower.clientapp:app"``).
app = ClientApp(mods=[_secaggplus_for_secure_train])


@app.query()
def _query(msg: Message, context: Context) -> Message:
    return answer(msg, context)


@app.train()
def _train(msg: Message, context: Context) -> Message:
    return answer(msg, context)


@app.evaluate()
def _evaluate(msg: Message, context: Context) -> Message:
    return answer(msg, context)
