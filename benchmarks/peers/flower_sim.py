"""The Flower column: the same FedAvg run as a Flower simulation (``flwr.simulation.run_simulation``, Ray backend).

A ServerApp runs Flower's own ``FedAvg`` (Message API) over the trainable tensors (LoRA and the head) for the
recipe's rounds, sampling ``federation.clients_per_round`` of the N SuperNodes (all by default) and evaluating none;
a ClientApp trains node ``partition-id``'s client with the plain loop of :func:`workload.local_train` and replies
with its tensors and ``num-examples``. Each Ray actor builds the recipe's objects once and keeps them (the model
is not rebuilt per message: Flower at its fastest). Every actor takes ``num_cpus = federation.threads`` and Ray is
given the same count, so one client trains at a time on as many threads as the floor's: Ray does not oversubscribe
the cores. Prints one JSON line: ``{"round_seconds": [...]}`` (from sending a round's train messages to its
aggregate).

Needs the benchmark extra (``pip install -e ".[bench]"``: ``flwr[simulation]``, i.e. Ray).
Run (the benchmark does): python benchmarks/peers/flower_sim.py RECIPE [fedlit fit overrides...]
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

import workload

#: The recipe and overrides, for the Ray actors (they inherit the driver's environment).
ENV = "FEDLIT_PEERS_RECIPE"
_objects: dict[str, Any] = {}  # this process's objects, built on first use
_stamps: list[tuple[str, float]] = []  # (configure | aggregate, perf_counter) of the server's rounds
_replies: list[int] = []  # the clients that trained in each round (replies without an error)


def _built() -> workload.Objects:
    if "objects" not in _objects:
        recipe, *overrides = json.loads(os.environ[ENV])
        _objects["objects"] = workload.build(recipe, overrides)
    return _objects["objects"]


def _apps() -> tuple[Any, Any]:
    import torch
    from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
    from flwr.clientapp import ClientApp
    from flwr.serverapp import Grid, ServerApp
    from flwr.serverapp.strategy import FedAvg

    client_app = ClientApp()

    @client_app.train()
    def train(msg: Message, context: Context) -> Message:
        objects = _built()
        client_id = objects.data.train_client_ids[int(context.node_config["partition-id"])]
        received = msg.content["arrays"].to_torch_state_dict()
        trainable = objects.trainable
        with torch.no_grad():
            for name, tensor in trainable.items():
                tensor.copy_(received[name])
        examples = workload.local_train(objects, client_id, int(msg.content["config"]["server-round"]))
        state = {n: t.detach().clone() for n, t in trainable.items()}
        return Message(
            RecordDict({"arrays": ArrayRecord(state), "metrics": MetricRecord({"num-examples": examples})}),
            reply_to=msg,
        )

    class TimedFedAvg(FedAvg):
        def configure_train(self, server_round: int, arrays: Any, config: Any, grid: Grid) -> Any:
            _stamps.append(("configure", time.perf_counter()))
            config["server-round"] = server_round
            return super().configure_train(server_round, arrays, config, grid)

        def aggregate_train(self, server_round: int, replies: Any) -> Any:
            replies = list(replies)
            _replies.append(sum(not r.has_error() for r in replies))
            result = super().aggregate_train(server_round, replies)
            _stamps.append(("aggregate", time.perf_counter()))
            return result

    server_app = ServerApp()

    @server_app.main()
    def main(grid: Grid, context: Context) -> None:
        objects = _built()
        settings, clients = objects.settings, len(objects.data.train_client_ids)
        per_round = settings.clients_per_round
        fraction = 1.0 if per_round is None else per_round if isinstance(per_round, float) else per_round / clients
        # min_train_nodes: Flower's FedAvg takes its fraction of the nodes connected when the round starts, before
        # it waits for min_available_nodes; in a simulation some have not registered yet (it sampled 1 of 20 here)
        strategy = TimedFedAvg(
            fraction_train=fraction,
            min_train_nodes=workload.num_clients(objects),
            fraction_evaluate=0.0,
            min_evaluate_nodes=0,
            min_available_nodes=clients,
        )
        initial = {n: t.detach().clone() for n, t in objects.trainable.items()}
        strategy.start(grid=grid, initial_arrays=ArrayRecord(initial), num_rounds=settings.rounds)

    return server_app, client_app


def main(argv: list[str]) -> None:
    from flwr.simulation import run_simulation

    os.environ[ENV] = json.dumps(argv)
    objects = _built()
    threads = objects.settings.threads or 2
    server_app, client_app = _apps()
    run_simulation(
        server_app=server_app,
        client_app=client_app,
        num_supernodes=len(objects.data.train_client_ids),
        backend_config={
            "client_resources": {"num_cpus": threads, "num_gpus": 0.0},
            "init_args": {"num_cpus": threads, "num_gpus": 0, "log_to_driver": False},
        },
    )
    starts = [t for kind, t in _stamps if kind == "configure"]
    ends = [t for kind, t in _stamps if kind == "aggregate"]
    expected = workload.num_clients(objects)
    if any(n != expected for n in _replies):
        raise SystemExit(
            f"Flower aggregated {_replies} clients' replies in its rounds, expected {expected} each: "
            "a ClientApp failed (see Ray's log)"
        )
    print(
        json.dumps(
            {"round_seconds": [end - start for start, end in zip(starts, ends, strict=True)], "clients": _replies}
        )
    )


if __name__ == "__main__":
    import flower_sim  # this file under its module name, so that Ray's actors import the apps, not unpickle copies

    flower_sim.main(sys.argv[1:])
