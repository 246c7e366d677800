"""Measure fused multi-client training (``federation.fused_clients``) against sequential turns.

N clients (20 by default) of a frozen ViT-Small/16 (22M parameters, randomly initialized: the weights do not change
the time) at 64-pixel inputs, LoRA r=8 on the attention's fused qkv projections (shared) and a head (personal, as in
FedPer's split; FedAvg otherwise), batch 16, one local epoch of 2 steps per client. Each ``fused_clients`` value runs
in a fresh process, so its peak resident memory is its own. Printed per value: seconds of the clients' training in
each round (from ``on_round_start`` to ``on_before_aggregate``: loading, local steps, uploads; evaluation left out),
the rounds after the first (a warm-up) averaged, the speed-up over the first value given (1 by default) and the
peak RSS, each row as soon as it is measured.

Run: python benchmarks/fused_training.py   (about 4 minutes on an idle 2-core CPU; --fused 1 4 20 --clients 20)
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
import warnings

import torch
from lightning.pytorch import Callback

from fedlit import Federation, RoleRule
from fedlit.data import SyntheticImages
from fedlit.models import LoRA, TimmBackbone
from fedlit.strategies import FedPer
from fedlit.tasks import ClassificationModule


class RoundClock(Callback):
    """Seconds from each round's start to its aggregation (the clients' training)."""

    def __init__(self) -> None:
        self.seconds: list[float] = []
        self._start = 0.0

    def on_round_start(self, server_round: int) -> None:
        self._start = time.perf_counter()

    def on_before_aggregate(self, server_round: int) -> None:
        self.seconds.append(time.perf_counter() - self._start)


def one(fused: int, clients: int, rounds: int) -> dict[str, float]:
    """Train ``rounds`` rounds with ``fused_clients=fused`` in this process."""
    warnings.simplefilter("ignore")
    torch.manual_seed(0)
    backbone = TimmBackbone(
        name="vit_small_patch16_224", lora=LoRA(r=8, alpha=16), model_args={"img_size": 64, "in_chans": 1}
    )
    module = ClassificationModule(
        backbone=backbone, num_classes=3, lr=0.01, momentum=0.9, roles=[RoleRule("backbone.*lora_*", "shared")]
    )
    data = SyntheticImages(
        num_clients=clients,
        samples_per_client=40,
        image_size=64,
        seed=0,
        batch_size=16,
        split_fractions=(0.8, 0.1, 0.1),
    )
    clock = RoundClock()
    federation = Federation(
        module,
        data,
        FedPer(),
        rounds=rounds,
        out_dir=tempfile.mkdtemp(),
        progress_bar=False,
        accelerator="cpu",
        eval_every=rounds,
        fused_clients=fused,
        callbacks=[clock],
    )
    federation.fit()
    later = clock.seconds[1:] or clock.seconds
    return {
        "fused_clients": fused,
        "round_s": sum(later) / len(later),
        "rounds_s": clock.seconds,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=20)
    parser.add_argument("--fused", type=int, nargs="+", default=[1, 4, 20])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        print(json.dumps(one(args.child, args.clients, args.rounds)))
        return
    print(f"{args.clients} clients, ViT-S/16 at 64 px, LoRA r=8 (qkv) + head, batch 16, 2 local steps each")
    print("| fused_clients | s per round (training) | speed-up | peak RSS MB | ratio | rounds s |")
    print("|---:|---:|---:|---:|---:|---|", flush=True)
    base = None
    for fused in args.fused:  # each row as soon as it is measured
        out = subprocess.run(
            [
                sys.executable,
                __file__,
                "--child",
                str(fused),
                "--clients",
                str(args.clients),
                "--rounds",
                str(args.rounds),
            ],
            check=True,
            capture_output=True,
            text=True,
        )
        r = json.loads(out.stdout.strip().splitlines()[-1])
        base = base or r
        print(
            f"| {r['fused_clients']} | {r['round_s']:.2f} | {base['round_s'] / r['round_s']:.2f}x | "
            f"{r['peak_rss_mb']:.0f} | {r['peak_rss_mb'] / base['peak_rss_mb']:.2f}x | "
            f"{', '.join(f'{s:.2f}' for s in r['rounds_s'])} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
