"""``fedlit partition --config RECIPE [--section.key value ...] [--out DIR]``: how a recipe splits its data.

Builds the recipe's data module (``setup()``: reading, partitioning and splitting) and nothing else: no model, no
training. Prints each client's samples per split, and per class for classification (what
:meth:`~fedlit.data.FederatedDataModule.class_counts` gives); for other tasks (segmentation, survival...) the
samples per split. Writes ``partition.json`` (the same numbers) and ``partition.png``, a dot plot of the train
split: clients on the x axis, classes on the y axis, each dot's area proportional to the client's train samples
of that class (one row of totals for a task without classes). ``--out`` defaults to ``runs/<name>/partition``.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

from fedlit.core.files import write_text_atomic

if TYPE_CHECKING:
    from matplotlib.typing import RcKeyType

SPLITS = ("train", "val", "test")
#: Up to this many clients, the plot writes each count beside its dot.
LABELLED = 8
#: Labels are data (client ids, class and method names): drawn as plain text, never as mathtext (``$\frac{x$``
#: would not parse, ``$x$`` would change) nor LaTeX, whatever the user's matplotlibrc says.
PLAIN_TEXT: dict[RcKeyType, Any] = {"text.parse_math": False, "text.usetex": False}
#: Vector formats a figure is also written in (``fedlit report --vector``). PDFs embed TrueType (Type 42) fonts,
#: not matplotlib's default Type 3, which some publishers' checks refuse; SVGs keep text as text (editable).
VECTOR_FORMATS = ("pdf", "svg")
_VECTOR_RC: dict[RcKeyType, Any] = {"pdf.fonttype": 42, "ps.fonttype": 42, "svg.fonttype": "none"}
_P = ParamSpec("_P")
_R = TypeVar("_R")


def plain_text(draw: Callable[_P, _R]) -> Callable[_P, _R]:
    """``draw`` run with matplotlib's Agg backend (files only: no display needed) and :data:`PLAIN_TEXT`."""

    @functools.wraps(draw)
    def drawn(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        import matplotlib

        matplotlib.use("Agg")
        with matplotlib.rc_context({**PLAIN_TEXT, **_VECTOR_RC}):
            return draw(*args, **kwargs)

    return drawn


def add_arguments(parser: Any) -> None:
    """``--out``, the folder of ``partition.json`` and ``partition.png``."""
    parser.add_argument(
        "--out",
        type=str | None,
        default=None,
        help="Folder of partition.json and partition.png (default: runs/<name>/partition).",
    )


def class_names(datamodule: Any) -> list[str] | None:
    """Names of the counted classes, or None for a task without classes."""
    counts = datamodule.class_counts()
    if counts is None:
        return None
    data = datamodule.data
    names = getattr(data, "class_names", None) or (getattr(data, "details", None) or {}).get("class_names")
    width = len(next(iter(next(iter(counts.values())).values()))) if counts else 0
    if datamodule.task == "binary":
        return ["negative", "positive"] if not names or len(names) != 2 else [str(n) for n in names]
    if names and len(names) == width:
        return [str(n) for n in names]
    return [f"class {i}" for i in range(width)]


def summarize(datamodule: Any) -> dict[str, Any]:
    """Per client: ``samples`` (split -> count) and, for classification, ``classes`` (split -> per-class counts)."""
    counts = datamodule.class_counts()
    clients: dict[str, Any] = {}
    for client_id in datamodule.client_ids:
        entry: dict[str, Any] = {"samples": {s: datamodule.num_examples(client_id, s) for s in SPLITS}}
        if counts is not None:
            entry["classes"] = {s: list(counts[client_id][s]) for s in SPLITS}
        if client_id in datamodule.evaluation_only:
            entry["evaluation_only"] = True
        clients[client_id] = entry
    return {
        "dataset": type(datamodule).__name__,
        "task": datamodule.task,
        "seed": getattr(datamodule, "seed", None),
        "classes": class_names(datamodule),
        "clients": clients,
    }


def table(summary: dict[str, Any]) -> str:
    """The summary as text: one line per client and split."""
    names = summary["classes"]
    head = ["client", "split", "samples"] + (names or [])
    rows = [head]
    for client_id, entry in summary["clients"].items():
        for split in SPLITS:
            row = [client_id, split, str(entry["samples"][split])]
            if names:
                row += [str(v) for v in entry["classes"][split]]
            rows.append(row)
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = [
        "  ".join(c.rjust(w) if i >= 2 else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True)))
        for r in rows
    ]
    return "\n".join(line.rstrip() for line in lines)


def save_figure(fig: Any, path: Path, vector: str | None = None, **kwargs: Any) -> None:
    """Write ``fig`` to ``path`` (its suffix gives the format) and, with ``vector`` (one of
    :data:`VECTOR_FORMATS`), to the same path with that suffix."""
    if vector is not None and vector not in VECTOR_FORMATS:
        raise ValueError(f"vector={vector!r}: the vector formats are {', '.join(VECTOR_FORMATS)} (or None)")
    fig.savefig(path, **kwargs)
    if vector is not None:
        fig.savefig(path.with_suffix(f".{vector}"), **kwargs)


