"""The cost of one message to fedlit's Flower ClientApp, each in a fresh process, as a flwr 1.41 SuperNode runs it.

Parent (not timed): writes the run config as `fedlit flower-app` does, runs the real ServerApp code (run_server) on a
capturing transport (queries answered by the real ClientApp) to capture the query and round-1 `train` contents the
server's FlowerExecutor sends to site_0, and deflates each Message + Context as the SuperNode hands them over.
Child (`--child KIND`), timed phases, as flwr's run_clientapp runs them:
  (a)   imports: flwr's serde/inflatable + fedlit.flower.client (torch, lightning, flwr), i.e. load_app(...:app)
  recv  inflate Message + Context from bytes (flwr-clientapp's pull_task_input; in none of a, b, c)
  (b)   app(message, context) until the node's client is built (the recipe's objects, set up, its ClientContext)
  (c)   rest of app(message, context): the message's work (train round 1 / answer the query) and the state save
  (d)   subprocess wall time (parent side) = up (interpreter start) + a + recv + b + c + exit (interpreter teardown)
Each child starts on an idle machine; noise = CPU-seconds others used meanwhile (> NOISE: that child is redone).
Nothing is asserted: this prints figures (docs/deployment.md keeps them). About 2 minutes on a quiet 2-core CPU.

Run: python benchmarks/flower_message.py [N]     (N fresh processes per message type, default 5)
"""

import contextlib
import json
import os
import pickle
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

OVERRIDES = "--data.init_args.num_clients 2 --federation.rounds 1"
CLIENT, NODE_ID, RUN_ID, OUT, NOISE = "site_0", 101, 7, "BENCH_RESULT ", 0.5


def child(kind: str, blob_file: str) -> None:
    t = {"start": time.perf_counter()}
    # ---- (a) imports: flwr-clientapp's own (serde, inflatable) + what load_app("fedlit.flower.client:app") imports
    from flwr.app import Message
    from flwr.common.serde import context_from_proto
    from flwr.proto.message_pb2 import Context as ProtoContext
    from flwr.proto.message_pb2 import ObjectTree
    from flwr.supercore.inflatable.inflatable_utils import pull_and_inflate_object_from_tree
    from flwr.supercore.task_identity import TaskIdentity

    import fedlit.flower.client as client

    t["a"] = time.perf_counter()
    # ---- recv: the SuperNode's task input, inflated as in flwr.supernode.runtime.run_clientapp.pull_task_input
    blob = pickle.loads(Path(blob_file).read_bytes())[kind]
    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, RUN_ID, NODE_ID
    context = context_from_proto(ProtoContext.FromString(blob["context"]))
    tree = ObjectTree.FromString(blob["tree"])
    message = pull_and_inflate_object_from_tree(tree, blob["objects"].__getitem__, lambda _: None, return_type=Message)
    message.metadata.__dict__["_message_id"] = tree.object_id
    t["recv"] = time.perf_counter()
    # ---- phase mark: handle_message builds the runtime (runtime_from_context), then snapshots_of, then answers
    # (_answer): the end of snapshots_of marks "built" inside the real ClientApp call
    snapshots_of = client.snapshots_of

    def timed_snapshots_of(ctx):
        out = snapshots_of(ctx)
        t["built"] = time.perf_counter()
        return out

    client.snapshots_of = timed_snapshots_of
    # ---- (b)+(c): the real ClientApp call, as run_clientapp does it
    t["call"] = time.perf_counter()
    reply = client.app(message=message, context=context)
    t["done"] = time.perf_counter()
    records = reply.content.config_records
    assert not reply.has_error() and "error" not in records, reply.content
    steps = (client.codec.get_tree(reply.content, "metrics") or {}).get("steps") if kind == "train" else None
    print(
        OUT
        + json.dumps(
            {
                "a": t["a"] - t["start"],
                "recv": t["recv"] - t["a"],
                "b": t["built"] - t["call"],
                "c": t["done"] - t["built"],
                "t_start": t["start"],
                "t_done": time.perf_counter(),
                "check": {"steps": steps, "examples": (records.get("turn") or records["query"])["num-examples"]},
            }
        ),
        flush=True,
    )  # exit: from t_done until the process is gone


