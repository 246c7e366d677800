"""Measure what the federated loop costs: (a) its time over a plain Fabric loop, (b) memory per added client.

(a) The same local training (same module, same batches, same optimizer, same number of steps) run twice in one
    process: once through ``Federation`` (client store swaps, hooks, strategy loss, update copies) and once as a
    plain Fabric loop. Evaluation and checkpoints are left out of both: they are separate phases with their own
    ``system/*_seconds`` logs. Printed: seconds of each and their ratio.
(b) Peak resident memory of one federated round with 2, 8 and 32 clients of a ViT-Small-sized frozen backbone
    (22M parameters) with LoRA (r=8) on its attention projections and a personal head; each count in a fresh
    process. Printed: peak RSS, the client store's bytes, and the memory per added client next to one client's
    personal state and a backbone copy (what a deep-copy-per-client design would add).
(c) The same for segmentation with FedSCA on the Medical-SAM-Adapter ViT-B (SAM's 12-block image encoder frozen,
    randomly initialized; 24 adapters and the mask decoder trained; the lowest adapter shared, the rest personal)
    at 64-pixel inputs, one step per client, with 2, 6 and 12 clients.

Run: python benchmarks/loop_overhead.py   (about 4 minutes on a 2-core CPU; --skip-sam leaves (c) out)
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
import warnings

import torch
from lightning.fabric import Fabric

from fedlit import FedAvg, Federation, RoleRule
from fedlit.data import SyntheticImages
from fedlit.models import LoRA, SmallCNN, TimmBackbone
from fedlit.tasks import ClassificationModule


def overhead(rounds: int, clients: int, repeats: int = 3) -> dict[str, float]:
    """(a): seconds of local training through the federation vs. a plain Fabric loop on the same batches.

    The two are interleaved ``repeats`` times and the fastest of each is kept, so load from other processes
    hits both alike.
    """
    torch.manual_seed(0)
    data = SyntheticImages(num_clients=clients, samples_per_client=400, image_size=16, seed=0, batch_size=32)
    module = ClassificationModule(backbone=SmallCNN(width=16), num_classes=3,
                                  roles=[RoleRule("backbone.*", "shared")], lr=0.05, momentum=0.9)
    out = tempfile.mkdtemp()
    federation = Federation(module, data, FedAvg(), rounds=rounds, out_dir=out, progress_bar=False)
    federation.setup()
    fabric = Fabric(accelerator="cpu", devices=1)
    wrapped = fabric.setup_module(module)

    def federated() -> None:
        for server_round in range(1, rounds + 1):
            updates = [federation.fit_client(server_round, c).update for c in data.client_ids]
            federation.strategy.aggregate(server_round, updates)

    def plain() -> None:
        for server_round in range(1, rounds + 1):
            for client_id in data.client_ids:
                loader = data.train_dataloader(client_id, torch.Generator().manual_seed(server_round))
                optimizer = fabric.setup_optimizers(module.configure_optimizers())
                module.train()
                for batch_idx, batch in enumerate(loader):
                    loss = wrapped.training_step(fabric.to_device(batch), batch_idx)["loss"]
                    fabric.backward(loss)
                    optimizer.step()
                    optimizer.zero_grad(set_to_none=True)

    times: dict[str, list[float]] = {"federation_s": [], "plain_fabric_s": []}
    for _ in range(repeats):
        for key, fn in (("federation_s", federated), ("plain_fabric_s", plain)):
            start = time.perf_counter()
            fn()
            times[key].append(time.perf_counter() - start)
    best = {k: min(v) for k, v in times.items()}
    return {**best, "ratio": best["federation_s"] / best["plain_fabric_s"]}


def memory(num_clients: int) -> dict[str, float]:
    """(b), in this process: one round of ``num_clients`` clients with a ViT-Small + LoRA; peak RSS."""
    import resource

    warnings.simplefilter("ignore")
    torch.manual_seed(0)
    backbone = TimmBackbone(name="vit_small_patch16_224", lora=LoRA(r=8, alpha=16),
                            model_args={"img_size": 32, "in_chans": 1})
    module = ClassificationModule(backbone=backbone, num_classes=3, lr=0.01,
                                  roles=[RoleRule("backbone.*lora_*", "shared"), RoleRule("head.*", "personal")])
    data = SyntheticImages(num_clients=num_clients, samples_per_client=10, image_size=32, seed=0, batch_size=4)
    with tempfile.TemporaryDirectory() as out:
        federation = Federation(module, data, FedAvg(), rounds=1, local_steps=1, out_dir=out, progress_bar=False)
        federation.setup()
        updates = [federation.fit_client(1, c).update for c in data.client_ids]
        federation.strategy.aggregate(1, updates)
        personal = federation.store.nbytes(data.client_ids[0])
        frozen = sum(t.numel() * t.element_size() for t in module.named_tensors("frozen").values())
        return {"clients": num_clients, "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                "store_mb": federation.store.nbytes() / 2**20, "client_state_mb": personal / 2**20,
                "backbone_mb": frozen / 2**20}


def memory_sam(num_clients: int) -> dict[str, float]:
    """(c), in this process: one FedSCA round of ``num_clients`` clients on the Medical-SAM-Adapter ViT-B."""
    import resource

    from fedlit.data import SyntheticSegmentation
    from fedlit.models import SamAdapter
    from fedlit.strategies import FedSCA
    from fedlit.tasks import SegmentationModule

    warnings.simplefilter("ignore")
    torch.manual_seed(0)
    module = SegmentationModule(network=SamAdapter(variant="vit_b", image_size=64), num_classes=1, lr=1e-4)
    data = SyntheticSegmentation(num_clients=num_clients, samples_per_client=4, image_size=64, seed=0, batch_size=1)
    with tempfile.TemporaryDirectory() as out:
        federation = Federation(module, data, FedSCA(num_shared_adapters=1), rounds=1, local_steps=1, out_dir=out,
                                progress_bar=False)
        federation.setup()
        updates = [federation.fit_client(1, c).update for c in data.client_ids]
        federation.strategy.aggregate(1, updates)
        personal = federation.store.nbytes(data.client_ids[0])
        frozen = sum(t.numel() * t.element_size() for t in module.named_tensors("frozen").values())
        return {"clients": num_clients, "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                "store_mb": federation.store.nbytes() / 2**20, "client_state_mb": personal / 2**20,
                "backbone_mb": frozen / 2**20}


def _memory_table(kind: str, counts: tuple[int, ...], title: str) -> None:
    rows = []
    for n in counts:
        out = subprocess.run([sys.executable, __file__, f"--memory-child{kind}", str(n)], capture_output=True,
                             text=True, check=True)
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    print(title)
    print("    clients | peak RSS MB | client store MB")
    for row in rows:
        print(f"    {row['clients']:7d} | {row['peak_rss_mb']:11.1f} | {row['store_mb']:.2f}")
    per_client = (rows[-1]["peak_rss_mb"] - rows[0]["peak_rss_mb"]) / (rows[-1]["clients"] - rows[0]["clients"])
    print(f"    memory per added client: {per_client:.2f} MB measured ({rows[0]['clients']} -> {rows[-1]['clients']} "
          f"clients); one client's stored state {rows[0]['client_state_mb']:.2f} MB; a backbone copy would be "
          f"{rows[0]['backbone_mb']:.1f} MB")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--memory-child", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--memory-child-sam", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--skip-sam", action="store_true", help="Leave out (c), the Medical-SAM-Adapter table.")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--clients", type=int, default=4)
    args = parser.parse_args()
    if args.memory_child:
        print(json.dumps(memory(args.memory_child)))
        return
    if args.memory_child_sam:
        print(json.dumps(memory_sam(args.memory_child_sam)))
        return

    a = overhead(args.rounds, args.clients)
    print(f"(a) local training, {args.rounds} rounds x {args.clients} clients, SmallCNN on 16x16 synthetic images:")
    print(f"    federation {a['federation_s']:.2f} s, plain Fabric loop {a['plain_fabric_s']:.2f} s, "
          f"ratio {a['ratio']:.2f}")

    _memory_table("", (2, 8, 32),
                  "(b) one round, ViT-Small (frozen, 22M params) + LoRA r=8 shared + personal head, CPU:")
    if not args.skip_sam:
        _memory_table("-sam", (2, 6, 12), "(c) one FedSCA round (L = 1), Medical-SAM-Adapter ViT-B (frozen encoder, 24 "
                      "adapters + mask decoder trained), 64-pixel inputs, CPU:")


if __name__ == "__main__":
    main()
