"""Measure what the federated loop costs: (a) its time over a plain Fabric loop, (b)-(d) memory per added client.

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
(d) The model of (b) under the personalized strategies that keep per-client state beside the store's entry:
    one round of APPLE and one of FedMetaMed with 2, 10 and 20 clients. Printed besides: the bytes of every tensor
    alive after the round (what is kept, without the allocator's share of the RSS), the strategies' per-client
    state in the store (APPLE's ``p_i`` and personalized model, FedMetaMed's personal model), the server's
    per-client state (APPLE's N cores, FedMetaMed's N Fourier mixes), one client's own tensors (store entry +
    strategy state + its share of the server's state) and what one client downloads per round.

Run: python benchmarks/loop_overhead.py   (about 9 minutes on a 2-core CPU, (d) about 4.5; --skip-sam leaves (c) out,
--skip-personalized (d))
"""

from __future__ import annotations

import argparse
import gc
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
    module = ClassificationModule(
        backbone=SmallCNN(width=16), num_classes=3, roles=[RoleRule("backbone.*", "shared")], lr=0.05, momentum=0.9
    )
    out = tempfile.mkdtemp()
    federation = Federation(module, data, FedAvg(), rounds=rounds, out_dir=out, progress_bar=False)
    federation.setup()
    fabric = Fabric(accelerator="cpu", devices=1)
    wrapped = fabric.setup_module(module)

    def federated() -> None:
        for server_round in range(1, rounds + 1):
            updates = [federation.fit_client(server_round, c).update for c in data.client_ids]
            federation.strategy.global_state = federation.strategy.aggregate(server_round, updates)  # as the loop

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


def _vit_lora() -> ClassificationModule:
    """ViT-Small (frozen, randomly initialized, 32x32 grey inputs) + LoRA r=8 shared + a personal 3-class head."""
    backbone = TimmBackbone(
        name="vit_small_patch16_224", lora=LoRA(r=8, alpha=16), model_args={"img_size": 32, "in_chans": 1}
    )
    return ClassificationModule(
        backbone=backbone,
        num_classes=3,
        lr=0.01,
        roles=[RoleRule("backbone.*lora_*", "shared"), RoleRule("head.*", "personal")],
    )


def _one_round(module, data, strategy, out: str) -> tuple[Federation, list]:
    """Set up a federation and run one local step per client and one aggregation; the federation and the turns."""
    federation = Federation(module, data, strategy, rounds=1, local_steps=1, out_dir=out, progress_bar=False)
    federation.setup()
    federation.fabric.call("on_fit_start", trainer=federation.server_context(), pl_module=module)
    turns = [federation.fit_client(1, c) for c in data.client_ids]
    strategy.global_state = strategy.aggregate(1, [t.update for t in turns])  # as the loop stores it
    return federation, turns


def _rss_and_store(federation: Federation, module) -> dict[str, float]:
    import resource

    frozen = sum(t.numel() * t.element_size() for t in module.named_tensors("frozen").values())
    return {
        "clients": len(federation.client_ids),
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "store_mb": federation.store.nbytes() / 2**20,
        "client_state_mb": federation.store.nbytes(federation.client_ids[0]) / 2**20,
        "backbone_mb": frozen / 2**20,
    }


def memory(num_clients: int) -> dict[str, float]:
    """(b), in this process: one round of ``num_clients`` clients with a ViT-Small + LoRA; peak RSS."""
    warnings.simplefilter("ignore")
    torch.manual_seed(0)
    module = _vit_lora()
    data = SyntheticImages(num_clients=num_clients, samples_per_client=10, image_size=32, seed=0, batch_size=4)
    with tempfile.TemporaryDirectory() as out:
        federation, _ = _one_round(module, data, FedAvg(), out)
        return _rss_and_store(federation, module)


