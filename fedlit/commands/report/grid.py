"""The table of a grid of runs (``fedlit grid``, :mod:`fedlit.commands.grid`) in FHBench's Table 2 layout (Wang et
al., "FHBench: Towards Efficient and Personalized Federated Learning for Multimodal Healthcare", arXiv 2025): one row
per data set, one column per method in the grid file's order, each cell the test metric at the best-validation
round, mean ± standard error over the seeds, the best of each row in bold.

A run's value is the mean over its clients of their test metric at its best-validation round (the ``mean`` of the
report's per-method summary). The grid's ``grid.json`` names the rows and columns; each cell's runs are the run
folders under ``<data set>/<method>`` (not its tuning runs, under ``tune/``). A tuned cell's choice
(:mod:`fedlit.commands.grid_tune`: its ``tuning.json``) is listed below the table. Nothing here reads more than
:mod:`fedlit.commands.report.runs` does.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fedlit.commands.report.figures import bold_best
from fedlit.commands.report.render import Block
from fedlit.commands.report.runs import (
    Run,
    client_values,
    find_runs,
    higher_is_better,
    load_run,
    mean_se,
    mean_std,
)
from fedlit.core.errors import ConfigError, DataError

GRID_FILE = "grid.json"  # as fedlit.commands.grid writes it
TUNING_FILE, TUNE_FOLDER = "tuning.json", "tune"  # as fedlit.commands.grid_tune writes them


def read_grid(folder: Path) -> dict[str, Any] | None:
    """The ``grid.json`` of a grid's output folder, or None when ``folder`` holds none.

    Raises:
        DataError: When it exists but is not a grid record.
    """
    path = folder / GRID_FILE
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text())
        if not (isinstance(record["datasets"], list) and isinstance(record["methods"], list)):
            raise ValueError("datasets and methods are not lists")
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError) as err:
        raise DataError(
            f"{path}: not a grid record of `fedlit grid` ({err}); run the grid again to rewrite it, or "
            "report its run folders without --table grid."
        ) from None
    return record


def grid_runs(folder: Path, record: dict[str, Any], warnings: list[str]) -> dict[tuple[str, str], list[Run]]:
    """The readable runs of each cell (data set, method), each named ``<data set>/<method>`` as its method; a
    cell without runs is absent (and named in ``warnings``), an unreadable run only named in ``warnings``.

    Raises:
        DataError: When no cell has a readable run.
    """
    cells: dict[tuple[str, str], list[Run]] = {}
    for dataset in record["datasets"]:
        for method in record["methods"]:
            cell = folder / dataset / method
            runs = []
            for run_folder in find_runs([cell], warnings) if cell.is_dir() else []:
                if run_folder.relative_to(cell).parts[:1] == (TUNE_FOLDER,):
                    continue  # a run of the cell's tuning, not of its experiment
                try:
                    run = load_run(run_folder, warnings)
                except DataError as err:
                    warnings.append(str(err))
                    continue
                run.method = f"{dataset}/{method}"
                runs.append(run)
            if runs:
                cells[(dataset, method)] = runs
            else:
                warnings.append(
                    f"{cell}: no finished run; its cell of the table is empty (run `fedlit grid` again to run it)."
                )
    if not cells:
        raise DataError(f"fedlit report {folder}: no cell of the grid has a finished run (results.json).")
    return cells


def run_value(run: Run, metric: str) -> float:
    """The run's test ``metric`` at its best-validation round, averaged over its clients (NaN when it has none)."""
    return mean_std(list(client_values(run, "best", metric).values()))[0]


def table(
    record: dict[str, Any], cells: dict[tuple[str, str], list[Run]], metric: str
) -> tuple[list[str], list[list[str]]]:
    """Table 2: header (``data set``, then the methods) and one row per data set; each cell mean ± standard error
    of :func:`run_value` over the cell's seeds, the best of the row in bold (the highest, or the lowest where the
    runs' modules declare ``metric`` lower-is-better)."""
    methods = list(record["methods"])
    higher = higher_is_better(metric, (r for runs in cells.values() for r in runs))
    rows = []
    for dataset in record["datasets"]:
        values = {
            m: mean_se([run_value(r, metric) for r in cells[(dataset, m)]]) for m in methods if (dataset, m) in cells
        }
        rows.append([dataset, *bold_best(values, methods, higher)])
    return ["data set", *methods], rows


