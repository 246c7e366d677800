"""The figures of ``fedlit report`` (matplotlib, Agg backend) and its content (:func:`build`), a list of blocks that
:mod:`fedlit.commands.report.render` renders as ``report.md`` and the self-contained ``report.html``. Each figure is
a PNG and, unless ``vector`` is None, the same figure as a vector file beside it (``convergence.pdf``...), for
papers. See :mod:`fedlit.commands.report`."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fedlit.commands.partition_summary import plain_text, save_figure
from fedlit.commands.report import runs as report_runs
from fedlit.commands.report.render import Block, fmt, fmt_count, markdown, to_html
from fedlit.commands.report.runs import Run
from fedlit.engine.records import baseline

# The rendering (Block, fmt, fmt_count, markdown, to_html) lives in fedlit.commands.report.render; its names stay
# importable here.
__all__ = [
    "Block",
    "bold_best",
    "build",
    "convergence",
    "cost",
    "fmt",
    "fmt_count",
    "markdown",
    "partition_blocks",
    "partition_summary",
    "sampling_blocks",
    "to_html",
]


def _pyplot() -> Any:
    import matplotlib.pyplot as plt  # the Agg backend and plain-text labels: set by @plain_text

    return plt


def _legend(ax: Any) -> None:
    """Inside the axes for a few methods; beside them for many, where it would hide lines."""
    if len(ax.get_lines()) > 5:
        ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    else:
        ax.legend(fontsize="small")


@plain_text
def convergence(groups: Mapping[str, list[Run]], metric: str, path: Path, vector: str | None = None) -> bool:
    """Mean validation ``metric`` per round, one line per method (mean over seeds), a min-max band over seeds.
    Returns False (and writes nothing) when no run has validation rows."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.2))
    drawn = False
    for method, runs in groups.items():
        series = [s for s in (r.series("val", f"{metric}_mean") for r in runs) if s]
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
        drawn = True
    if drawn:
        ax.xaxis.set_major_locator(plt.MaxNLocator(integer=True))
    return _finish(
        plt,
        fig,
        ax,
        path,
        drawn,
        "round",
        f"mean validation {metric}",
        f"Convergence: mean validation {metric} (band: min-max over seeds)",
        vector,
    )


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


def bold_best(cells: dict[str, tuple[float, float]], methods: list[str], metric: str) -> list[str]:
    # compared as shown (4 decimals): 0.525 and 0.52499999 are a tie
    means = {m: round(cells[m][0], 4) for m in methods if m in cells and not math.isnan(cells[m][0])}
    best = (max if report_runs.higher_is_better(metric) else min)(means.values()) if means else None
    return [f"**{fmt(cells.get(m))}**" if m in means and means[m] == best else fmt(cells.get(m)) for m in methods]


