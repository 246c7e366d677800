"""Measure what a client's turn costs besides its arithmetic, with the per-client costs fedlit removed and without.

Two runs of ``fedlit fit`` in this process, each twice, alternating: *before* with the environment knobs that bring
back the old behaviour (``FEDLIT_WORKER_POOLS=0``: every loader iteration forks its own DataLoader workers, once per
client, split and round; ``FEDLIT_DIGEST_MEMO=0``: the evaluation-reuse fingerprint hashes every tensor every round)
and *after* without them:

- **flagship**: ``recipes/fedsca_prostate.yaml`` as shipped (FedSCA, ``num_workers: 4``, batch 32, 1 local epoch)
  with the tiny Medical-SAM-Adapter (``variant: tiny``, no checkpoint, 64-pixel slices, 56-pixel crops) on the
  Fed-Prostate slice samples beside the repository (``../shared/data/site_samples/ProstateSlice``: 1-2 slices a
  site, 6 sites, as in ``tests/integration/test_fedsca_recipes.py``);
- **quickstart**: ``recipes/quickstart.yaml`` (SmallCNN, FedBN, 4 clients of 200 images, 3 local epochs) with the
  flagship's ``num_workers: 4``.

A *turn* is a client's training (``run_fit_task``) or evaluation (``run_evaluate_task``). Its *arithmetic* is the time
inside the module's ``training_step`` and ``validation_step`` (forward and loss), ``torch.autograd.backward`` and
the optimizers' ``step``; the *overhead* is the rest of the turn: loading and storing the client's state, building
and starting its loaders, reading its batches, hooks, metrics. Printed per run: turns, seconds of turns, of
arithmetic and of overhead (the fastest of the repeats), overhead per turn, DataLoader worker processes started,
and before/after ratios, after an unmeasured 1-round warm-up. Both modes must give the same results (checked).
The evaluation-reuse fingerprints are taken in the round, outside the turns: their seconds are the ``hash s``
column.

Run: python benchmarks/client_overhead.py [--rounds 3] [--repeats 2] [--only flagship|quickstart]
(about 4 minutes on 2 cores)
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import multiprocessing.process
import os
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.optim import optimizer as optimizer_hooks

from fedlit import cli
from fedlit.engine.loop import executor
from fedlit.engine.speedups import reuse
from fedlit.tasks import ClassificationModule, SegmentationModule

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT.parent / "shared" / "data" / "site_samples" / "ProstateSlice"
NET = "--model.init_args.network.init_args."
BEFORE = {"FEDLIT_WORKER_POOLS": "0", "FEDLIT_DIGEST_MEMO": "0"}


def recipes(rounds: int, samples: Path) -> dict[str, list[str]]:
    """Each benchmarked run's ``fedlit fit`` arguments (without ``--out_dir``)."""
    common = ["--federation.rounds", str(rounds), "--federation.progress_bar", "false"]
    return {
        "flagship": [
            *("--config", str(ROOT / "recipes" / "fedsca_prostate.yaml"), "--data.init_args.root", str(samples)),
            *("--data.init_args.image_size", "64", "--data.init_args.crop_size", "56"),
            *(f"{NET}variant", "tiny", f"{NET}checkpoint", "null", f"{NET}image_size", "64"),
            *common,
        ],
        "quickstart": [
            *("--config", str(ROOT / "recipes" / "quickstart.yaml"), "--data.init_args.num_workers", "4"),
            *common,
        ],
    }


