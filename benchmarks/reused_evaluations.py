"""What reusing unchanged evaluations saves (``federation.reuse_evaluations``), and that it changes no metric.

A federation of ``--clients`` clients (SyntheticImages at 16 px, a SmallCNN) trains Local (each client alone:
McMahan et al.'s local baseline) for ``--rounds`` rounds of one local step, ``--fraction`` of the clients a round,
and evaluates every client (validation and test) every round: as a personalized comparison does to pick its best
round. The same run is made with ``reuse_evaluations`` on and off, in this process, alternately ``--repeats`` times
(load from other processes hits both alike). Printed per setting: the evaluation seconds per round
(``system/eval_seconds``, the median of the rounds but the first, which evaluates every client in both) and the
clients reused per round; then whether the two runs' per-client metrics are equal in every round (they must be).
PyTorch runs on ``--threads`` threads (1 by default: timings on a shared machine vary far less).

Run: python benchmarks/reused_evaluations.py --clients 200 --fraction 0.1 --rounds 5
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import io
import math
import statistics
import tempfile
import warnings
from pathlib import Path

import torch

from fedlit import Federation, RoleRule
from fedlit.data import SyntheticImages
from fedlit.models import SmallCNN
from fedlit.strategies import Local
from fedlit.tasks import ClassificationModule


def run(args: argparse.Namespace, reuse: bool, out: Path) -> tuple[dict, list[float], list[float]]:
    """The run's history, its evaluation seconds per round and its reused clients per round."""
    torch.manual_seed(0)
    module = ClassificationModule(
        backbone=SmallCNN(width=8), num_classes=3, lr=0.05, roles=[RoleRule("backbone.*", "shared")]
    )
    data = SyntheticImages(
        num_clients=args.clients,
        samples_per_client=args.samples,
        image_size=16,
        seed=0,
        batch_size=args.batch_size,
        split_fractions=(0.6, 0.2, 0.2),
    )
    federation = Federation(
        module,
        data,
        Local(),
        rounds=args.rounds,
        local_steps=1,
        clients_per_round=args.fraction,
        eval_every=1,
        checkpoint_every=args.rounds + 1,
        accelerator="cpu",
        threads=args.threads,
        progress_bar=False,
        out_dir=out,
        reuse_evaluations=reuse,
    )
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        federation.fit()
    seconds: dict[int, float] = {}
    reused: dict[int, float] = {}
    with open(out / "metrics.csv", newline="", encoding="utf-8") as f:
        for row in csv.DictReader(f):
            if row["split"] == "system" and row["metric"] == "eval_seconds":
                seconds[int(row["round"])] = float(row["value"])
            if row["split"] == "system" and row["metric"] == "eval_reused":
                reused[int(row["round"])] = float(row["value"])
    return federation.state.history.rounds, [seconds[r] for r in sorted(seconds)], [reused[r] for r in sorted(reused)]


def same(a: object, b: object) -> bool:
    """``a == b`` for nested dicts of floats, NaN equal to NaN (an undefined AUROC is NaN in both runs)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return a == b


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=200)
    parser.add_argument("--fraction", type=float, default=0.1)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--samples", type=int, default=20, help="Samples per client (60, 20, 20 %% train, val, test).")
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1, help="PyTorch's CPU threads.")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    per_round: dict[bool, list[float]] = {True: [], False: []}
    histories: dict[bool, dict] = {}
    reused: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(args.repeats):
            for reuse in (False, True):
                history, seconds, counts = run(args, reuse, Path(tmp) / f"{reuse}-{repeat}")
                per_round[reuse].append(statistics.median(seconds[1:] or seconds))
                histories[reuse] = history
                reused = counts if reuse else reused
    off, on = min(per_round[False]), min(per_round[True])
    print(
        f"N={args.clients}, {args.fraction:g} of the clients a round, Local, every client evaluated every round, "
        f"{args.rounds} rounds (fastest of {args.repeats} runs each)"
    )
    print(f"reuse_evaluations off: {off:.3f} s of evaluation a round")
    print(
        f"reuse_evaluations on:  {on:.3f} s of evaluation a round ({off / on:.1f}x less); clients reused per "
        f"round: {', '.join(f'{c:.0f}' for c in reused)}"
    )
    print(f"same metrics for every client and round: {same(histories[True], histories[False])}")


if __name__ == "__main__":
    main()
