"""``fedlit report RUN_OR_EXPERIMENT... [--out DIR] [--metric accuracy] [--baseline Local]``: compare finished runs.

Each argument is a run folder of ``fedlit fit`` (it holds ``results.json``) or a folder searched recursively for
such run folders (an experiment of several seeds, or several experiments). Runs are grouped into methods by what
they are, not where they sit: a method is a strategy class (``strategy_class`` in ``results.json``) with one
configuration (``config.json`` and the recorded strategy arguments, less paths, names and seeds), labelled by what
sets it apart from the other runs of its class (``FedAvg lr=0.1``); its runs are its seeds, one run per seed
(:mod:`fedlit.commands.report.methods`). Every ranking follows the direction each metric's module declared
(``higher_is_better`` in ``results.json``). The report (``report.md``, a self-contained ``report.html`` and the
figures as PNG files, each also as a PDF or SVG unless ``--vector none``) holds:

- the per-client test metric at the best-validation round and at the last round, mean +- standard error of the
  mean over the k seeds (sample std / sqrt(k)), and for accuracy and balanced accuracy the sampling standard error
  of every cell (its test set's size from the run's ``class_counts.json``): whether a client can resolve a
  difference of a few points at all;
- per method, the mean and the worst client, FLamby's pooled figure where the runs recorded it and, with a run of
  the baseline strategy among the inputs, the mean individual gain over it (runs paired by seed; positive is
  better), each mean +- standard error over seeds; the gain also with its 95 % t-interval over the paired seeds
  (k - 1 degrees of freedom) and a verdict: "beats"/"loses to" the baseline only where the interval excludes zero,
  else "not separated at k seeds" (:mod:`fedlit.commands.report.interval`);
- convergence (mean validation metric per round, a min-max band over seeds; the mean training loss per round too
  where a method has no validation split) and cost (bytes, trainable parameters, the metric against cumulative
  upload bytes);
- the partition of each seed (train samples per class and client), drawn once for seeds that share it;
- the resolved configurations, only the keys that differ, one column per run named by its path (for a run built in
  Python, whose ``config.json`` has no ``strategy`` or ``callbacks``, the arguments ``results.json`` records).

The output folder of ``fedlit grid`` (it holds ``grid.json``; or any folder with ``--table grid``) adds, first,
the benchmark's table in FHBench's Table 2 layout: data sets as rows, methods as columns, each cell mean ± standard
error over seeds at the best-validation round, the best of each row in bold (:mod:`fedlit.commands.report.grid`);
its methods are then named ``<data set>/<method>``. The metric is ``--metric``, by default the selection metric the
runs share (``accuracy`` when they differ).

A run whose ``results.json`` or ``metrics.csv`` is missing or unreadable is named in a warning and left out (or,
for ``metrics.csv``, left out of the curves); the report fails only when no run can be read.

The runs are read and the numbers computed in :mod:`fedlit.commands.report.runs` (its names are importable from
here too); the figures are drawn in :mod:`fedlit.commands.report.figures` and the report rendered in
:mod:`fedlit.commands.report.render`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from fedlit.commands.partition_summary import VECTOR_FORMATS
from fedlit.commands.report import energy as report_energy
from fedlit.commands.report import grid as report_grid
from fedlit.commands.report.figures import build
from fedlit.commands.report.interval import Interval, gain_sentence, t_interval, verdict
from fedlit.commands.report.methods import NOT_METHOD, by_method, load_runs, name_methods, run_names, setting
from fedlit.commands.report.render import markdown, plural, to_html
from fedlit.commands.report.runs import (
    PROPORTIONS,
    SEED_OR_VERSION,
    Run,
    client_table,
    client_values,
    config_differences,
    find_runs,
    flatten,
    held_out_counts,
    higher_is_better,
    load_run,
    mean_se,
    mean_std,
    read_metrics,
    sampling_se,
    summary,
)
from fedlit.core.errors import ConfigError
from fedlit.core.files import write_text_atomic

__all__ = [
    "Interval",
    "NOT_METHOD",
    "PROPORTIONS",
    "SEED_OR_VERSION",
    "Run",
    "by_method",
    "client_table",
    "client_values",
    "config_differences",
    "find_runs",
    "flatten",
    "gain_sentence",
    "held_out_counts",
    "higher_is_better",
    "load_run",
    "load_runs",
    "main",
    "mean_se",
    "mean_std",
    "name_methods",
    "read_metrics",
    "run_names",
    "sampling_se",
    "setting",
    "summary",
    "t_interval",
    "verdict",
    "write",
]


def write(
    paths: Sequence[str | Path],
    out: str | Path = "report",
    metric: str | None = None,
    baseline_name: str = "Local",
    vector: str | None = "pdf",
    table: str | None = None,
) -> Path:
    """Read the runs under ``paths`` and write ``report.md``, ``report.html`` and the figures into ``out``: PNG
    files and, unless ``vector`` is None, the same figures as ``pdf`` or ``svg`` files beside them.
    Warnings (unreadable files) are printed and written into the report. ``metric`` None: the runs' selection
    metric. One path holding a grid's ``grid.json`` (required with ``table="grid"``) adds the grid's table, printed
    too. Returns ``out/report.md``.

    Raises:
        DataError: When no run can be read.
        ConfigError: When no run has ``metric``, or ``table="grid"`` is not given one grid's folder.
    """
    record = report_grid.read_grid(Path(paths[0])) if len(paths) == 1 else None
    if table == "grid" and record is None:
        raise ConfigError(
            "fedlit report --table grid: give one output folder of `fedlit grid` (it holds "
            f"{report_grid.GRID_FILE}); got {' '.join(map(str, paths))}."
        )
    if record is not None:
        warnings: list[str] = []
        cells = report_grid.grid_runs(Path(paths[0]), record, warnings)
        runs = [r for v in cells.values() for r in v]
    else:
        runs, warnings = load_runs(paths)
    metric = metric or report_grid.selection_metric(runs)
    known = sorted(
        {
            m
            for r in runs
            for w in ("last", "best")
            for v in ((r.results.get(w) or {}).get("clients") or {}).values()
            for m in v
        }
    )
    if metric not in known:
        raise ConfigError(f"fedlit report --metric {metric}: no run has test values of it; the runs have {known}.")
    for warning in warnings:
        print(f"fedlit report: warning: {warning}")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    blocks = build(runs, warnings, out, metric, baseline_name, vector)
    for line in report_energy.energy_lines(by_method(runs), metric):
        print(f"fedlit report: {line}")
    if record is not None:
        grid_blocks = report_grid.blocks(record, cells, metric)
        report_grid.print_table(*grid_blocks[-1][1:])
        for line in report_grid.tuned_cells(Path(paths[0]), record):  # tuned cells' choices, below the table
            print(f"tuned: {line}")
        grid_blocks += report_grid.tuning_blocks(Path(paths[0]), record)
        blocks[2:2] = grid_blocks  # after the title and the list of runs
    write_text_atomic(out / "report.md", markdown(blocks))
    write_text_atomic(out / "report.html", to_html(blocks, f"fedlit report: {metric}"))
    print(f"fedlit report: {plural(len(runs), 'run')} -> {out / 'report.md'}, {out / 'report.html'}")
    return out / "report.md"


def main(argv: Sequence[str]) -> Path:
    """``fedlit report`` from the command line (``argv`` after ``report``)."""
    import argparse

    parser = argparse.ArgumentParser(
        prog="fedlit report",
        description="Compare finished runs of `fedlit fit`, their seeds grouped by method: "
        "per-client tables, gain over Local, curves, costs and config differences in report.md and report.html.",
    )
    parser.add_argument("runs", nargs="+", help="Run folders, or folders that contain run folders.")
    parser.add_argument("--out", default="report", help="Folder to write the report into (default: report).")
    parser.add_argument(
        "--metric",
        default=None,
        help="The test/validation metric (default: the runs' selection metric, else accuracy).",
    )
    parser.add_argument("--baseline", default="Local", help="Strategy class of the gain's baseline (default: Local).")
    parser.add_argument(
        "--vector",
        default="pdf",
        choices=[*VECTOR_FORMATS, "none"],
        help="Also write each figure in this vector format, for papers (default: pdf; the PNGs are "
        "always written: report.md shows them and report.html embeds them).",
    )
    parser.add_argument(
        "--table",
        default=None,
        choices=["grid"],
        help="'grid': the table of a `fedlit grid` folder (data sets x methods); added by itself "
        "when the one folder given holds grid.json.",
    )
    args = parser.parse_args(list(argv))
    return write(
        args.runs, args.out, args.metric, args.baseline, None if args.vector == "none" else args.vector, args.table
    )
