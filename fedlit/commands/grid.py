"""``fedlit grid --config GRID.yaml [--out_dir DIR] [--only DATASET/METHOD ...] [--dry_run] [--in_process]``: a
benchmark as one command, every method on every data set over the same seeds (FHBench's Table 2, Wang et al.,
"FHBench: Towards Efficient and Personalized Federated Learning for Multimodal Healthcare", arXiv 2025).

A grid file names the data sets (rows), the methods (columns), the seeds and the output folder::

    # What the grid reproduces, and the command.
    seeds: [0, 1, 2]
    out_dir: runs/my_grid                  # relative to the working directory, as a recipe's out_dir
    overrides: --federation.rounds 5       # optional, for every cell
    datasets:                              # one line per row: recipes, then optional overrides
      sites: {recipes: [../sites.yaml], overrides: --data.init_args.samples_per_client 100}
    methods:                               # one line per column: overlay recipes and/or overrides
      FedAvg: {overrides: --strategy FedAvg}
      FedProx: {overrides: --strategy FedProx --strategy.init_args.mu 0.01}
      APPLE: {recipes: [../apple.yaml]}

Recipe paths are relative to the grid file's folder. Each cell (data set, method) is the experiment
``fedlit fit --config <data set recipes> --config <method recipes> <grid, data set, method overrides> --seeds ...
--out_dir <out_dir>/<data set>/<method>`` (:mod:`fedlit.commands.seeds`), its runs in ``seed_<s>`` folders. A cell
runs in a fresh process (``python -m fedlit``; a crash, a leak or a changed global of one cell cannot reach the
others), or in this one with ``--in_process`` (no start-up cost per cell). A cell that fails is reported and the
grid goes on; the command exits with code 1 when a cell failed. The grid resumes seed by seed: a cell whose seeds
have all finished (``results.json``) is not started, and a cell started before is resumed with ``--ckpt_path last``
(finished seeds kept, stopped ones resumed from their last checkpoint, missing ones started). ``grid.json`` in the
output folder records the rows, columns, seeds, each cell's command, state and wall-clock;
``fedlit report <out_dir>`` reads it and prints Table 2 (:mod:`fedlit.commands.report.grid`).

Tuned baselines: a method may declare ``tune: {--model.init_args.lr: [0.01, 0.05], --strategy.init_args.lam: [0.1,
1.0]}`` (and the grid ``tune_seeds``, default the first seed); each cell of it first runs every point of that grid
over ``tune_seeds`` in ``<cell>/tune/<point>``, chooses the point with the best mean VALIDATION value of the
selection metric at each run's selected round (never a test value), records it in ``<cell>/tuning.json`` and
``grid.json``, and runs the chosen point over the seeds (:mod:`fedlit.commands.grid_tune`).
"""

from __future__ import annotations

import argparse
import difflib
import fnmatch
import json
import re
import shlex
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from fedlit.commands import grid_tune
from fedlit.commands.grid_tune import finished_seeds
from fedlit.commands.grid_tune import run_cell as _run_cell  # one experiment's `fit`, here or in a fresh process
from fedlit.config.parser import RecipeLoader
from fedlit.core.errors import ConfigError, InputFileError
from fedlit.core.files import write_text_atomic

GRID_FILE = "grid.json"
_KEYS = ("seeds", "out_dir", "overrides", "seeds_vary", "tune_seeds", "datasets", "methods")
_ENTRY_KEYS = ("recipes", "overrides", "tune")
#: Options the grid sets itself for every cell: an override may not give them.
_GRID_OPTIONS = (
    "--seeds",
    "--out_dir",
    "--name",
    "--version",
    "--ckpt_path",
    "--federation.seed",
    "--seeds_vary",
    "--dry_run",
)
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]*$")


@dataclass
class Entry:
    """A row (data set) or a column (method): its recipe files and its command-line overrides."""

    recipes: list[Path] = field(default_factory=list)
    overrides: list[str] = field(default_factory=list)
    tune: dict[str, list[Any]] = field(default_factory=dict)  # a method's options to tune -> values