def selection_metric(runs: Sequence[Run]) -> str:
    """The selection metric the runs share (``results.json``'s ``selection_metric``), else ``accuracy``."""
    chosen = {r.results.get("selection_metric") for r in runs}
    return str(chosen.pop()) if len(chosen) == 1 and None not in chosen else "accuracy"


def blocks(record: dict[str, Any], cells: dict[tuple[str, str], list[Run]], metric: str) -> list[Block]:
    """The report's blocks of the grid table (before the per-method detail).

    Raises:
        ConfigError: When no run has test values of ``metric``.
    """
    runs = [r for v in cells.values() for r in v]
    if all(not client_values(r, "best", metric) for r in runs):
        known = sorted(
            {m for r in runs for v in ((r.results.get("best") or {}).get("clients") or {}).values() for m in v}
        )
        raise ConfigError(
            f"fedlit report --metric {metric}: no run of the grid has test values of it at its best "
            f"round; the runs have {known}."
        )
    seeds = sorted({len(v) for v in cells.values()})
    header, rows = table(record, cells, metric)
    return [
        ("h", 2, f"Table: test {metric} at the best-validation round"),
        (
            "p",
            f"Rows are data sets and columns methods, as in the grid file. Each cell: the clients' mean test "
            f"{metric} at the run's best-validation round, mean ± standard error over the seeds ("
            + "/".join(map(str, seeds))
            + " per cell); the best of each row in bold.",
        ),
        ("table", header, rows),
    ]


def tuned_cells(folder: Path, record: dict[str, Any]) -> list[str]:
    """One line per tuned cell (its ``tuning.json``), in the table's order: ``Ditto on synthetic: lr=0.05, lam=0.1
    (validation balanced_accuracy 0.7120, 6 points, seeds 0)``; an unreadable record is named as such."""
    lines = []
    for dataset in record["datasets"]:
        for method in record["methods"]:
            path = folder / dataset / method / TUNING_FILE
            if not path.is_file():
                continue
            try:
                tuning = json.loads(path.read_text())
                chosen, mean = tuning["chosen"], tuning["chosen"]["mean"]
                options = ", ".join(f"{o.rsplit('.', 1)[-1].lstrip('-')}={v}" for o, v in chosen["options"].items())
                lines.append(
                    f"{method} on {dataset}: {options} (validation {tuning['metric']} "
                    + ("—" if mean is None else f"{mean:.4f}")
                    + f", {len(tuning['points'])} points, seeds {', '.join(map(str, tuning['tune_seeds']))})"
                )
            except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
                lines.append(f"{method} on {dataset}: {path} cannot be read ({type(err).__name__}: {err})")
    return lines


def tuning_blocks(folder: Path, record: dict[str, Any]) -> list[Block]:
    """The report's blocks of the tuned cells' choices (none when no cell was tuned)."""
    lines = tuned_cells(folder, record)
    if not lines:
        return []
    return [
        ("h", 3, "Tuned hyperparameters"),
        (
            "p",
            "Each tuned method's setting, chosen on the validation split over its declared grid (the best mean "
            "over the tuning seeds of the selection metric at each run's selected round; no test value is read), "
            "then run over the seeds above.",
        ),
        *(("p", line) for line in lines),
    ]


def print_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    """The table as aligned plain text on standard output."""
    widths = [max(len(str(r[i])) for r in (header, *rows)) for i in range(len(header))]
    for row in (header, *rows):
        print(
            "  ".join(
                str(c).ljust(w) if i == 0 else str(c).rjust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True))
            ).rstrip(),
            flush=True,
        )