def build(
    runs: list[Run], warnings: list[str], out: Path, metric: str, baseline_name: str, vector: str | None = None
) -> list[tuple]:
    """The report's blocks (see :data:`~fedlit.commands.report.render.Block`); writes the figures into ``out``, each
    also as a ``vector`` (``pdf``, ``svg``) file unless it is None."""
    groups = report_runs.by_method(runs)
    methods = list(groups)
    baseline_class = next(
        (
            r.strategy_class
            for r in runs
            if r.strategy_class == baseline_name or r.strategy_class.rsplit(".", 1)[-1] == baseline_name
        ),
        None,
    )
    blocks: list[tuple] = [
        ("h", 1, f"fedlit report: {metric}"),
        (
            "p",
            f"{len(runs)} runs, {len(methods)} methods: "
            + ", ".join(
                f"{m} ({len(r)} seed{'s' * (len(r) > 1)}: " + ", ".join(str(x.seed) for x in r) + ")"
                for m, r in groups.items()
            )
            + ". Values are test metrics, mean ± standard error of the mean over the k seeds (sample "
            "std / √k; no ± with one seed).",
        ),
    ]
    for warning in warnings:
        blocks.append(("p", "Warning: " + warning))
    for when, title in (("best", "at the best-validation round"), ("last", "at the last round")):
        table = report_runs.client_table(groups, when, metric, report_runs.mean_se)
        if not any(table.values()):
            blocks += [("h", 2, f"Per-client test {metric} {title}"), ("p", f"No run has '{when}' results.")]
            continue
        rows = [[f"**{c}**" if c == "average" else c, *bold_best(cells, methods, metric)] for c, cells in table.items()]
        blocks += [
            ("h", 2, f"Per-client test {metric} {title}"),
            ("table", ["client", *methods], rows),
            (
                "p",
                "average: each run's mean over its clients, then mean ± standard error over seeds; bold: "
                "the best method of the row.",
            ),
        ]
        blocks += sampling_blocks(groups, when, metric)
    when = "best" if all("best" in r.results for r in runs) else "last"
    rows = []
    found_local = baseline_class is not None
    stats = report_runs.summary(groups, when, metric, baseline_class or baseline.LOCAL, report_runs.mean_se)
    for method, row in stats.items():
        gain = fmt(row["gain"], sign=True) if "gain" in row else "—"
        paired = ", ".join(map(str, row.get("paired", []))) or "—"
        rows.append(
            [method, str(row["seeds"]), fmt(row["mean"]), fmt(row["worst"]), *([gain, paired] if found_local else [])]
        )
    header = ["method", "seeds", f"mean {metric}", f"worst-client {metric}"]
    blocks += [
        ("h", 2, f"Mean and worst client ({when} round)"),
        ("table", header + ([f"gain over {baseline_name}", "seeds paired"] if found_local else []), rows),
    ]
    blocks.append(
        (
            "p",
            f"Gain over {baseline_name}: per seed, each client's {metric} minus that of the "
            f"{baseline_name} run of the same seed (its {when} round), averaged over clients; then mean ± "
            "standard error over the paired seeds (sample std / √k)."
            if found_local
            else f"No run of {baseline_name} among the inputs: no gain over it.",
        )
    )
    for method, row in stats.items():
        for why in row.get("unpaired", []):
            blocks.append(("p", f"Not paired ({method}): {why}"))
    curves = out / "convergence.png"
    blocks.append(("h", 2, "Convergence"))
    blocks.append(
        ("img", curves, f"Mean validation {metric} per round", _twin(curves, vector))
        if convergence(groups, metric, curves, vector)
        else ("p", "No validation rows in any metrics.csv: no convergence figure.")
    )
    rows = []
    for method, method_runs in groups.items():
        comm = [r.results.get("comm") or {} for r in method_runs]
        params = [v for r in method_runs for v in [r.series("system", "trainable_parameters")] if v]
        rows.append(
            [
                method,
                *(
                    fmt_count(report_runs.mean_std([float(c[k]) for c in comm if k in c]))
                    for k in ("upload_bytes", "download_bytes", "eval_download_bytes")
                ),
                f"{max(params[0].values()):,.0f}" if params else "—",
            ]
        )
    blocks += [
        ("h", 2, "Cost"),
        ("table", ["method", "upload bytes", "download bytes", "eval download bytes", "trainable parameters"], rows),
        (
            "p",
            "Bytes from results.json (comm), per run, mean over seeds; trainable parameters from "
            "metrics.csv (system/trainable_parameters; — where a run's metrics.csv has none).",
        ),
    ]
    cost_png = out / "cost.png"
    if cost(groups, metric, cost_png, vector):
        blocks += [
            ("h", 3, f"Mean validation {metric} against bytes uploaded"),
            ("img", cost_png, f"Mean validation {metric} against cumulative upload bytes", _twin(cost_png, vector)),
        ]
    blocks += partition_blocks(runs, out, vector)
    diff = report_runs.config_differences(runs)
    names = [r.recipe + ("/" + r.folder.name if r.recipe != r.folder.name else "") for r in runs]
    blocks.append(("h", 2, "Configurations: the keys that differ"))
    blocks.append(
        ("table", ["key", *names], [[k, *map(str, v)] for k, v in diff.items()])
        if diff
        else ("p", "The runs' configurations are the same (out_dir aside).")
    )
    return blocks