@dataclass
class Grid:
    """A grid file, checked: see the module docstring."""

    path: Path
    seeds: list[int]
    out_dir: Path
    datasets: dict[str, Entry]
    methods: dict[str, Entry]
    overrides: list[str] = field(default_factory=list)
    seeds_vary: str = "all"
    tune_seeds: list[int] = field(default_factory=list)

    def cells(self, only: Sequence[str] = ()) -> list[tuple[str, str]]:
        """The cells (data set, method), rows first; with ``only``, those matching one of its ``DATASET/METHOD``
        patterns (``*`` matches any name).

        Raises:
            ConfigError: When a pattern matches no cell.
        """
        cells = [(d, m) for d in self.datasets for m in self.methods]
        if not only:
            return cells
        names = [f"{d}/{m}" for d, m in cells]
        unmatched = [p for p in only if not fnmatch.filter(names, p)]
        if unmatched:
            close = difflib.get_close_matches(unmatched[0], names, 3)
            raise ConfigError(
                f"fedlit grid --only {unmatched[0]}: no cell of {self.path} matches it"
                + (f"; did you mean {', '.join(close)}?" if close else "")
                + f" The cells are DATASET/METHOD: {', '.join(names[:6])}{' ...' * (len(names) > 6)}."
            )
        return [c for c, n in zip(cells, names, strict=True) if any(fnmatch.fnmatchcase(n, p) for p in only)]

    def argv(
        self,
        dataset: str,
        method: str,
        extra: Sequence[str] = (),
        seeds: Sequence[int] | None = None,
        folder: Any = None,
    ) -> list[str]:
        """The ``fit`` arguments of a cell (without ``--ckpt_path last``, which resuming adds); ``extra`` options
        after the overrides, other ``seeds`` and output ``folder`` for its tuning points."""
        row, column = self.datasets[dataset], self.methods[method]
        configs = [a for p in (*row.recipes, *column.recipes) for a in ("--config", _shown(p))]
        return [
            "fit",
            *configs,
            *self.overrides,
            *row.overrides,
            *column.overrides,
            *extra,
            "--seeds",
            *map(str, self.seeds if seeds is None else seeds),
            *(["--seeds_vary", self.seeds_vary] * (self.seeds_vary != "all")),
            "--out_dir",
            _shown(self.folder(dataset, method) if folder is None else folder),
        ]

    def folder(self, dataset: str, method: str) -> Path:
        return self.out_dir / dataset / method


