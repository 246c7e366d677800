"""The node worker: one long-lived process per SuperNode that answers the messages fedlit's thin ClientApp
(:mod:`fedlit.flower.clientapp`) forwards, so that torch's imports and the recipe's build are paid once per node and
run instead of once per message.

::

    python -m fedlit.flower.worker --socket PATH [--idle-s 600] [--watch-pid PID]

(the thin ClientApp starts it). It listens on the Unix socket ``PATH`` (writing its pid to ``PATH.pid``) and
answers one connection at a time: the Message and the Context as Flower's protobufs in, the reply's content (or
the text of what answering raised) and the updated ``context.state`` out. The node's client
(:class:`~fedlit.flower.client.ClientRuntime`) is built on the first message of a run and kept for the next ones
of the same run config and node config; every message restores the client's store entry from the snapshots
(:func:`~fedlit.flower.client.snapshots_of`, ``context.state`` or ``state-dir``) and saves it after, exactly as
:func:`~fedlit.flower.client.handle_message` does in a fresh process, so the answers are the same. It exits after
``--idle-s`` seconds without a message, when ``PATH`` is removed or replaced, or when the process ``--watch-pid``
is gone. This module imports only the standard library and flwr until the first message.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import signal
import socket
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

from fedlit.core.files import write_text_atomic
from fedlit.core.processes import pid_alive
from fedlit.flower.clientapp import error_content, recv_frames, send_frames

#: Seconds between the worker's checks of its socket file and of the watched process.
POLL_S = 0.5


class NodeWorker:
    """Answers forwarded messages with the node's client, built once per run config and node config."""

    def __init__(self) -> None:
        self._key: str | None = None
        self._runtime: Any = None
        self._workdir: tempfile.TemporaryDirectory[str] | None = None

    def answer(self, request: list[bytes]) -> list[bytes]:
        """One forwarded message (:func:`fedlit.flower.clientapp.ask_worker`'s frames) answered."""
        from flwr.common.serde import context_from_proto, message_from_proto, recorddict_to_proto
        from flwr.proto.message_pb2 import Context as ProtoContext
        from flwr.proto.message_pb2 import Message as ProtoMessage

        from fedlit.flower import client

        msg = message_from_proto(ProtoMessage.FromString(request[0]))
        context = context_from_proto(ProtoContext.FromString(request[1]))
        raised, reply = None, None
        try:
            runtime = self.runtime(context)
            runtime.snapshots = client.snapshots_of(context)
        except Exception as err:  # noqa: BLE001  (a node that cannot build its client answers why)
            traceback.print_exc()
            reply = error_content(f"{type(err).__name__}: {err}")
        if reply is None:
            try:
                reply = client.answer(runtime, msg, context).content
            except Exception as err:  # noqa: BLE001  (a SecAgg+ turn left out: the thin app raises it for Flower)
                raised = str(err)
        content = b"" if reply is None else recorddict_to_proto(reply).SerializeToString()
        state = recorddict_to_proto(context.state).SerializeToString()
        return [json.dumps({"raised": raised, "state": True}).encode(), content, state]

    def runtime(self, context: Any) -> Any:
        """The node's client for ``context``'s run config and node config, built on first need."""
        from fedlit.flower import client

        key = hashlib.sha256(
            json.dumps([dict(context.run_config), dict(context.node_config)], sort_keys=True, default=str).encode()
        ).hexdigest()
        if key != self._key:
            self.close()
            self._workdir = tempfile.TemporaryDirectory(prefix="fedlit-client-")
            self._runtime = client.runtime_from_context(context, Path(self._workdir.name))
            self._key = key
        return self._runtime

    def close(self) -> None:
        """Forget the client built (a failed build leaves none)."""
        self._key, self._runtime = None, None
        if self._workdir is not None:
            self._workdir.cleanup()
            self._workdir = None


def _alive(pid: int | None) -> bool:
    return pid is None or pid_alive(pid)


def _serve_one(listener: socket.socket, worker: NodeWorker) -> None:
    conn, _ = listener.accept()
    with conn:
        conn.settimeout(None)
        try:
            request = recv_frames(conn)
        except Exception:  # noqa: BLE001  (a caller that went away: nothing to answer)
            traceback.print_exc()
            return
        try:
            reply = worker.answer(request)
        except Exception as err:  # noqa: BLE001  (a request this worker cannot read: the thin app reports it)
            traceback.print_exc()
            from flwr.common.serde import recorddict_to_proto

            detail = f"the node's fedlit worker failed: {type(err).__name__}: {err}"
            reply = [
                json.dumps({"raised": None, "state": False}).encode(),
                recorddict_to_proto(error_content(detail)).SerializeToString(),
                b"",
            ]
        with contextlib.suppress(OSError):
            send_frames(conn, reply)


def serve(path: Path, idle_s: float, watch_pid: int | None = None) -> None:
    """Listen on ``path`` and answer until idle for ``idle_s`` seconds, ``path`` is removed or replaced, or
    ``watch_pid`` is gone."""
    worker = NodeWorker()
    signal.signal(signal.SIGTERM, _exit_on_term)  # as a worker that ends by itself: its socket file goes
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    os.chmod(path, 0o600)  # in a 0700 folder already; the node's user's alone either way
    listener.listen(16)
    inode = os.stat(path).st_ino
    pid_file = Path(f"{path}.pid")
    write_text_atomic(pid_file, f"{os.getpid()}\n")  # a reader never sees it empty
    os.chmod(pid_file, 0o600)
    listener.settimeout(POLL_S)
    last = time.monotonic()
    try:
        while time.monotonic() - last < idle_s and _alive(watch_pid):
            try:
                if os.stat(path).st_ino != inode:
                    break
            except FileNotFoundError:
                break
            try:
                _serve_one(listener, worker)
            except TimeoutError:
                continue
            last = time.monotonic()
        # No new caller finds this socket; those already waiting in its backlog are still answered.
        _unlink_if(path, inode)
        listener.settimeout(0)
        while _alive(watch_pid):
            try:
                _serve_one(listener, worker)
            except (BlockingIOError, TimeoutError):
                break
    finally:
        _unlink_if(path, inode)
        listener.close()
        worker.close()
        with contextlib.suppress(FileNotFoundError):
            if pid_file.read_text().strip() == str(os.getpid()):
                pid_file.unlink()


def _unlink_if(path: Path, inode: int) -> None:
    with contextlib.suppress(FileNotFoundError):
        if os.stat(path).st_ino == inode:  # not a socket a newer worker bound there
            path.unlink()


def _exit_on_term(signum: int, frame: Any) -> None:
    raise SystemExit(0)


def main(argv: list[str] | None = None) -> None:
    """``python -m fedlit.flower.worker``: serve until idle (see the module docstring)."""
    parser = argparse.ArgumentParser(prog="python -m fedlit.flower.worker", description=__doc__.splitlines()[0])
    parser.add_argument("--socket", required=True, help="The Unix socket to listen on (its folder private).")
    parser.add_argument("--idle-s", type=float, default=600.0, help="Exit after this many idle seconds.")
    parser.add_argument("--watch-pid", type=int, default=None, help="Exit once this process is gone.")
    args = parser.parse_args(argv)
    serve(Path(args.socket), args.idle_s, args.watch_pid)


if __name__ == "__main__":
    main()
