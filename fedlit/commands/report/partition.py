"""The Partition section of ``fedlit report``: the train samples per class and client of the runs, drawn by
:func:`fedlit.commands.partition_summary.plot` once per distinct partition. Each seed draws its own partition, but
seeds that drew the same one (a fixed split, as FLamby's data sets have) share one figure. See
:mod:`fedlit.commands.report.figures`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from fedlit.commands.report.render import Block, twin
from fedlit.commands.report.runs import Run

__all__ = ["partition_blocks", "partition_summary"]


def partition_blocks(runs: list[Run], out: Path, vector: str | None) -> list[Block]:
    """The Partition section: per seed, the partition of its first run with a readable one; one figure for the
    seeds whose partitions are identical, ``partition_seed_<s>.png`` after the first of them. Runs of a seed whose
    partition differs from that of the seed's first run (other data) are named."""
    from fedlit.commands.partition_summary import plot

    by_seed: dict[str, list[tuple[Run, dict[str, Any]]]] = {}
    for run in runs:
        summary = partition_summary(run)
        if summary is not None:
            by_seed.setdefault(str(run.seed), []).append((run, summary))
    if not by_seed:
        return []
    shared: list[tuple[list[str], Run, dict[str, Any]]] = []  # seeds, the first run, its partition
    for seed, found in by_seed.items():
        first, summary = found[0]
        same = next((entry for entry in shared if entry[2] == summary), None)
        if same is None:
            shared.append(([seed], first, summary))
        else:
            same[0].append(seed)
    blocks: list[Block] = [
        ("h", 2, "Partition"),
        (
            "p",
            "Train samples per class and client, from the first run of each seed (its class_counts.json or "
            "manifest.json): one figure per distinct partition (each seed draws its own; seeds that drew the "
            "same one, as with a fixed split, share a figure).",
        ),
    ]
    for seeds, first, summary in shared:
        png = out / f"partition_seed_{seeds[0]}.png"
        which = f"seed {seeds[0]}" if len(seeds) == 1 else f"seeds {', '.join(seeds)}"
        plot(summary, png, title=f"{which}: {summary['dataset']}, train samples per client", vector=vector)
        samples = {_samples(by_seed[s][0][0]) for s in seeds}  # the same counts may be of other samples
        each = (
            ""
            if len(seeds) == 1
            else ", the same for each"
            if len(samples) == 1
            else ", the same counts for each (of other samples: the splits differ)"
        )
        blocks.append(
            ("img", png, f"Partition of {which}{each} (from {first.method}, {first.folder})", twin(png, vector))
        )
    for seed, found in by_seed.items():
        others = [r for r, s in found[1:] if s != found[0][1]]
        if others:
            blocks.append(
                (
                    "p",
                    f"Seed {seed}: the runs {', '.join(str(r.folder) for r in others)} have another "
                    "partition (other data?), not drawn.",
                )
            )
    return blocks


def _samples(run: Run) -> str:
    """The samples of each client's splits (the manifest's pool indices), as JSON text (``null`` without one)."""
    return json.dumps((run.manifest or {}).get("clients"), sort_keys=True)


def partition_summary(run: Run) -> dict[str, Any] | None:
    """What :func:`fedlit.commands.partition_summary.plot` draws, from a run folder: ``class_counts.json`` (train
    samples per class and client) or, for a task without classes, the manifest's train samples per client; None when
    neither is readable."""
    manifest = run.manifest or {}
    dataset = str(manifest.get("class") or manifest.get("dataset") or "data")
    try:
        counts = json.loads((run.folder / "class_counts.json").read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        counts = None
    if isinstance(counts, dict) and counts:
        width = len(next(iter(counts.values()))["train"])
        names = manifest.get("class_names") or (manifest.get("details") or {}).get("class_names")
        names = [str(n) for n in names] if names and len(names) == width else [f"class {i}" for i in range(width)]
        return {
            "dataset": dataset,
            "classes": names,
            "clients": {
                c: {"classes": {"train": list(v["train"])}, "samples": {"train": sum(v["train"])}}
                for c, v in counts.items()
            },
        }
    clients = manifest.get("clients")
    if isinstance(clients, dict) and clients:
        return {
            "dataset": dataset,
            "classes": None,
            "clients": {c: {"samples": {"train": len(v.get("train", []))}} for c, v in clients.items()},
        }
    return None
