"""The floor: FedAvg written as a plain PyTorch loop on one model, the least a federated round can cost.

Every round: each selected client loads the server's LoRA and head into the one model, trains (the plain loop of
:func:`workload.local_train`) and adds its tensors, weighted by its train examples, to a running sum; the sum over the
total weight is the next server state. Nothing is copied per client but the trained tensors, nothing is logged,
evaluated or saved. On a GPU the loop runs there (each round timed to its last kernel). Prints one JSON line:
``{"round_seconds": [...], "round_flops": F, "gpu_peak_mib": M}``: F the FLOPs of a round's training, counted after
the timed rounds on one batch (:func:`workload.flops_per_sample`) times the samples a round trains on (the mean
over rounds); M the peak of ``torch.cuda.max_memory_allocated`` (null on the CPU).

Run (the benchmark does): python benchmarks/peers/floor.py RECIPE [fedlit fit overrides...]
"""

from __future__ import annotations

import json
import sys
import time

import torch
import workload


def main(argv: list[str]) -> None:
    objects = workload.build(argv[0], argv[1:])
    trainable = objects.trainable
    server = {n: t.detach().clone() for n, t in trainable.items()}
    seconds = []
    for server_round in range(1, objects.settings.rounds + 1):
        start = time.perf_counter()
        total, sums = 0, {n: torch.zeros_like(t) for n, t in server.items()}
        for client_id in workload.selected(objects, server_round):
            with torch.no_grad():
                for name, tensor in trainable.items():
                    tensor.copy_(server[name])
            weight = workload.local_train(objects, client_id, server_round)
            with torch.no_grad():
                for name, tensor in trainable.items():
                    sums[name].add_(tensor, alpha=weight)
            total += weight
        server = {n: s / total for n, s in sums.items()}
        if objects.device.type == "cuda":
            torch.cuda.synchronize(objects.device)
        seconds.append(time.perf_counter() - start)
    cuda = objects.device.type == "cuda"
    gpu_peak = torch.cuda.max_memory_allocated(objects.device) / 2**20 if cuda else None
    client = workload.selected(objects, 1)[0]
    flops = workload.flops_per_sample(objects, client) * objects.samples / objects.settings.rounds
    print(json.dumps({"round_seconds": seconds, "round_flops": flops, "gpu_peak_mib": gpu_peak}))


if __name__ == "__main__":
    main(sys.argv[1:])
