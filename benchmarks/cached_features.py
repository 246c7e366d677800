"""Seconds per round of head-only training with and without ``federation.cache_features``.

A frozen ViT-Small-sized backbone (timm ``vit_small_patch16_224``, 22M parameters, randomly initialized, at 64-pixel
grey inputs) under a shared linear head (the module's default roles), FedAvg, 10 clients of SyntheticImages, one
local epoch per round, every round evaluated: the same run twice, uncached (``off``) and with the features kept in
memory (``memory``). Rounds after the first are compared (the cached run's first round computes the features once,
as the uncached run does every round); the first round is printed beside. The two runs' final results are checked
equal.

Printed per mode: the first round's seconds, the median of the later rounds' (``system/round_seconds`` of
``metrics.csv``, training and evaluation), then the ratio off / memory of the later rounds.

Run: python benchmarks/cached_features.py   (about 4 minutes on a 2-core CPU; --samples, --rounds, --image-size,
--threads to change the size)
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import io
import os
import statistics
import tempfile
import time
import warnings
from pathlib import Path

import torch

from fedlit import FedAvg, Federation
from fedlit.data import SyntheticImages
from fedlit.models import TimmBackbone
from fedlit.tasks import ClassificationModule


def run(mode: str, args: argparse.Namespace) -> tuple[list[float], dict]:
    """One federation with ``federation.cache_features=mode``: its seconds per round and its results."""
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the randomly initialized backbone's note
        backbone = TimmBackbone(name="vit_small_patch16_224", model_args={"img_size": args.image_size, "in_chans": 1})
        module = ClassificationModule(backbone=backbone, num_classes=3, lr=0.05, momentum=0.9)
    data = SyntheticImages(
        num_clients=10, samples_per_client=args.samples, image_size=args.image_size, batch_size=32, seed=0
    )
    with tempfile.TemporaryDirectory() as out:
        federation = Federation(
            module,
            data,
            FedAvg(),
            rounds=args.rounds,
            out_dir=out,
            progress_bar=False,
            accelerator="cpu",
            cache_features=mode,
            threads=args.threads,
            loggers=[],
        )
        with contextlib.redirect_stdout(io.StringIO()):  # the run's tables
            results = federation.fit()
        with open(Path(out) / "metrics.csv", newline="") as f:
            seconds = [
                float(row["value"])
                for row in csv.DictReader(f)
                if row["split"] == "system" and row["metric"] == "round_seconds"
            ]
    return seconds, results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--samples", type=int, default=20, help="samples per client (60%% train, 20%% val, 20%% test)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    rows, results = {}, {}
    for mode in ("off", "memory"):
        start = time.perf_counter()
        seconds, results[mode] = run(mode, args)
        rows[mode] = (seconds[0], statistics.median(seconds[1:]), time.perf_counter() - start)
    print(
        f"load average {os.getloadavg()[0]:.1f}; torch threads {torch.get_num_threads()}; 10 clients x "
        f"{args.samples} samples, {args.image_size}px, {args.rounds} rounds"
    )
    print(f"{'cache_features':>14} {'round 1 (s)':>12} {'later rounds (s, median)':>25} {'whole run (s)':>14}")
    for mode, (first, later, whole) in rows.items():
        print(f"{mode:>14} {first:12.2f} {later:25.3f} {whole:14.1f}")
    print(f"later rounds off / memory: {rows['off'][1] / rows['memory'][1]:.1f}x")
    same = results["off"]["last"] == results["memory"]["last"] and results["off"]["best"] == results["memory"]["best"]
    print(f"same results (last and best rounds, every client and metric): {same}")


if __name__ == "__main__":
    main()
