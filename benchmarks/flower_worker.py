"""A real deployment's cost per message, with fedlit's node worker and without (``worker=false``), side by side.

Starts a SuperLink and two SuperNodes on 127.0.0.1 (no TLS: the same messages as with it), then runs with ``flwr run``
the app ``fedlit flower-app`` writes for the 2-site quickstart (2 rounds, 1 local epoch) twice: the nodes started
with ``--node-config "client-id=... worker=false"`` (every message's ``flwr-clientapp`` process imports torch and
builds the recipe: fedlit before the worker) and without (the node's worker does it once). Per mode it prints the
run's wall time (``flwr run`` until it returns) and, per message, the time from the SuperNode's ``Receiving:`` log
line to its ``Sending:`` line (stamped here as the lines arrive): Flower's own task launch and polling, the
``flwr-clientapp`` process and fedlit's answer. The first message of a node with the worker also starts the worker.
Then, to split the per-message time: the import time of Flower's ClientApp module, of fedlit's thin ClientApp and of
the in-process one (fresh interpreters), and a round-1 ``train`` answered by a kept client in this process vs
through the thin app's socket to a warm worker (what forwarding adds). Nothing is asserted. With
``FLWR_SUPEREXEC_TASK_POLL_INTERVAL=0.2``; the machine's load is printed. About 6 minutes on 2 cores loaded 16 times.

Run: python benchmarks/flower_worker.py
"""

from __future__ import annotations

import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
BIN = Path(sys.executable).parent
OVERRIDES = "--data.init_args.num_clients 2 --federation.rounds 2 --federation.local_epochs 1"
CLIENTS = ["site_0", "site_1"]
LINE = re.compile(r"(Receiving|Sending): (\w+(?:\.\w+)?) message")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _stamp(stream, log: Path, events: list[tuple[float, str, str]]) -> None:
    with open(log, "w") as out:
        for line in stream:
            out.write(line)
            found = LINE.search(line)
            if found:
                events.append((time.monotonic(), found.group(1), found.group(2)))