@plain_text
def plot(summary: dict[str, Any], path: Path, *, title: str | None = None, vector: str | None = None) -> Path:
    """The dot plot of the train split (see the module's docstring), written to ``path`` (PNG) and, with
    ``vector``, beside it as a PDF or SVG. ``title`` replaces the first line of the default title."""
    import matplotlib.pyplot as plt

    clients = list(summary["clients"])
    names = summary["classes"] or ["train samples"]
    values = [
        e["classes"]["train"] if summary["classes"] else [e["samples"]["train"]] for e in summary["clients"].values()
    ]
    largest = max((v for row in values for v in row), default=0) or 1
    width = max(5.0, 1.0 + 0.55 * len(clients))
    height = max(2.5, 1.2 + 0.45 * len(names))
    fig, ax = plt.subplots(figsize=(width, height), dpi=120)
    max_area = 900.0 if len(clients) <= 20 else 300.0
    for x, row in enumerate(values):
        for y, v in enumerate(row):
            if v > 0:
                ax.scatter(x, y, s=max_area * v / largest, color="tab:blue", alpha=0.7, edgecolors="none")
            else:  # a zero drawn as a small grey cross: no dot would look like a count missing
                ax.scatter(x, y, s=16, marker="x", color="0.55", linewidths=1)
            if len(clients) <= LABELLED:  # the count beside its dot (marker size s is an area in points^2)
                ax.annotate(
                    str(v),
                    (x, y),
                    textcoords="offset points",
                    xytext=(math.sqrt(max_area * v / largest if v > 0 else 16) / 2 + 2, 0),
                    ha="left",
                    va="center",
                    fontsize=7,
                )
    ax.set_xticks(range(len(clients)))
    ax.set_xticklabels(
        clients,
        rotation=45 if len(clients) > 6 or max(map(len, clients), default=0) > 8 else 0,
        ha="right" if len(clients) > 6 else "center",
        fontsize=8,
    )
    ax.set_yticks(range(len(names)))
    ax.set_yticklabels(names, fontsize=8)
    ax.set_xlim(-0.7, len(clients) - 0.3)
    ax.set_ylim(-0.8, len(names) - 0.4)
    ax.set_xlabel("client")
    ax.set_ylabel("class" if summary["classes"] else "")
    heading = title if title is not None else f"{summary['dataset']}: train samples per client"
    zero = "; a grey x: zero" if any(v == 0 for row in values for v in row) else ""
    ax.set_title(f"{heading}\n(dot area ~ count; largest {largest}{zero})", fontsize=9)
    ax.grid(True, color="0.9", zorder=0)
    ax.set_axisbelow(True)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    save_figure(fig, path, vector)
    plt.close(fig)
    return path


@dataclass
class PartitionJob:
    """``fedlit partition``: the data module built, ready to summarize."""

    datamodule: Any
    out: Path

    def __call__(self) -> dict[str, Any]:
        summary = summarize(self.datamodule)
        print(table(summary), flush=True)
        self.out.mkdir(parents=True, exist_ok=True)
        write_text_atomic(self.out / "partition.json", json.dumps(summary, indent=2) + "\n")
        png = plot(summary, self.out / "partition.png")
        print(f"fedlit partition: {self.out / 'partition.json'}, {png}", flush=True)
        return summary


HELP = "Build a recipe's data only: print each client's samples per split and class, plot them."


def parser(name: str = "partition") -> Any:
    """The options of ``fedlit partition``: a recipe and ``--out``."""
    from fedlit.config.parser import recipe_parser

    sub = recipe_parser(name, HELP)
    add_arguments(sub)
    return sub


def command(argv: list[str]) -> PartitionJob:
    """``fedlit partition ...`` parsed and its data built (configuration errors are raised here)."""
    from fedlit.config.parser import load

    return prepare(load(argv, parser(argv[0])).options)


def prepare(cfg: Any) -> PartitionJob:
    """Build and set up only the data module of the parsed ``partition`` configuration."""
    from jsonargparse import ArgumentParser
    from lightning.fabric.utilities.seed import seed_everything

    from fedlit.config import resolve as runnames
    from fedlit.config.build import instantiate
    from fedlit.data import FederatedDataModule
    from fedlit.engine.loop.settings import check_seed

    parser = ArgumentParser(exit_on_error=False)
    parser.add_subclass_arguments(FederatedDataModule, "data", required=True)
    check_seed(cfg.federation.seed)
    seed_everything(cfg.federation.seed, verbose=False)  # as fit does: generated data is the run's
    data = instantiate(parser, parser.parse_object({"data": cfg.data.as_dict()})).data
    data.setup()
    out = Path(cfg.out) if cfg.out else runnames.run_root(cfg) / "partition"
    return PartitionJob(data, out)
