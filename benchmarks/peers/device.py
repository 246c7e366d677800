"""The peers benchmark on a GPU: its device options, the compute bound of a round, the GPU's memory and goals.

``--accelerator cuda`` runs every system on the GPU (``--federation.accelerator cuda`` for fedlit; the floor's plain
loop moves its model and batches there), at each ``--precision`` (``32-true``, under ``--matmul-precision`` which
sets ``federation.matmul_precision``: ``high`` for TF32; ``bf16-mixed``). ``--vit-base`` swaps the ViT-S/16 at 64 px
for a ViT-B/16 at 224 px, batch 32 (the recipe scaled as a GPU user runs it).

The compute bound of a round is the FLOPs of its training (the floor counts them with
``torch.utils.flop_counter.FlopCounterMode`` on one batch, forward and backward as its loop does them, times the
samples a round trains on) divided by the device's peak throughput at that precision: bfloat16 under ``bf16-mixed``
(and ``32-true`` with ``medium``), TF32 under ``high``, plain float32 otherwise (PyTorch's default, ``highest``).
The peaks are options, in TFLOP/s, with an H100 SXM's dense figures as defaults on CUDA; on a CPU there is no
default: the bound is left out, with a note, unless they are given.
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path
from typing import Any

#: An H100 SXM's dense peak throughput in TFLOP/s: bfloat16 and TF32 tensor cores, float32 without them.
H100_PEAK_TFLOPS = {"bf16": 989.0, "tf32": 494.7, "fp32": 66.9}
#: The ViT-B/16 at 224 px of ``--vit-base``: the GPU-sized workload (64 train images a client, batch 32).
VIT_BASE = [
    "--model.init_args.backbone.init_args.name",
    "vit_base_patch16_224",
    "--model.init_args.backbone.init_args.model_args",
    '{"img_size": 224, "in_chans": 1}',
    "--data.init_args.image_size",
    "224",
    "--data.init_args.batch_size",
    "32",
]


def add_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--accelerator", choices=["cpu", "cuda"], default="cpu", help="Where every system runs.")
    parser.add_argument(
        "--precision",
        nargs="+",
        choices=["32-true", "bf16-mixed"],
        help="Precisions to run, a group of rows each (default: 32-true; on CUDA 32-true and bf16-mixed).",
    )
    parser.add_argument(
        "--matmul-precision",
        choices=["highest", "high", "medium"],
        help="federation.matmul_precision of the 32-true runs (high: TF32); default: PyTorch's (highest).",
    )
    parser.add_argument("--vit-base", action="store_true", help="ViT-B/16 at 224 px, batch 32, instead of ViT-S.")
    for kind in H100_PEAK_TFLOPS:
        parser.add_argument(
            f"--peak-{kind}",
            type=float,
            help=f"The device's peak {kind} throughput, TFLOP/s (on CUDA: an H100 SXM's {H100_PEAK_TFLOPS[kind]}).",
        )


def resolve(args: argparse.Namespace) -> None:
    """Fill the defaults that depend on the accelerator (clients, systems, tasks, fused K, precisions, peaks)."""
    cuda = args.accelerator == "cuda"
    defaults = {
        "clients": [20, 100] if cuda else [2, 20, 100, 1000],
        "systems": ["floor", "fedlit"] if cuda else ["floor", "fedlit", "flower"],
        "task": ["vit"] if cuda else ["vit", "heart"],
        "fused": [10, 20] if cuda else [],
        "precision": ["32-true", "bf16-mixed"] if cuda else ["32-true"],
    }
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    args.peaks = {
        kind: given if (given := getattr(args, f"peak_{kind}")) is not None else (peak if cuda else None)
        for kind, peak in H100_PEAK_TFLOPS.items()
    }


def overrides(args: argparse.Namespace, precision: str, task: str) -> list[str]:
    """The ``fedlit fit`` overrides of the device, the precision and (task ``vit``) the model size: the same for every
    system; they come before the task's own (``--quick``'s one-block ViT wins over ``--vit-base``)."""
    extra = ["--federation.accelerator", args.accelerator, "--federation.precision", precision]
    if args.matmul_precision is not None:
        extra += ["--federation.matmul_precision", args.matmul_precision]
    return extra + (VIT_BASE if args.vit_base and task == "vit" else [])


def peak_kind(precision: str, matmul_precision: str | None) -> str:
    """Which peak bounds a run: ``bf16``, ``tf32`` or ``fp32``."""
    if precision != "32-true" or matmul_precision == "medium":
        return "bf16"
    return "tf32" if matmul_precision == "high" else "fp32"


def bound_seconds(flops: float | None, precision: str, args: Any) -> float | None:
    """A round's compute bound in seconds: its FLOPs over the peak of its precision; None without either."""
    peak = args.peaks.get(peak_kind(precision, args.matmul_precision))
    return None if flops is None or peak is None else flops / (peak * 1e12)


def bound_note(args: Any) -> str:
    """What the ``x bound`` column divides by, or why it is empty."""
    used = sorted({peak_kind(p, args.matmul_precision) for p in args.precision})
    missing = [k for k in used if args.peaks.get(k) is None]
    if missing:
        given = " ".join(f"--peak-{k} TFLOP/s" for k in missing)
        return f"x bound: not computed for {', '.join(missing)} (no peak throughput of this device: give {given})"
    return (
        "x bound: s / round over (the round's FLOPs / the peak: "
        + ", ".join(f"{k} {args.peaks[k]:g} TFLOP/s" for k in used)
        + ")"
    )


def fedlit_gpu_peak(out: Path) -> float | None:
    """The largest ``system/peak_memory_mb`` (``torch.cuda.max_memory_allocated`` on CUDA) of a fedlit run."""
    with open(out / "metrics.csv", newline="", encoding="utf-8") as f:
        values = [
            float(r["value"]) for r in csv.DictReader(f) if (r["split"], r["metric"]) == ("system", "peak_memory_mb")
        ]
    return max(values) if values else None


def gpu_goals(rows: list[Any]) -> list[str]:
    """The GPU goals at N = 20 in bf16-mixed: fedlit at most 1.03x the floor, fused at least 2x faster than the
    floor, and the fused run's GPU memory at most 2x the unfused one's at every K."""

    def find(system: str) -> Any:
        return next(
            (r for r in rows if (r.clients, r.precision, r.system) == (20, "bf16-mixed", system) and r.ok), None
        )

    floor, fed = find("floor"), find("fedlit")
    fused = [r for r in rows if r.ok and (r.clients, r.precision) == (20, "bf16-mixed") and "fused" in r.system]
    if not (floor and fed):
        return ["- GPU, N = 20, bf16-mixed: not measured"]
    lines = [
        f"- GPU, N = 20, bf16: fedlit at most 1.03x the floor: {_verdict(fed.per_round / floor.per_round <= 1.03)}"
        f" ({fed.per_round / floor.per_round:.2f}x)"
    ]
    if fused:
        best = min(fused, key=lambda r: r.per_round)
        memory = max((r.gpu_peak or 0) / (fed.gpu_peak or float("inf")) for r in fused)
        faster = floor.per_round / best.per_round
        lines.append(
            f"- GPU, N = 20, bf16: fused at least 2x faster than the floor: {_verdict(faster >= 2)} "
            f"({best.system}, {faster:.2f}x)"
        )
        lines.append(
            f"- GPU, N = 20, bf16: fused GPU memory at most 2x unfused at every K: {_verdict(memory <= 2)} "
            f"(at most {memory:.2f}x)"
        )
    return lines


def _verdict(ok: bool) -> str:
    return "pass" if ok else "miss"