class Clock:
    """Seconds of turns, of arithmetic inside them and of fingerprints; worker processes started."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.turns, self.turn_s, self.math_s, self.hash_s, self.forks, self.depth = 0, 0.0, 0.0, 0.0, 0, 0

    def turn(self, function: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                self.turns += 1
                self.turn_s += time.perf_counter() - start

        return timed

    def math(self, function: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            self.depth += 1
            start = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                self.depth -= 1
                if self.depth == 0:  # a backward inside a step (a closure) is counted once
                    self.math_s += time.perf_counter() - start

        return timed


def instrument(clock: Clock) -> None:
    """Time turns, the arithmetic inside them, the fingerprints and count worker starts (this process only)."""
    executor.run_fit_task = clock.turn(executor.run_fit_task)
    executor.run_evaluate_task = clock.turn(executor.run_evaluate_task)
    for cls in (ClassificationModule, SegmentationModule):
        cls.training_step = clock.math(cls.training_step)  # type: ignore[method-assign]
        cls.validation_step = clock.math(cls.validation_step)  # type: ignore[method-assign]
    torch.autograd.backward = clock.math(torch.autograd.backward)
    starts: dict[int, float] = {}

    def pre(optimizer: Any, *_: Any) -> None:
        starts[id(optimizer)] = time.perf_counter()
        clock.depth += 1

    def post(optimizer: Any, *_: Any) -> None:
        clock.depth -= 1
        if clock.depth == 0:
            clock.math_s += time.perf_counter() - starts.pop(id(optimizer))

    optimizer_hooks.register_optimizer_step_pre_hook(pre)
    optimizer_hooks.register_optimizer_step_post_hook(post)
    fingerprint = reuse._task_key

    def key(*args: Any) -> Any:
        start = time.perf_counter()
        try:
            return fingerprint(*args)
        finally:
            clock.hash_s += time.perf_counter() - start

    reuse._task_key = key
    start_process = multiprocessing.process.BaseProcess.start

    def counted(process: Any) -> None:
        clock.forks += 1
        start_process(process)

    multiprocessing.process.BaseProcess.start = counted  # type: ignore[method-assign]


def fit(args: list[str], mode: str, clock: Clock) -> tuple[dict[str, float], str]:
    """One run in ``mode`` (before: the knobs set); its figures and its last results as text."""
    for name, value in BEFORE.items():
        if mode == "before":
            os.environ[name] = value
        else:
            os.environ.pop(name, None)
    clock.reset()
    with tempfile.TemporaryDirectory() as out, contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        results = cli.run(["fit", *args, "--out_dir", str(Path(out) / "run")])
    figures = {
        "turns": clock.turns,
        "turn_s": clock.turn_s,
        "math_s": clock.math_s,
        "overhead_s": clock.turn_s - clock.math_s,
        "hash_s": clock.hash_s,
        "forks": clock.forks,
    }
    return figures, json.dumps(results["last"], sort_keys=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--only", choices=["flagship", "quickstart"], default=None)
    parser.add_argument("--samples", type=Path, default=SAMPLES, help="the Fed-Prostate slice samples")
    options = parser.parse_args()
    clock = Clock()
    instrument(clock)
    print(f"torch threads {torch.get_num_threads()}, CPUs {os.cpu_count()}, load {os.getloadavg()[0]:.1f}")
    header = f"{'run':<11} {'mode':<7} {'turns':>5} {'turn s':>8} {'math s':>8} {'over s':>8} {'per turn':>9}"
    print(f"{header} {'hash s':>7} {'forks':>6}")
    for name, args in recipes(options.rounds, options.samples).items():
        if options.only not in (None, name):
            continue
        fit([*args, "--federation.rounds", "1"], "after", clock)  # warm-up: first-call costs paid by neither mode
        best: dict[str, dict[str, float]] = {}
        last: dict[str, str] = {}
        for _ in range(options.repeats):
            for mode in ("before", "after"):
                figures, last[mode] = fit(args, mode, clock)
                kept = best.get(mode)
                if kept is None or figures["overhead_s"] < kept["overhead_s"]:
                    best[mode] = figures
        for mode, f in best.items():
            per_turn = f["overhead_s"] / max(f["turns"], 1)
            print(
                f"{name:<11} {mode:<7} {f['turns']:>5} {f['turn_s']:>8.3f} {f['math_s']:>8.3f} "
                f"{f['overhead_s']:>8.3f} {per_turn:>9.4f} {f['hash_s']:>7.3f} {f['forks']:>6}"
            )
        before, after = best["before"], best["after"]
        print(
            f"{name:<11} overhead {before['overhead_s'] / max(after['overhead_s'], 1e-9):.1f}x less, turns "
            f"{before['turn_s'] / max(after['turn_s'], 1e-9):.2f}x faster; "
            f"same results: {'yes' if last['before'] == last['after'] else 'NO'}"
        )
    print(f"load {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
