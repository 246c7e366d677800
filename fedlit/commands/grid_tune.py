"""Tuned baselines for ``fedlit grid`` (:mod:`fedlit.commands.grid`): each method's own hyperparameters chosen on
the validation split over a declared grid, then the chosen setting run over the grid's seeds; and the running of
one experiment of a grid (a cell, or one point of its tuning) in a fresh process or in this one.

A method of a grid file may declare ``tune``, command-line options mapped to lists of values::

    tune_seeds: [0]                        # optional; default: the first of `seeds`
    methods:
      Ditto: {recipes: [../ditto.yaml], tune: {--model.init_args.lr: [0.01, 0.05], --strategy.init_args.lam: [0.1, 1]}}

The points are the Cartesian product of the lists, in the declared order (the last option varies fastest). Each
point of a cell (data set, method) is its own experiment over ``tune_seeds``, with the point's options after the
grid's, the data set's and the method's overrides, in ``<cell>/tune/<label>/seed_<s>`` (``label``:
``lr=0.01_lam=0.1``); a point whose seeds have finished is not run again, a stopped one is resumed. A point's
score is the mean over ``tune_seeds`` of each run's VALIDATION value of its selection metric at its selected round:
the round ``results.json`` names (``best.round``, the best mean validation value over the clients), its value the
``val`` row ``<metric>_mean`` of the run's ``metrics.csv`` (the mean over the clients that chose that round). No
test value is read. The direction is the one the run's module declared (``results.json`` ``higher_is_better``; a
name with ``loss`` is lower-is-better for runs that do not record it); the best mean wins, ties go to the first
point in declared order, a point with an undefined (NaN) score loses. The cell's experiment then runs over the
grid's seeds with the chosen point's options appended. ``<cell>/tuning.json`` records the metric, the split
(``val``), the direction, the tune seeds, the grid, every point's per-seed scores and mean, and the choice; the
grid's ``grid.json`` records each tuned cell's choice (``tuned``), which ``fedlit report`` prints below its table.
"""

from __future__ import annotations

import ctypes
import itertools
import json
import math
import re
import shlex
import signal
import subprocess
import sys
import traceback
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from fedlit.commands.report.runs import read_metrics
from fedlit.core.errors import DataError
from fedlit.core.files import write_text_atomic

TUNE_FOLDER = "tune"
TUNING_FILE = "tuning.json"
_LABEL_CHARACTERS = re.compile(r"[^A-Za-z0-9_.+=-]")


class TuningFailed(Exception):
    """A tuning point failed to run or has no validation score: the cell fails, the grid goes on."""


class Cells(Protocol):
    """What tuning needs of a grid (:class:`fedlit.commands.grid.Grid`)."""

    tune_seeds: list[int]

    def argv(
        self,
        dataset: str,
        method: str,
        extra: Sequence[str] = (),
        seeds: Sequence[int] | None = None,
        folder: Any = None,
    ) -> list[str]: ...

    def folder(self, dataset: str, method: str) -> Path: ...


def parse_tune(value: Any, where: str, overrides: Sequence[str], reserved: Sequence[str], problems: list[str]) -> dict:
    """A method's ``tune`` mapping, checked; each problem (naming ``where`` and the fix) is added to ``problems``."""
    if not isinstance(value, dict) or not value:
        problems.append(
            f"{where}: give a mapping of options to lists of values, e.g. {{--model.init_args.lr: [0.01, 0.05]}}"
        )
        return {}
    given = {w.split("=", 1)[0] for w in overrides if w.startswith("--")}
    tune: dict[str, list[Any]] = {}
    for option, values in value.items():
        key = f"{where}.{option}"
        if not isinstance(option, str) or not re.fullmatch(r"--[A-Za-z_][\w.-]*", option):
            problems.append(
                f"{key}: {option!r} is not an option; a key is a command-line option such as --model.init_args.lr"
            )
            continue
        if option in reserved:
            problems.append(f"{key}: {option} is set by the grid for every cell; tune another option")
            continue
        if option in given:
            problems.append(f"{key}: {option} is also in the method's overrides; remove it from one of the two")
            continue
        if not isinstance(values, list) or not values:
            problems.append(f"{key}: {values!r}; give a non-empty list of values, e.g. [0.01, 0.05]")
            continue
        if not all(v is None or isinstance(v, str | int | float | bool) for v in values) or len(
            set(map(_word, values))
        ) < len(values):
            problems.append(f"{key}: {values!r}; give distinct numbers, strings, true/false or null")
            continue
        tune[option] = values
    return tune


