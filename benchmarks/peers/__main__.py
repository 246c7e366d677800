"""fedlit against its peers: the same FedAvg run by a plain PyTorch loop (the floor), fedlit and Flower's simulation.

Task ``vit``: N clients, a frozen ViT-S/16 at 64 px (random init, nothing downloaded) + LoRA r = 8 on its fused
qkv projections + a linear head, 64 train samples each, batch 16, 1 local epoch, FedAvg over LoRA and the head, 2
CPU threads (``vit_lora.yaml`` beside this file). From N = 1,000 on (the ``sampled`` protocol): 16 train samples
each (and 1 test sample), 1 local step, 10 % of the clients a round. Task ``heart``: FLamby's Fed-Heart-Disease
logistic regression (``recipes/heart_disease_fedavg.yaml``: 4 hospitals, 100 local steps of batch 4), a model so
small that the loop's own cost per step shows; it needs the data at ``--heart-root``.

Systems, each run in a fresh process, interleaved (for each N and repeat: floor, fedlit, fedlit fused, Flower):

- ``floor``: ``floor.py``, FedAvg as a plain PyTorch loop on one model over the same data, batches and steps;
- ``fedlit``: ``fedlit fit --config RECIPE`` (the CLI, as a user runs it: with its final test, its logs, one
  checkpoint); ``--fused K [K ...]`` adds a row for each K with ``--federation.fused_clients K`` (``not
  available`` when this fedlit has no such setting); fedlit's runs also print the seconds of their evaluations;
- ``flower``: ``flower_sim.py``, Flower's ``run_simulation`` (Ray backend, ``num_cpus`` = the threads: one client
  at a time) with Flower's FedAvg; needs the ``bench`` extra; ``--skip-flower-above`` leaves it out for large N.

Printed per run: seconds per round (training and aggregation: fedlit's ``system/train_seconds`` +
``aggregate_seconds``, the floor's loop, Flower from sending a round's messages to its aggregate; the median of
rounds 2..R, round 1 alone when R = 1; the fastest repeat), the peak memory of the process tree (PSS, see
``measure.py``) and the start-to-finish wall time of the R-round process, each with its ratio to the floor of the
same N; then the goals, pass or miss. Nothing is asserted.

On a GPU (``--accelerator cuda``, see ``device.py``): the floor's loop and fedlit run there, at 32-true and
bf16-mixed, N = 20 and 100, unfused and fused 10 and 20 by default (``--vit-base``: a ViT-B/16 at 224 px); each row
also gets its ratio to the compute bound (the round's FLOPs over the device's peak; an H100's by default) and the
peak GPU memory (``torch.cuda.max_memory_allocated``).

Run: python benchmarks/peers [--clients 2 20 100 1000] [--rounds 4] [--fused 2 4 20] [--skip-flower-above 20] [--quick]
     python benchmarks/peers --accelerator cuda --vit-base [--matmul-precision high] [--peak-bf16 989 ...]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import device
import measure
import psutil

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
VIT = HERE / "vit_lora.yaml"
HEART = ROOT / "recipes" / "heart_disease_fedavg.yaml"
#: From this many clients on, the vit task follows the sampled protocol (1 local step, 10 % of clients a round).
SAMPLED_FROM = 1000
#: The quick mode's backbone: the same timm ViT, one block of width 48 (a smoke run, not a measurement).
TINY_VIT = '{"img_size": 64, "in_chans": 1, "depth": 1, "embed_dim": 48, "num_heads": 2}'


@dataclass
class Row:
    """One (task, N, system) of the table, over its repeats."""

    task: str
    clients: int
    system: str
    runs: list[measure.Measured]
    note: str = ""
    precision: str = "32-true"

    @property
    def ok(self) -> bool:
        return bool(self.runs) and all(r.ok for r in self.runs)

    @property
    def per_round(self) -> float:
        return min(statistics.median(r.round_seconds[1:] or r.round_seconds) for r in self.runs)

    @property
    def wall(self) -> float:
        return min(r.wall_s for r in self.runs)

    @property
    def peak(self) -> float:
        return min(r.peak_mib for r in self.runs)

    @property
    def gpu_peak(self) -> float | None:
        return min((r.gpu_peak_mib for r in self.runs if r.gpu_peak_mib is not None), default=None)


def overrides(task: str, clients: int, args: argparse.Namespace) -> list[str]:
    """The ``fedlit fit`` overrides of one (task, N): the same for every system."""
    rounds = ["--federation.rounds", str(args.rounds)]
    if task == "heart":
        return [
            "--data.init_args.root",
            str(args.heart_root),
            *rounds,
            "--federation.threads",
            "2",
            "--federation.eval_every",
            "1000",
            "--federation.checkpoint_every",
            "1000",
            "--federation.progress_bar",
            "false",
        ]
    sized = ["--data.init_args.num_clients", str(clients), *rounds]
    if clients >= SAMPLED_FROM:
        # 16 train samples and 1 test sample each: fedlit's final test of every client stays short
        sized += [
            "--data.init_args.samples_per_client",
            "17",
            "--data.init_args.split_fractions",
            "[0.94, 0, 0.06]",
            "--federation.clients_per_round",
            "0.1",
            "--federation.local_steps",
            "1",
        ]
    if args.quick:
        sized += [
            "--data.init_args.samples_per_client",
            "20",
            "--model.init_args.backbone.init_args.model_args",
            TINY_VIT,
        ]
    return sized


def command(system: str, recipe: Path, extra: list[str], out: Path) -> list[str]:
    py = sys.executable
    if system == "floor":
        return [py, str(HERE / "floor.py"), str(recipe), *extra]
    if system == "flower":
        return [py, str(HERE / "flower_sim.py"), str(recipe), *extra]
    fused = system.removeprefix("fedlit fused ") if system.startswith("fedlit fused ") else None
    fused_option = ["--federation.fused_clients", fused] if fused else []
    return [py, "-m", "fedlit", "fit", "--config", str(recipe), *extra, *fused_option, "--out_dir", str(out)]


def fedlit_rounds(out: Path) -> tuple[list[float], float]:
    """Per round, ``system/train_seconds`` + ``system/aggregate_seconds`` from the run's ``metrics.csv``; and the
    seconds of its evaluations (``system/eval_seconds``: per-round validation and the final test) in all."""
    import csv

    seconds: dict[int, float] = {}
    evaluation = 0.0
    with open(out / "metrics.csv", newline="", encoding="utf-8") as f:
        for row in csv.DictReader(f):
            if row["split"] == "system" and row["metric"] in ("train_seconds", "aggregate_seconds"):
                seconds[int(row["round"])] = seconds.get(int(row["round"]), 0.0) + float(row["value"])
            elif row["split"] == "system" and row["metric"] == "eval_seconds":
                evaluation += float(row["value"])
    return [seconds[r] for r in sorted(seconds)], evaluation


def measure_one(system: str, recipe: Path, extra: list[str], args: argparse.Namespace, work: Path) -> measure.Measured:
    out = Path(tempfile.mkdtemp(prefix="run-", dir=work))
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "2",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    result = measure.run(command(system, recipe, extra, out / "run"), env=env, cwd=str(work), timeout=args.timeout)
    if result.ok and system.startswith("fedlit"):
        result.round_seconds, result.eval_seconds = fedlit_rounds(out / "run")
        if args.accelerator == "cuda":
            result.gpu_peak_mib = device.fedlit_gpu_peak(out / "run")
    return result


def plan(args: argparse.Namespace) -> list[tuple[str, int, str, list[str]]]:
    """(task, N, precision, systems) in the order they run."""
    systems = list(args.systems)
    if args.fused and "fedlit" in systems:
        at = systems.index("fedlit") + 1
        systems[at:at] = [f"fedlit fused {k}" for k in args.fused]
    jobs = []
    for precision in args.precision:
        if "vit" in args.task:
            for n in args.clients:
                jobs.append(("vit", n, precision, systems))
        if "heart" in args.task:
            jobs.append(("heart", 4, precision, [s for s in systems if not s.startswith("fedlit fused")]))
    return jobs


def run_all(args: argparse.Namespace) -> list[Row]:
    rows: list[Row] = []
    flower_missing = importlib.util.find_spec("ray") is None
    with tempfile.TemporaryDirectory(prefix="fedlit-peers-") as tmp:
        for task, n, precision, systems in plan(args):
            recipe = VIT if task == "vit" else HEART
            if task == "heart" and not args.heart_root.is_dir():
                print(f"heart: skipped, no data at {args.heart_root} (--heart-root)", flush=True)
                continue
            extra = device.overrides(args, precision, task) + overrides(task, n, args)
            group = {s: Row(task, n, s, [], precision=precision) for s in systems}
            for system in systems:
                if system == "flower" and flower_missing:
                    group[system].note = "not available: Ray is not installed (pip install -e '.[bench]')"
                elif system == "flower" and args.skip_flower_above is not None and n > args.skip_flower_above:
                    group[system].note = f"skipped (N > --skip-flower-above {args.skip_flower_above})"
            for _ in range(args.repeats):
                for system, row in group.items():
                    if row.note:
                        continue
                    result = measure_one(system, recipe, extra, args, Path(tmp))
                    row.runs.append(result)
                    if not result.ok:
                        row.note = _failure(system, result)
                        print(f"{task} N={n} {precision} {system}: {row.note}", flush=True)
                        continue
                    print(
                        f"{task} N={n} {precision} {system}: {result.wall_s:.1f} s, rounds "
                        f"{', '.join(f'{s:.2f}' for s in result.round_seconds)} s, peak {result.peak_mib:.0f} MiB "
                        f"{result.memory_kind}"
                        + ("" if result.eval_seconds is None else f", evaluations {result.eval_seconds:.2f} s")
                        + f" (load {os.getloadavg()[0]:.1f})",
                        flush=True,
                    )
            rows.extend(group.values())
    return rows


def _failure(system: str, result: measure.Measured) -> str:
    if system.startswith("fedlit fused") and "fused_clients is not" in result.output:
        return "not available: this fedlit has no federation.fused_clients"
    return f"failed: {result.error[:200]}"


def table(rows: list[Row], rounds: int, bound: Any = None) -> list[str]:
    """The Markdown table; ``bound(flops, precision)`` gives a round's compute bound in seconds (None: no column's
    figure), from the floor's count of the round's FLOPs."""
    lines = [
        f"| task | N | precision | system | s / round | x floor | x bound | peak MiB | x floor | GPU MiB | "
        f"{rounds}-round run s | x floor |",
        "|---|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        same = (row.task, row.clients, row.precision, "floor")
        floor = next((r for r in rows if (r.task, r.clients, r.precision, r.system) == same and r.ok), None)
        head = f"| {row.task} | {row.clients} | {row.precision} | {row.system} |"
        if not row.ok:
            lines.append(f"{head} {row.note or 'not run'} | | | | | | | |")
            continue

        def ratio(value: float, base: float | None) -> str:
            return f"{value / base:.2f}" if base else "-"

        flops = floor.runs[0].round_flops if floor else None
        seconds = bound(flops, row.precision) if bound is not None else None
        gpu = "-" if row.gpu_peak is None else f"{row.gpu_peak:.0f}"
        lines.append(
            f"{head} {row.per_round:.2f} | {ratio(row.per_round, floor and floor.per_round)} | "
            f"{ratio(row.per_round, seconds)} | {row.peak:.0f} | {ratio(row.peak, floor and floor.peak)} | {gpu} | "
            f"{row.wall:.1f} | {ratio(row.wall, floor and floor.wall)} |"
        )
    return lines


def goals(rows: list[Row], args: argparse.Namespace) -> list[str]:
    def find(task: str, n: int, system: str) -> Row | None:
        return next((r for r in rows if (r.task, r.clients, r.system) == (task, n, system) and r.ok), None)

    lines = []
    floor = find("vit", 20, "floor")
    fused = [row for k in args.fused if (row := find("vit", 20, f"fedlit fused {k}"))]
    if floor and fused:
        best = min(fused, key=lambda r: r.per_round)
        speed, memory = floor.per_round / best.per_round, best.peak / floor.peak
        lines.append(
            f"- N = 20, fused at least 1.5x faster per round than the floor, memory at most 1.1x: "
            f"{'pass' if speed >= 1.5 and memory <= 1.1 else 'miss'} (fastest: "
            f"{best.system.removeprefix('fedlit ')}, {speed:.2f}x faster, {memory:.2f}x the memory)"
        )
    else:
        why = next((r.note for r in rows if r.clients == 20 and r.system.startswith("fedlit fused") and r.note), "")
        lines.append(
            "- N = 20, fused at least 1.5x faster per round than the floor: not measured" + (f" ({why})" if why else "")
        )
    floor, fed = find("vit", SAMPLED_FROM, "floor"), find("vit", SAMPLED_FROM, "fedlit")
    if floor and fed:
        slower, gib = fed.per_round / floor.per_round, fed.peak / 1024
        verdict = "pass" if slower <= 1.2 and gib < 2 else "miss"
        lines.append(
            f"- N = 1,000 sampled, a round at most 1.2x the floor and the process under 2 GiB: {verdict} "
            f"({slower:.2f}x, {gib:.2f} GiB)"
        )
    else:
        lines.append("- N = 1,000 sampled, a round at most 1.2x the floor and under 2 GiB: not measured")
    flower, fed = find("vit", 2, "flower"), find("vit", 2, "fedlit")
    if flower and fed:
        faster = flower.wall / fed.wall
        lines.append(
            f"- 2 clients, {args.rounds} rounds, start to finish at least 3x faster than Flower's "
            f"simulation: {'pass' if faster >= 3 else 'miss'} ({faster:.2f}x)"
            + ("" if args.rounds == 4 else " (the goal is for 4 rounds)")
        )
    else:
        lines.append("- 2 clients, 4 rounds, at least 3x faster than Flower's simulation: not measured")
    floor, fed = find("heart", 4, "floor"), find("heart", 4, "fedlit")
    if floor and fed:
        steps = 4 * 100
        lines.append(
            f"- heart: fedlit's cost per local step over the floor: "
            f"{(fed.per_round - floor.per_round) / steps * 1e3:.2f} ms ({steps} steps a round; the floor's "
            f"step {floor.per_round / steps * 1e3:.2f} ms)"
        )
    return lines


def machine() -> str:
    model = (
        next(
            (
                line.split(":", 1)[1].strip()
                for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")
            ),
            "unknown CPU",
        )
        if Path("/proc/cpuinfo").is_file()
        else "unknown"
    )
    return (
        f"{model}, {os.cpu_count()} CPUs, {psutil.virtual_memory().total / 2**30:.1f} GiB RAM, "
        f"Python {sys.version.split()[0]}"
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, nargs="+", help="Client counts N (vit; default 2 20 100 1000).")
    parser.add_argument("--rounds", type=int, default=4, help="Rounds of every run.")
    parser.add_argument("--repeats", type=int, default=1, help="Runs of each system (the fastest is reported).")
    parser.add_argument("--systems", nargs="+", choices=["floor", "fedlit", "flower"], help="Default: all three.")
    parser.add_argument("--task", nargs="+", choices=["vit", "heart"], help="Default: both.")
    parser.add_argument(
        "--fused",
        type=int,
        nargs="*",
        help="Also run fedlit with --federation.fused_clients K, a row for each K given (on CUDA: 10 20).",
    )
    parser.add_argument("--skip-flower-above", type=int, default=20, help="No Flower run above this N.")
    parser.add_argument("--heart-root", type=Path, default=ROOT.parent / "shared" / "data" / "heart_disease")
    parser.add_argument("--timeout", type=float, default=7200, help="Seconds one run may take.")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="A smoke run: N = 2, 2 rounds, 16 samples, a one-block ViT (figures mean nothing).",
    )
    device.add_options(parser)
    args = parser.parse_args(argv)
    device.resolve(args)
    if args.quick:
        args.clients, args.rounds = [2], 2
    started = time.perf_counter()
    print(f"machine: {machine()}; load {' '.join(f'{x:.2f}' for x in os.getloadavg())} (1, 5, 15 min)", flush=True)
    rows = run_all(args)
    print(
        f"\nload after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}; "
        f"benchmark wall time {time.perf_counter() - started:.0f} s"
    )
    kind = next((r.runs[0].memory_kind for r in rows if r.ok), "PSS")
    print(f"(memory: peak {kind} of the process tree; seconds per round: training + aggregation)\n")
    for row in rows:
        if row.system == "floor" and row.ok and (flops := row.runs[0].round_flops) is not None:
            seconds = device.bound_seconds(flops, row.precision, args)
            print(
                f"{row.task} N={row.clients} {row.precision}: {flops / 1e9:.4g} GFLOP a round"
                + ("" if seconds is None else f", compute bound {seconds:.3g} s")
            )
    print(device.bound_note(args) + "\n")
    print("\n".join(table(rows, args.rounds, lambda flops, precision: device.bound_seconds(flops, precision, args))))
    print("\ngoals:\n" + "\n".join(goals(rows, args) if args.accelerator == "cpu" else device.gpu_goals(rows)))


if __name__ == "__main__":
    main()