def _shown(path: Path) -> str:
    """``path`` relative to the working directory when it lies below it (shorter commands), else absolute."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path.resolve())


def _unknown(where: str, key: Any, allowed: Sequence[str]) -> str:
    close = difflib.get_close_matches(str(key), allowed, 1)
    return (
        f"{where}unknown key {key!r}"
        + (f" (did you mean {close[0]!r}?)" if close else "")
        + f"; allowed: {', '.join(allowed)}"
    )


def _overrides(value: Any, key: str, problems: list[str]) -> list[str]:
    items = [value] if isinstance(value, str) else value if isinstance(value, list) else None
    if items is None or not all(isinstance(v, str | int | float) for v in items):
        problems.append(
            f"{key}: {value!r} is not command-line options; give a string such as "
            "'--federation.rounds 5' or a list of them"
        )
        return []
    words = [w for v in items for w in shlex.split(str(v))]
    if words and not words[0].startswith("--"):
        problems.append(f"{key}: {words[0]!r} is not an option; overrides start with --, e.g. --federation.rounds 5")
    taken = [w for w in words if w.split("=", 1)[0] in _GRID_OPTIONS]
    if taken:
        problems.append(
            f"{key}: {taken[0].split('=', 1)[0]} is set by the grid for every cell (seeds: the grid's "
            "'seeds'; folders: 'out_dir'); remove it"
        )
    return words


def _entries(value: Any, key: str, base: Path, problems: list[str], need_recipe: bool) -> dict[str, Entry]:
    if not isinstance(value, dict) or not value:
        problems.append(f"{key}: give a mapping of names to {{recipes: [...], overrides: ...}}, one per line")
        return {}
    entries = {}
    for name, spec in value.items():
        where = f"{key}.{name}"
        if not _NAME.match(str(name)):
            problems.append(f"{where}: a name is a folder name (letters, digits, _ . + -)")
        spec = {} if spec is None else spec
        if not isinstance(spec, dict):
            problems.append(f"{where}: {spec!r} is not a mapping; give {{recipes: [FILE.yaml], overrides: ...}}")
            continue
        problems += [_unknown(f"{where}: ", k, _ENTRY_KEYS) for k in spec if k not in _ENTRY_KEYS]
        recipes = spec.get("recipes", [])
        recipes = [recipes] if isinstance(recipes, str) else recipes
        entry = Entry()
        if not isinstance(recipes, list) or not all(isinstance(r, str) for r in recipes):
            problems.append(f"{where}.recipes: {recipes!r} is not a list of recipe files")
        else:
            for recipe in recipes:
                path = base / recipe
                if not path.is_file():
                    problems.append(
                        f"{where}.recipes: {recipe} not found (looked for {path}; recipe paths are "
                        "relative to the grid file's folder)"
                    )
                entry.recipes.append(path)
        if need_recipe and not recipes:
            problems.append(f"{where}: a data set names its recipe: {{recipes: [FILE.yaml]}}")
        if "overrides" in spec:
            entry.overrides = _overrides(spec["overrides"], f"{where}.overrides", problems)
        if "tune" in spec and need_recipe:
            problems.append(f"{where}.tune: a method tunes its options, not a data set; move it to a method")
        elif "tune" in spec:
            entry.tune = grid_tune.parse_tune(spec["tune"], f"{where}.tune", entry.overrides, _GRID_OPTIONS, problems)
        entries[str(name)] = entry
    return entries


def load_grid(path: str | Path, out_dir: str | Path | None = None) -> Grid:
    """Read and check a grid file; ``out_dir`` replaces its ``out_dir`` (default ``runs/<grid file name>``).

    Raises:
        InputFileError: When the file is missing.
        ConfigError: Naming the file and every bad key at once (unknown keys, missing recipe files, bad seeds).
    """
    path = Path(path)
    if not path.is_file():
        raise InputFileError(
            f"fedlit grid --config {path}: no such file. `fedlit recipes grids "
            "personalized_partitions` copies the shipped grid and the recipes it names into recipes/."
        )
    try:
        data = yaml.load(path.read_text(), Loader=RecipeLoader)  # noqa: S506 (a safe loader)
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as err:
        raise ConfigError(f"{path}: cannot be read as YAML ({' '.join(str(err).split())})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a grid file is a mapping with keys {', '.join(_KEYS)}")
    problems = [_unknown("", k, _KEYS) for k in data if k not in _KEYS]
    problems += [f"{k}: missing" for k in ("seeds", "datasets", "methods") if k not in data]
    seeds = data.get("seeds", [0])
    tune_seeds = data.get("tune_seeds", seeds[:1] if isinstance(seeds, list) else seeds)
    for key, value in (("seeds", seeds), ("tune_seeds", tune_seeds)):
        if (
            not isinstance(value, list)
            or not value
            or not all(isinstance(s, int) and not isinstance(s, bool) for s in value)
            or len(set(value)) < len(value)
        ):
            problems.append(f"{key}: {value!r}; give distinct integers, e.g. [0, 1, 2]")
    seeds_vary = data.get("seeds_vary", "all")
    if seeds_vary not in ("all", "training"):
        problems.append(f"seeds_vary: {seeds_vary!r}; allowed: all, training")
    base = path.resolve().parent
    datasets = _entries(data.get("datasets"), "datasets", base, problems, need_recipe=True)
    methods = _entries(data.get("methods"), "methods", base, problems, need_recipe=False)
    overrides = _overrides(data["overrides"], "overrides", problems) if "overrides" in data else []
    if problems:
        raise ConfigError(f"{path}: " + "; ".join(problems) + ".")
    folder = Path(out_dir if out_dir is not None else data.get("out_dir") or Path("runs") / path.stem)
    return Grid(path, list(seeds), folder, datasets, methods, overrides, str(seeds_vary), list(tune_seeds or []))


def _record(grid: Grid) -> dict[str, Any]:
    """``grid.json`` as it is (cells of earlier invocations kept), or a new one; rows and columns as in the file."""
    path = grid.out_dir / GRID_FILE
    try:
        record = json.loads(path.read_text())
        cells = record["cells"] if isinstance(record, dict) and isinstance(record.get("cells"), dict) else {}
    except (OSError, ValueError):
        cells = {}
    return {
        "grid_file": str(grid.path.resolve()),
        "datasets": list(grid.datasets),
        "methods": list(grid.methods),
        "seeds": grid.seeds,
        "cells": cells,
    }


def run_grid(grid: Grid, only: Sequence[str] = (), dry_run: bool = False, in_process: bool = False) -> list[str]:
    """Run (or with ``dry_run`` print) the cells; returns the cells that failed (``DATASET/METHOD``)."""
    cells = grid.cells(only)
    record = _record(grid)
    failed: list[str] = []
    print(
        f"fedlit grid: {len(cells)} cells ({len(grid.datasets)} data sets x {len(grid.methods)} methods"
        + (f", {len(cells)} selected" if only else "")
        + f") x seeds {grid.seeds} -> {grid.out_dir}",
        flush=True,
    )
    started = time.perf_counter()
    for dataset, method in cells:
        name, folder = f"{dataset}/{method}", grid.folder(dataset, method)
        done = finished_seeds(folder, grid.seeds)
        cell = record["cells"].setdefault(name, {})
        try:
            tuned = _tuned(grid, dataset, method, len(done) == len(grid.seeds), dry_run, in_process)
        except grid_tune.TuningFailed as err:
            print(f"fedlit grid: {name}: FAILED ({err})", flush=True)
            cell.update(dataset=dataset, method=method, folder=name, status="failed", error=str(err))
            failed.append(name)
            continue
        chosen = (
            grid_tune.words(tuned["options"]) if tuned else [f"<the chosen {', '.join(grid.methods[method].tune)}>"]
        )
        command = grid.argv(dataset, method, extra=chosen if grid.methods[method].tune else ())
        # a cell started before resumes: its finished seeds are kept, the others resumed or started (seeds.py)
        argv = [*command, "--ckpt_path", "last"] if len(done) < len(grid.seeds) and folder.exists() else command
        if cell.get("command") not in (None, command) and done:
            print(
                f"fedlit grid: warning: {name}: the grid file changed since seeds {done} ran; they are kept. "
                f"Delete {folder} to run them again.",
                flush=True,
            )
        cell.update(dataset=dataset, method=method, folder=f"{dataset}/{method}", command=command)
        cell.update({"tuned": tuned} if tuned else {})
        if len(done) == len(grid.seeds):
            print(f"fedlit grid: {name}: seeds {done} finished before, skipped", flush=True)
            cell["status"] = "finished"
            continue
        if dry_run:
            print(shlex.join(["fedlit", *argv]), flush=True)
            continue
        print(f"fedlit grid: {name}: " + shlex.join(["fedlit", *argv]), flush=True)
        cell["status"] = "running"
        _write(grid, record)
        t0 = time.perf_counter()
        error = _run_cell(argv, in_process)
        missing = [s for s in grid.seeds if s not in finished_seeds(folder, grid.seeds)]
        if error is None and missing:
            error = f"seeds {missing} have no results.json"
        cell.update(status="failed" if error else "finished", wall_s=round(time.perf_counter() - t0, 1), error=error)
        print(
            f"fedlit grid: {name}: " + (f"FAILED ({error})" if error else "finished") + f" in {cell['wall_s']:.1f} s",
            flush=True,
        )
        if error:
            failed.append(name)
        _write(grid, record)
    if not dry_run:
        _write(grid, record)
        print(
            f"fedlit grid: {len(cells) - len(failed)}/{len(cells)} cells finished in "
            f"{time.perf_counter() - started:.1f} s"
            + (f"; failed: {', '.join(failed)}" if failed else "")
            + f". Table: fedlit report {grid.out_dir} --out {grid.out_dir / 'report'}",
            flush=True,
        )
    return failed


def _tuned(grid: Grid, dataset: str, method: str, done: bool, dry_run: bool, in_process: bool) -> dict | None:
    """A tuned cell's choice (:mod:`fedlit.commands.grid_tune`): recorded when the cell finished, else tuned now."""
    folder, tune = grid.folder(dataset, method), grid.methods[method].tune
    if not tune or (done and grid_tune.recorded_choice(folder)):
        return grid_tune.recorded_choice(folder) if tune else None
    return grid_tune.tune_cell(grid, dataset, method, tune, lambda argv: _run_cell(argv, in_process), dry_run)