def prepare_messages(path: Path) -> None:
    """Run config as flower-app writes it; the server's real query/train contents; deflated Message + Context."""
    import tomllib
    import torch
    from flwr.app import Context, Message, RecordDict
    from flwr.common.serde import context_to_proto
    from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects, get_object_tree
    from flwr.supercore.task_identity import TaskIdentity

    import fedlit
    from fedlit.flower.app import write_app
    from fedlit.flower.client import handle_message
    from fedlit.flower.server import run_server

    print("fedlit from", fedlit.__file__, "| torch threads:", torch.get_num_threads(), flush=True)
    toml = write_app(
        Path(fedlit.__file__).parents[1] / "recipes/quickstart.yaml", path.parent / "app", overrides=OVERRIDES
    )  # the server's run folder: <tmp>/app/run
    run_config = tomllib.loads(toml.read_text())["tool"]["flwr"]["app"]["config"]
    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 0, RUN_ID, 0  # a ServerApp process
    nodes = {NODE_ID: CLIENT, NODE_ID + 1: "site_1"}
    contexts = {
        n: Context(run_id=RUN_ID, node_id=n, node_config={"client-id": c}, state=RecordDict(), run_config=run_config)
        for n, c in nodes.items()
    }
    sent: dict[str, tuple[str, RecordDict]] = {}
    Captured = type("Captured", (Exception,), {})  # stops the server once its round-1 train message is captured

    def exchange(messages, group, timeout):  # the server's Transport: queries answered by the real ClientApp
        sent.update({kind: (group, content) for node, kind, content in messages if nodes[node] == CLIENT})
        if "train" in sent:
            raise Captured
        return [handle_message(Message(c, n, k, group_id=group), contexts[n]).content for n, k, c in messages]

    with contextlib.suppress(Captured):
        run_server(SimpleNamespace(node_ids=lambda: list(nodes), exchange=exchange), run_config)
    out = {}
    for kind, (group, content) in sent.items():
        msg = Message(content, NODE_ID, kind, group_id=group)
        ctx = Context(
            run_id=RUN_ID, node_id=NODE_ID, node_config={"client-id": CLIENT}, state=RecordDict(), run_config=run_config
        )  # what the SuperNode holds before the node's first message
        out[kind] = {
            "tree": get_object_tree(msg).SerializeToString(),
            "context": context_to_proto(ctx).SerializeToString(),
            "objects": {o: v.deflate() for o, v in get_all_nested_objects(msg).items()},
        }
    path.write_bytes(pickle.dumps(out))


def busy() -> float:  # CPU-seconds the machine (all cores) has been busy since boot (/proc/stat: not idle/iowait)
    v = [int(x) for x in open("/proc/stat").readline().split()[1:8]]
    return (sum(v) - v[3] - v[4]) / os.sysconf("SC_CLK_TCK")


def run_child(kind: str, blob_file: Path) -> dict:
    for _ in range(300):  # wait (at most 10 min) until the machine is idle: < 10% of a core busy over 2 s
        b0 = busy()
        time.sleep(2)
        if busy() - b0 < 0.2:
            break
    r0, b0, t0 = resource.getrusage(resource.RUSAGE_CHILDREN), busy(), time.perf_counter()
    proc = subprocess.run([sys.executable, __file__, "--child", kind, str(blob_file)], capture_output=True, text=True)
    d, b1, r1 = time.perf_counter() - t0, busy(), resource.getrusage(resource.RUSAGE_CHILDREN)
    line = [x for x in proc.stdout.splitlines() if x.startswith(OUT)]
    if proc.returncode or not line:
        sys.exit(f"child {kind} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    row = {**json.loads(line[-1][len(OUT) :]), "d": d}  # perf_counter is CLOCK_MONOTONIC: one clock for both
    own = r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime
    return {**row, "up": row["t_start"] - t0, "exit": t0 + d - row["t_done"], "noise": b1 - b0 - own, "cpu": own}


def main(n: int, blob_file: Path) -> None:
    prepare_messages(blob_file)
    print("uptime before:", subprocess.getoutput("uptime"), flush=True)
    rows: dict[str, list[dict]] = {}
    cols = ("a", "b", "c", "d", "up", "recv", "exit", "cpu", "noise")
    for kind in ("train", "query"):
        for i in range(n):
            for _ in range(5):
                row = run_child(kind, blob_file)
                print(f"{kind} #{i}: " + " ".join(f"{k}={row[k]:.3f}" for k in cols) + f" {row['check']}", flush=True)
                if row["noise"] < NOISE:  # else: other processes used the CPU meanwhile: redo this child
                    break
            rows.setdefault(kind, []).append(row)
    print("uptime after:", subprocess.getoutput("uptime"))
    print(f"\n{'message':8} {'stat':6} " + " ".join(f"{c:>7}" for c in cols) + "   (seconds; cpu: child CPU-s)")
    for kind, rs in rows.items():
        for name, f in (("median", statistics.median), ("min", min)):
            print(f"{kind:8} {name:6} " + " ".join(f"{f([r[c] for r in rs]):7.3f}" for c in cols))


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        child(sys.argv[2], sys.argv[3])
    else:  # everything the parent writes (messages, app folder, server run folder) goes to one temporary folder
        with tempfile.TemporaryDirectory(prefix="flower-bench-") as tmp:
            main(int(sys.argv[1]) if len(sys.argv) > 1 else 5, Path(tmp) / "messages.pkl")