def memory_sam(num_clients: int) -> dict[str, float]:
    """(c), in this process: one FedSCA round of ``num_clients`` clients on the Medical-SAM-Adapter ViT-B."""
    from fedlit.data import SyntheticSegmentation
    from fedlit.models import SamAdapter
    from fedlit.strategies import FedSCA
    from fedlit.tasks import SegmentationModule

    warnings.simplefilter("ignore")
    torch.manual_seed(0)
    module = SegmentationModule(network=SamAdapter(variant="vit_b", image_size=64), num_classes=1, lr=1e-4)
    data = SyntheticSegmentation(num_clients=num_clients, samples_per_client=4, image_size=64, seed=0, batch_size=1)
    with tempfile.TemporaryDirectory() as out:
        federation, _ = _one_round(module, data, FedSCA(num_shared_adapters=1), out)
        return _rss_and_store(federation, module)


def memory_personalized(strategy_name: str, num_clients: int) -> dict[str, float]:
    """(d), in this process: one round of APPLE or FedMetaMed with the model of (b); bytes of every kind of state."""
    import resource

    from fedlit.strategies import APPLE, FedMetaMed

    warnings.simplefilter("ignore")
    torch.manual_seed(0)
    module = _vit_lora()
    data = SyntheticImages(num_clients=num_clients, samples_per_client=10, image_size=32, seed=0, batch_size=4)
    # The server's per-client state: APPLE's cores, FedMetaMed's mixes (each a dict client -> shared tensors).
    strategy, server_attr = (APPLE(), "cores") if strategy_name == "apple" else (FedMetaMed(), "mixes")
    with tempfile.TemporaryDirectory() as out:
        federation, turns = _one_round(module, data, strategy, out)
        shared, personal = module.named_tensors("shared"), module.named_tensors("personal")
        if not shared or not all("lora_" in n for n in shared) or not all(n.startswith("head.") for n in personal):
            raise RuntimeError(
                f"expected shared LoRA and a personal head, got shared {sorted(shared)[:3]}..., "
                f"personal {sorted(personal)}"
            )
        first, download = data.client_ids[0], turns[0].download_bytes
        extra = federation.store.state_dict()["extra"]
        server = getattr(strategy, server_attr)
        if sorted(server) != sorted(data.client_ids):
            raise RuntimeError(f"{strategy_name}.{server_attr} holds {len(server)} clients, not {num_clients}")
        frozen = module.named_tensors("frozen")
        upload = turns[0].update.state
        del turns
        gc.collect()
        return {
            "clients": num_clients,
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "live_tensors_mb": _unique_nbytes([o for o in gc.get_objects() if isinstance(o, torch.Tensor)]) / 2**20,
            "store_mb": federation.store.nbytes() / 2**20,
            "strategy_states_mb": _unique_nbytes(extra) / 2**20,
            "server_states_mb": _unique_nbytes(server) / 2**20,
            "store_entry_mb": federation.store.nbytes(first) / 2**20,
            "strategy_state_mb": _unique_nbytes(extra.get(first, {})) / 2**20,
            "server_share_mb": _unique_nbytes(server[first]) / 2**20,
            # what of the upload the server does not keep as it is (alive until aggregation only)
            "upload_dropped_mb": (_unique_nbytes([upload, server[first]]) - _unique_nbytes(server[first])) / 2**20,
            "download_mb": download / 2**20,
            "shared_mb": _unique_nbytes(shared) / 2**20,
            "backbone_mb": _unique_nbytes(frozen) / 2**20,
        }


def _unique_nbytes(obj: object) -> int:
    """Bytes of the tensors in nested dicts, lists and tuples, each tensor counted once (by its data pointer)."""
    seen: dict[int, int] = {}
    stack = [obj]
    while stack:
        item = stack.pop()
        if isinstance(item, torch.Tensor):
            seen[item.data_ptr()] = max(seen.get(item.data_ptr(), 0), item.numel() * item.element_size())
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
    return sum(seen.values())


