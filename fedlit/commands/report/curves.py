"""The per-round figures of ``fedlit report`` (matplotlib, Agg backend), from the server rows of each run's
``metrics.csv``: convergence (the mean validation metric per round), the training loss per round (drawn too when
a method has no validation split, so every run has a curve) and the cost figure (the mean validation metric
against cumulative upload bytes). Each returns whether it drew anything; a figure is a PNG and, unless ``vector``
is None, the same figure as a vector file beside it. See :mod:`fedlit.commands.report.figures`."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fedlit.commands.partition_summary import plain_text, save_figure
from fedlit.commands.report.runs import Run

__all__ = ["convergence", "cost", "train_metric", "training_curve"]


def _pyplot() -> Any:
    import matplotlib.pyplot as plt  # the Agg backend and plain-text labels: set by @plain_text

    return plt


def _legend(ax: Any) -> None:
    """Inside the axes for a few methods; beside them for many, where it would hide lines."""
    if len(ax.get_lines()) > 5:
        ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    else:
        ax.legend(fontsize="small")


def _per_round(ax: Any, groups: Mapping[str, list[Run]], split: str, name: str) -> tuple[bool, bool]:
    """One line per method: the mean over its seeds of the server series ``split``/``name``, with a min-max band
    over seeds where it has several. Returns (drawn, a band drawn)."""
    drawn = banded = False
    for method, runs in groups.items():
        series = [s for s in (r.series(split, name) for r in runs) if s]
        if not series:
            continue
        rounds = sorted({k for s in series for k in s})
        values = [[s[k] for s in series if k in s] for k in rounds]
        mean = [sum(v) / len(v) for v in values]
        (line,) = ax.plot(rounds, mean, marker="o", markersize=3, label=f"{method} (n={len(series)})")
        if len(series) > 1:
            ax.fill_between(
                rounds, [min(v) for v in values], [max(v) for v in values], alpha=0.2, color=line.get_color()
            )
            banded = True
        drawn = True
    return drawn, banded


@plain_text
def convergence(groups: Mapping[str, list[Run]], metric: str, path: Path, vector: str | None = None) -> bool:
    """Mean validation ``metric`` per round, one line per method (mean over seeds), a min-max band over seeds for
    the methods with several (the title claims the band only then). Returns False (and writes nothing) when no run
    has validation rows."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.2))
    drawn, banded = _per_round(ax, groups, "val", f"{metric}_mean")
    if drawn:
        ax.xaxis.set_major_locator(plt.MaxNLocator(integer=True))
    title = f"Convergence: mean validation {metric}" + (" (band: min-max over seeds)" if banded else "")
    return _finish(plt, fig, ax, path, drawn, "round", f"mean validation {metric}", title, vector)


def train_metric(groups: Mapping[str, list[Run]]) -> str | None:
    """The server series of the training split that the runs' ``metrics.csv`` hold: ``loss_mean`` where a run has
    it, else the first ``*_mean`` of the split; None when no run has training rows."""
    names = sorted(
        {m for runs in groups.values() for r in runs for _, c, s, m, _ in r.rows or [] if c == "" and s == "train"}
    )
    means = [m for m in names if m.endswith("_mean")]
    return "loss_mean" if "loss_mean" in means else next(iter(means), None)


@plain_text
def training_curve(groups: Mapping[str, list[Run]], name: str, path: Path, vector: str | None = None) -> bool:
    """The training split's ``name`` (:func:`train_metric`, the clients' mean training loss) per round, one line
    per method as :func:`convergence`. Returns False when no run has those rows."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.2))
    drawn, banded = _per_round(ax, groups, "train", name)
    if drawn:
        ax.xaxis.set_major_locator(plt.MaxNLocator(integer=True))
    shown = name.removesuffix("_mean")
    title = f"Training: mean {shown} per round" + (" (band: min-max over seeds)" if banded else "")
    return _finish(plt, fig, ax, path, drawn, "round", f"mean training {shown}", title, vector)


@plain_text
def cost(groups: Mapping[str, list[Run]], metric: str, path: Path, vector: str | None = None) -> bool:
    """Mean validation ``metric`` against cumulative upload bytes per round, one line per method (first seed's
    bytes, mean metric over seeds). Returns False when no run has both."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.2))
    drawn = False
    for method, runs in groups.items():
        pairs = [(r.series("comm", "upload_bytes_cumulative"), r.series("val", f"{metric}_mean")) for r in runs]
        pairs = [(b, m) for b, m in pairs if b and m]
        if not pairs:
            continue
        rounds = sorted(set(pairs[0][1]) & set(pairs[0][0]))
        x = [pairs[0][0][k] for k in rounds]
        y = [sum(m[k] for _, m in pairs if k in m) / sum(1 for _, m in pairs if k in m) for k in rounds]
        ax.plot(x, y, marker="o", markersize=3, label=method)
        drawn = True
    if drawn:
        largest = max((x for line in ax.get_lines() for x in line.get_xdata()), default=0.0)
        scale, unit = next(((f, u) for f, u in ((1e9, "GB"), (1e6, "MB"), (1e3, "kB")) if largest >= f), (1, "bytes"))
        for line in ax.get_lines():  # a readable unit: tick labels of 0.000125 MB overlap
            line.set_xdata([x / scale for x in line.get_xdata()])
        ax.relim()
        ax.autoscale_view()
    return _finish(
        plt,
        fig,
        ax,
        path,
        drawn,
        f"cumulative upload ({unit if drawn else 'bytes'})",
        f"mean validation {metric}",
        f"Mean validation {metric} against bytes uploaded",
        vector,
    )


def _finish(
    plt: Any, fig: Any, ax: Any, path: Path, drawn: bool, xlabel: str, ylabel: str, title: str, vector: str | None
) -> bool:
    """Label, grid, legend and save a drawn figure to ``path`` (and its ``vector`` twin); close it either way.
    Returns ``drawn``."""
    if drawn:
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.grid(alpha=0.3)
        _legend(ax)
        fig.tight_layout()
        save_figure(fig, path, vector, dpi=110)
    plt.close(fig)
    return drawn