def _write(grid: Grid, record: dict[str, Any]) -> None:
    grid.out_dir.mkdir(parents=True, exist_ok=True)
    write_text_atomic(grid.out_dir / GRID_FILE, json.dumps(record, indent=2) + "\n")


def main(argv: Sequence[str]) -> list[str]:
    """``fedlit grid`` from the command line (``argv`` after ``grid``); exits with code 1 when a cell failed."""
    parser = argparse.ArgumentParser(prog="fedlit grid", description=__doc__.split("\n\n")[0].split(": ", 1)[1])
    parser.add_argument("--config", required=True, help="The grid file (YAML).")
    parser.add_argument("--out_dir", default=None, help="Output folder (default: the grid file's out_dir).")
    parser.add_argument(
        "--only",
        nargs="+",
        default=(),
        metavar="DATASET/METHOD",
        help="Run only these cells (* matches any name: 'sites/*', '*/FedAvg').",
    )
    parser.add_argument("--dry_run", action="store_true", help="Print each cell's command; run nothing.")
    parser.add_argument(
        "--in_process", action="store_true", help="Run the cells in this process rather than one fresh process each."
    )
    args = parser.parse_args(list(argv))
    failed = run_grid(load_grid(args.config, args.out_dir), args.only, args.dry_run, args.in_process)
    if failed:
        raise SystemExit(1)
    return failed