def _word(value: Any) -> str:
    """A value as the command line gives it (YAML's true/false/null)."""
    return "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


def _short(option: str, options: Sequence[str]) -> str:
    """``--strategy.init_args.lam`` -> ``lam``, unless another option ends the same (then the whole name)."""
    last = option.rsplit(".", 1)[-1].lstrip("-")
    return last if sum(o.rsplit(".", 1)[-1].lstrip("-") == last for o in options) == 1 else option.lstrip("-")


def points(tune: Mapping[str, list[Any]]) -> list[tuple[str, dict[str, Any]]]:
    """The points of a ``tune`` grid, in declared order: ``(label, {option: value})``, labels distinct folder names."""
    out: list[tuple[str, dict[str, Any]]] = []
    for values in itertools.product(*tune.values()):
        options = dict(zip(tune, values, strict=True))
        label = _LABEL_CHARACTERS.sub("-", "_".join(f"{_short(o, list(tune))}={_word(v)}" for o, v in options.items()))
        labels = {name for name, _ in out}
        out.append((label if label not in labels else f"{label}-{len(out)}", options))
    return out


def words(options: Mapping[str, Any]) -> list[str]:
    """A point's options as command-line words."""
    return [w for option, value in options.items() for w in (option, _word(value))]


def describe(options: Mapping[str, Any]) -> str:
    """``lr=0.05, lam=0.1``."""
    return ", ".join(f"{_short(o, list(options))}={_word(v)}" for o, v in options.items())


def finished_seeds(folder: Path, seeds: Sequence[int]) -> list[int]:
    """The seeds whose run in the experiment ``folder`` finished (``seed_<s>/results.json``)."""
    return [s for s in seeds if (folder / f"seed_{s}" / "results.json").is_file()]


def validation_score(run: Path) -> tuple[str, float, bool]:
    """A finished run's selection metric, its mean validation value over the clients at the run's selected round,
    and whether higher is better; read from ``results.json`` and ``metrics.csv``, never a test value.

    Raises:
        DataError: Naming the run folder, when the run has no selected round or no validation value there.
    """
    try:
        results = json.loads((run / "results.json").read_text())
        metric = str(results["selection_metric"])
        selected = int(results["best"]["round"])
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise DataError(
            f"{run}: results.json names no selection metric and selected round ({type(err).__name__}: {err}); "
            "tuning needs a validation split (give the data set one) and a finished run"
        ) from None
    values = [
        v
        for r, c, s, m, v in read_metrics(run / "metrics.csv")
        if (r, c, s, m) == (selected, "", "val", f"{metric}_mean")
    ]
    if not values:
        raise DataError(
            f"{run}: metrics.csv has no validation {metric} (val {metric}_mean) at the selected round {selected}; "
            "delete the run folder to run it again"
        )
    declared = results.get("higher_is_better")
    higher = bool(declared[metric]) if isinstance(declared, dict) and metric in declared else "loss" not in metric
    return metric, values[-1], higher


def tune_cell(
    grid: Cells,
    dataset: str,
    method: str,
    tune: Mapping[str, list[Any]],
    run: Callable[[list[str]], str | None],
    dry_run: bool,
) -> dict[str, Any] | None:
    """Run (or with ``dry_run`` print) the cell's unfinished tuning points, score them and write ``tuning.json``;
    returns the choice (``options``, ``label``, ``mean``, ``metric``, ``points``, ``tune_seeds``), or None in a dry
    run with points left to run.

    Raises:
        TuningFailed: When a point fails or has no validation score (the message names it).
    """
    name, folder, seeds = f"{dataset}/{method}", grid.folder(dataset, method), list(grid.tune_seeds)
    grid_points, pending = points(tune), False
    finished = [
        label for label, _ in grid_points if len(finished_seeds(folder / TUNE_FOLDER / label, seeds)) == len(seeds)
    ]
    if finished:
        print(
            f"fedlit grid: {name}: {len(finished)}/{len(grid_points)} tuning points finished before, kept", flush=True
        )
    for index, (label, options) in enumerate(grid_points, start=1):
        if label in finished:
            continue
        point = folder / TUNE_FOLDER / label
        argv = grid.argv(dataset, method, extra=words(options), seeds=seeds, folder=point)
        argv += ["--ckpt_path", "last"] * point.exists()
        if dry_run:
            print(shlex.join(["fedlit", *argv]), flush=True)
            pending = True
            continue
        print(
            f"fedlit grid: {name}: tuning point {index}/{len(grid_points)}: " + shlex.join(["fedlit", *argv]),
            flush=True,
        )
        error = run(argv)
        missing = [s for s in seeds if s not in finished_seeds(point, seeds)]
        if error is None and missing:
            error = f"seeds {missing} have no results.json"
        if error:
            raise TuningFailed(f"tuning point {label} failed ({error})")
    if pending:
        return None
    return _choose(folder, seeds, tune, grid_points)