def deploy(folder: Path, node_extra: str) -> dict:
    """One deployed run; its wall time and every message's receive-to-send time per node."""
    from fedlit.flower.app import write_app

    folder.mkdir(parents=True)
    app = write_app(
        ROOT / "recipes" / "quickstart.yaml",
        folder / "app",
        overrides=OVERRIDES,
        out_dir=str(folder / "run"),
        client_ids=",".join(CLIENTS),
        connect_timeout=300.0,
    ).parent
    home = folder / "flwr_home"
    home.mkdir()
    port = _free_port()
    (home / "config.toml").write_text(
        f'[superlink]\ndefault = "bench"\n\n[superlink.bench]\naddress = "127.0.0.1:{port}"\ninsecure = true\n'
    )
    env = {
        **os.environ,
        "FLWR_HOME": str(home),
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        "FLWR_SUPEREXEC_TASK_POLL_INTERVAL": "0.2",
        "OMP_NUM_THREADS": "1",
    }
    processes, events = [], {c: [] for c in CLIENTS}
    try:
        processes.append(
            subprocess.Popen(
                [
                    str(BIN / "flower-superlink"),
                    "--insecure",
                    "--port",
                    str(port),
                    "--disable-runtime-dependency-installation",
                ],
                env=env,
                cwd=folder,
                stdout=open(folder / "superlink.log", "w"),
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        )
        for client in CLIENTS:
            node = subprocess.Popen(
                [
                    str(BIN / "flower-supernode"),
                    "--insecure",
                    "--superlink",
                    f"127.0.0.1:{port}",
                    "--port",
                    str(_free_port()),
                    "--node-config",
                    f"client-id='{client}'{node_extra}",
                ],
                env=env,
                cwd=folder,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                start_new_session=True,
            )
            processes.append(node)
            threading.Thread(
                target=_stamp, args=(node.stdout, folder / f"{client}.log", events[client]), daemon=True
            ).start()
        time.sleep(5)
        started = time.monotonic()
        done = subprocess.run(
            [str(BIN / "flwr"), "run", str(app), "bench", "--stream"],
            env=env,
            cwd=folder,
            capture_output=True,
            text=True,
            timeout=3000,
        )
        wall = time.monotonic() - started
        if done.returncode != 0 or not (folder / "run" / "results.json").is_file():
            raise SystemExit(f"flwr run failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    finally:
        for p in processes:
            try:
                os.killpg(p.pid, 15)
            except ProcessLookupError:
                pass
        for p in processes:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, 9)
    messages = {}
    for client, found in events.items():
        pending, pairs = {}, []
        for stamp, kind, message_type in found:
            if kind == "Receiving":
                pending[message_type] = stamp
            elif message_type in pending:
                pairs.append((message_type, stamp - pending.pop(message_type)))
        messages[client] = pairs
    return {"wall": wall, "messages": messages}


def _import_seconds(module: str, repeat: int = 3) -> float:
    """Median wall seconds of ``python -c "import module"`` (a fresh interpreter, as flwr-clientapp loads the app)."""
    times = []
    for _ in range(repeat):
        started = time.monotonic()
        subprocess.run(
            [sys.executable, "-c", f"import {module}"], check=True, env={**os.environ, "PYTHONPATH": str(ROOT)}
        )
        times.append(time.monotonic() - started)
    return statistics.median(times)


def forwarding(repeat: int = 5) -> tuple[float, float]:
    """Median seconds of a round-1 ``train`` of site_0 answered by a kept client in this process and through the
    thin app's socket to a warm worker: the difference is what forwarding adds (serde, socket, context.state)."""
    from flwr.app import ConfigRecord, Context, Message, RecordDict
    from flwr.supercore.task_identity import TaskIdentity

    from fedlit.cli import prepare
    from fedlit.flower import client, clientapp, codec

    TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id = 7, 0, 0
    with tempfile.TemporaryDirectory(prefix="fw", dir="/tmp") as tmp:
        shared = prepare(
            [
                "fit",
                "--config",
                str(ROOT / "recipes" / "quickstart.yaml"),
                *OVERRIDES.split(),
                "--out_dir",
                f"{tmp}/probe",
            ]
        ).federation
        shared.setup()
        received = {n: t.detach().clone() for n, t in shared.module.named_tensors("shared").items()}
        content = RecordDict({"task": ConfigRecord({"client-id": "site_0", "round": 1, "checkpointed": 0})})
        for name, tree in (("received", received), ("extras", {}), ("schedule", None)):
            codec.put_tree(content, name, tree)
        run_config = {
            "recipe": (ROOT / "recipes" / "quickstart.yaml").read_text(),
            "overrides": OVERRIDES,
            "out-dir": f"{tmp}/run",
        }

        def context() -> Context:
            return Context(
                run_id=7,
                node_id=101,
                node_config={"client-id": "site_0", "worker-idle-s": 60},
                state=RecordDict(),
                run_config=run_config,
            )

        msg = Message(content, 101, "train", group_id="1")
        runtime = client.runtime_from_context(context(), Path(tmp))
        inline, forwarded = [], []
        clientapp.answer(Message(RecordDict(), 101, "query", group_id="q"), context(), watch_pid=os.getpid())
        path = clientapp.socket_path(context())
        try:
            for _ in range(repeat):
                ctx = context()
                started = time.monotonic()
                runtime.snapshots = client.snapshots_of(ctx)
                client.answer(runtime, msg, ctx)
                inline.append(time.monotonic() - started)
                started = time.monotonic()
                clientapp.answer(msg, context(), watch_pid=os.getpid())
                forwarded.append(time.monotonic() - started)
        finally:
            os.kill(int(Path(f"{path}.pid").read_text()), 15)  # SIGTERM: it removes its socket and pid files
    return statistics.median(inline), statistics.median(forwarded)


def main() -> None:
    print(
        f"load: {os.getloadavg()[0]:.1f} {os.getloadavg()[1]:.1f} {os.getloadavg()[2]:.1f} on {os.cpu_count()} "
        "CPUs (1, 5, 15 min)",
        flush=True,
    )
    results = {}
    with tempfile.TemporaryDirectory(prefix="fedlit-bench-") as tmp:
        for name, extra in (("per-message process (worker=false)", " worker=false"), ("node worker", "")):
            results[name] = deploy(Path(tmp) / name.split()[0], extra)
            print(f"{name}: done in {results[name]['wall']:.1f} s", flush=True)
    print(f"load after: {os.getloadavg()[0]:.1f}")
    imports = {m: _import_seconds(m) for m in ("flwr.clientapp", "fedlit.flower.clientapp", "fedlit.flower.client")}
    inline, forwarded = forwarding()
    print(f"load after: {os.getloadavg()[0]:.1f}")
    print("\n| mode | flwr run wall s | messages per node | first message s | later messages s (median, max) |")
    print("|---|---:|---:|---:|---:|")
    for name, result in results.items():
        per_node = list(result["messages"].values())
        firsts = [pairs[0][1] for pairs in per_node if pairs]
        later = [t for pairs in per_node for _, t in pairs[1:]]
        print(
            f"| {name} | {result['wall']:.1f} | {len(per_node[0])} | {statistics.median(firsts):.1f} | "
            f"{statistics.median(later):.1f}, {max(later):.1f} |"
        )
    for name, result in results.items():
        for client, pairs in result["messages"].items():
            print(f"{name} {client}: " + ", ".join(f"{t} {s:.1f}" for t, s in pairs))

    print("\nimport in a fresh interpreter, median s: " + ", ".join(f"{m} {t:.2f}" for m, t in imports.items()))
    print(
        f"round-1 train of site_0, median s: kept client in this process {inline:.3f}, through the thin app to a "
        f"warm worker {forwarded:.3f} (forwarding adds {forwarded - inline:.3f})"
    )


if __name__ == "__main__":
    main()