def sampling_blocks(groups: Mapping[str, list[Run]], when: str, metric: str) -> list[Block]:
    """The sampling standard error of every cell of a per-client table (see :func:`report_runs.sampling_se`): per
    run, at the run's value on its own test split (``class_counts.json``), then the mean over the method's runs.
    The average row: per run sqrt(sum of the clients' squared errors) / clients, then the mean over runs. Nothing
    for other metrics or runs without that file."""
    if metric not in report_runs.PROPORTIONS:
        return []
    sizes: dict[str, set[int]] = {}
    errors: dict[str, dict[str, list[float]]] = {}
    for method, runs in groups.items():
        for run in runs:
            counts = report_runs.held_out_counts(run)
            values = {
                c: report_runs.sampling_se(metric, v, counts[c])
                for c, v in report_runs.client_values(run, when, metric).items()
                if c in counts
            }
            for c, se in values.items():
                sizes.setdefault(c, set()).add(sum(counts[c]))
                errors.setdefault(c, {}).setdefault(method, []).append(se)
            if values:
                errors.setdefault("average", {}).setdefault(method, []).append(
                    math.sqrt(sum(e**2 for e in values.values())) / len(values)
                )
    if not sizes:
        return []
    methods = list(groups)
    rows = [
        [
            f"**{c}**" if c == "average" else c,
            "—" if c == "average" else "–".join(map(str, sorted({min(sizes[c]), max(sizes[c])}))),
            *(_se(report_runs.mean_std(cells[m])[0] if m in cells else None) for m in methods),
        ]
        for c, cells in errors.items()
    ]
    how = (
        "sqrt(p(1-p)/n), n the client's test samples"
        if metric == "accuracy"
        else "sqrt(Σ_k p(1-p)/n_k) / K over the K classes in the client's test split, each class's recall taken as p"
    )
    return [
        ("table", ["client", "test samples", *methods], rows),
        (
            "p",
            f"Sampling standard error of each {metric} above: {how}, per run (its value p, its test split), "
            "then the mean over seeds. It is how far a client's value moves from one draw of its test set to "
            "another; methods closer than about twice it cannot be told apart on that client (the seeds' standard "
            "error above does not include it).",
        ),
    ]


def _se(value: float | None) -> str:
    return "—" if value is None or math.isnan(value) else f"{value:.4f}"


def _twin(path: Path, vector: str | None) -> Path | None:
    return None if vector is None else path.with_suffix(f".{vector}")


def partition_blocks(runs: list[Run], out: Path, vector: str | None) -> list[Block]:
    """The Partition section: one figure per seed (each seed draws its own partition), from the first run of that
    seed with a readable partition; runs of the same seed whose partition differs (other data) are named."""
    from fedlit.commands.partition_summary import plot

    by_seed: dict[str, list[tuple[Run, dict[str, Any]]]] = {}
    for run in runs:
        summary = partition_summary(run)
        if summary is not None:
            by_seed.setdefault(str(run.seed), []).append((run, summary))
    if not by_seed:
        return []
    blocks: list[Block] = [
        ("h", 2, "Partition"),
        (
            "p",
            "Train samples per class and client, one figure per seed (each seed draws its own "
            "partition), from the first run of that seed (its class_counts.json or manifest.json).",
        ),
    ]
    for seed, found in by_seed.items():
        first, summary = found[0]
        png = out / f"partition_seed_{seed}.png"
        plot(summary, png, title=f"seed {seed}: {summary['dataset']}, train samples per client", vector=vector)
        blocks.append(
            ("img", png, f"Partition of seed {seed} (from {first.method}, {first.folder})", _twin(png, vector))
        )
        others = [r for r, s in found[1:] if s != summary]
        if others:
            blocks.append(
                (
                    "p",
                    f"Seed {seed}: the runs {', '.join(str(r.folder) for r in others)} have another "
                    "partition (other data?), not drawn.",
                )
            )
    return blocks


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