def _choose(folder: Path, seeds: list[int], tune: Mapping[str, list[Any]], grid_points: list) -> dict[str, Any]:
    """Score the finished points, pick the best (first on ties), write ``tuning.json``."""
    scored: list[dict[str, Any]] = []
    metrics: set[str] = set()
    directions: set[bool] = set()
    for label, options in grid_points:
        scores: dict[str, float] = {}
        for seed in seeds:
            try:
                metric, value, higher = validation_score(folder / TUNE_FOLDER / label / f"seed_{seed}")
            except DataError as err:
                raise TuningFailed(str(err)) from None
            scores[str(seed)], metrics, directions = value, metrics | {metric}, directions | {higher}
        mean = math.fsum(scores.values()) / len(scores)
        scored.append({"label": label, "options": options, "scores": scores, "mean": mean})
    if len(metrics) > 1 or len(directions) > 1:
        raise TuningFailed(
            f"the tuning points select on different metrics or directions ({sorted(metrics)}); tune "
            "no option that changes federation.selection_metric or the task"
        )
    higher = directions.pop()
    best: dict[str, Any] | None = None
    for point in scored:
        mean = point["mean"]
        if not math.isnan(mean) and (best is None or (mean > best["mean"] if higher else mean < best["mean"])):
            best = point
    best = best or scored[0]
    for point in scored:  # JSON has no NaN
        point["scores"] = {s: None if math.isnan(v) else v for s, v in point["scores"].items()}
        point["mean"] = None if math.isnan(point["mean"]) else point["mean"]
    metric = metrics.pop()
    chosen = {"label": best["label"], "options": best["options"], "mean": best["mean"]}
    record = {
        "metric": metric,
        "split": "val",
        "direction": "higher" if higher else "lower",
        "tune_seeds": seeds,
        "grid": dict(tune),
        "points": scored,
        "chosen": chosen,
    }
    write_text_atomic(folder / TUNING_FILE, json.dumps(record, indent=2) + "\n")
    return {**chosen, "metric": metric, "points": len(scored), "tune_seeds": seeds}


def recorded_choice(folder: Path) -> dict[str, Any] | None:
    """The choice ``tuning.json`` of the cell ``folder`` records (None without a readable one)."""
    try:
        record = json.loads((folder / TUNING_FILE).read_text())
        return {
            **record["chosen"],
            "metric": record["metric"],
            "points": len(record["points"]),
            "tune_seeds": record["tune_seeds"],
        }
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _die_with_parent() -> None:
    """In a cell's process: the kernel kills it when the grid's process dies (Linux), so none is left running."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1: PR_SET_PDEATHSIG


def run_cell(argv: list[str], in_process: bool) -> str | None:
    """Run one experiment's ``fit``; None when it finished, else what went wrong (one line)."""
    if not in_process:
        code = subprocess.run(
            [sys.executable, "-m", "fedlit", *argv],
            check=False,  # noqa: S603, PLW1509
            preexec_fn=_die_with_parent,
        ).returncode
        return None if code == 0 else f"exit code {code} (its error is printed above)"
    from fedlit.commands import seeds  # imports torch: only here
    from fedlit.config.explain import CONFIG_ERRORS, explain

    try:
        seeds.prepare(argv)()
    except CONFIG_ERRORS as err:  # fedlit's one-line errors, as `fedlit fit` prints them
        print(f"fedlit: error: {explain(err)}", file=sys.stderr, flush=True)
        return explain(err)
    except Exception as err:  # noqa: BLE001 (a bug in one cell must not end the grid; its traceback is shown)
        traceback.print_exc()
        return f"{type(err).__name__}: {err}"
    return None