def _memory_table(kind: str, counts: tuple[int, ...], title: str) -> None:
    rows = []
    for n in counts:
        out = subprocess.run(
            [sys.executable, __file__, f"--memory-child{kind}", str(n)], capture_output=True, text=True, check=True
        )
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    print(title)
    personalized = "server_states_mb" in rows[0]
    extra = " | live tensors MB | strategy states MB | server per-client MB" if personalized else ""
    print(f"    clients | peak RSS MB | client store MB{extra}")
    for row in rows:
        extra = (
            f"{row['store_mb']:15.2f} | {row['live_tensors_mb']:15.1f} | {row['strategy_states_mb']:18.2f} | "
            f"{row['server_states_mb']:.2f}"
            if personalized
            else f"{row['store_mb']:.2f}"
        )
        print(f"    {row['clients']:7d} | {row['peak_rss_mb']:11.1f} | {extra}")
    first, last = rows[0], rows[-1]
    added = last["clients"] - first["clients"]
    per_client = (last["peak_rss_mb"] - first["peak_rss_mb"]) / added
    span = f"({first['clients']} -> {last['clients']} clients)"
    if not personalized:
        print(
            f"    memory per added client: {per_client:.2f} MB measured {span}; one client's stored state "
            f"{first['client_state_mb']:.2f} MB; a backbone copy would be {first['backbone_mb']:.1f} MB"
        )
        return
    own = last["store_entry_mb"] + last["strategy_state_mb"] + last["server_share_mb"]
    tensors = (last["live_tensors_mb"] - first["live_tensors_mb"]) / added
    print(
        f"    memory per added client {span}: {per_client:.2f} MB of peak RSS, {tensors:.2f} MB of live tensors; "
        f"the client's own tensors {own:.2f} MB (store entry {last['store_entry_mb']:.3f} + strategy state "
        f"{last['strategy_state_mb']:.3f} + server share {last['server_share_mb']:.3f}) and its upload until "
        f"aggregation {last['upload_dropped_mb']:.2f} MB more (0 when the server keeps it as it is); shared "
        f"tensors {last['shared_mb']:.2f} MB; a backbone copy would be {last['backbone_mb']:.1f} MB"
    )
    print(
        "    download per client and round: "
        + ", ".join(f"{r['download_mb']:.2f} MB ({r['clients']} clients)" for r in rows)
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--memory-child", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--memory-child-sam", type=int, help=argparse.SUPPRESS)
    for name in ("apple", "fedmetamed"):
        parser.add_argument(f"--memory-child-{name}", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--skip-sam", action="store_true", help="Leave out (c), the Medical-SAM-Adapter table.")
    parser.add_argument(
        "--skip-personalized", action="store_true", help="Leave out (d), the APPLE and FedMetaMed tables."
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--clients", type=int, default=4)
    args = parser.parse_args()
    if args.memory_child:
        print(json.dumps(memory(args.memory_child)))
        return
    if args.memory_child_sam:
        print(json.dumps(memory_sam(args.memory_child_sam)))
        return
    for name in ("apple", "fedmetamed"):
        if getattr(args, f"memory_child_{name}"):
            print(json.dumps(memory_personalized(name, getattr(args, f"memory_child_{name}"))))
            return

    a = overhead(args.rounds, args.clients)
    print(f"(a) local training, {args.rounds} rounds x {args.clients} clients, SmallCNN on 16x16 synthetic images:")
    print(
        f"    federation {a['federation_s']:.2f} s, plain Fabric loop {a['plain_fabric_s']:.2f} s, "
        f"ratio {a['ratio']:.2f}"
    )

    _memory_table(
        "", (2, 8, 32), "(b) one round, ViT-Small (frozen, 22M params) + LoRA r=8 shared + personal head, CPU:"
    )
    if not args.skip_sam:
        _memory_table(
            "-sam",
            (2, 6, 12),
            "(c) one FedSCA round (L = 1), Medical-SAM-Adapter ViT-B (frozen encoder, 24 "
            "adapters + mask decoder trained), 64-pixel inputs, CPU:",
        )
    if not args.skip_personalized:
        for name, title in (("apple", "APPLE"), ("fedmetamed", "FedMetaMed")):
            _memory_table(
                f"-{name}", (2, 10, 20), f"(d) one {title} round, the model of (b) (LoRA shared, head personal), CPU:"
            )


if __name__ == "__main__":
    main()
