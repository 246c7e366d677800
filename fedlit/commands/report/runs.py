"""The runs that ``fedlit report`` compares, read from their folders, and the numbers it shows: runs found and
read (:class:`Run`), per-client tables and per-method summaries (mean, worst client, pooled value, gain over the
baseline, each ranked the way the runs' modules declared: :func:`higher_is_better`), and the configuration keys
that differ. Nothing here draws or writes; see :mod:`fedlit.commands.report` for the command,
:mod:`fedlit.commands.report.methods` for the grouping into methods, :mod:`fedlit.commands.report.figures` for the
figures and :mod:`fedlit.commands.report.render` for the rendering."""

from __future__ import annotations

import csv
import json
import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedlit.commands.report.interval import t_interval
from fedlit.core.errors import ConfigError, DataError
from fedlit.engine.records import baseline

Spread = Callable[[Sequence[float]], tuple[float, float]]
SEED_OR_VERSION = re.compile(r"^(seed|version)_\w+$")


@dataclass
class Run:
    """One finished run: its folder, ``results.json``, ``config.json`` and ``metrics.csv`` rows."""

    folder: Path
    results: dict[str, Any]
    config: dict[str, Any] = field(default_factory=dict)
    rows: list[tuple[int, str, str, str, float]] | None = None
    method: str = ""
    manifest: dict[str, Any] | None = None

    @property
    def strategy_class(self) -> str:
        return str(self.results.get("strategy_class") or "unknown")

    @property
    def seed(self) -> Any:
        return self.results.get("seed")

    @property
    def recipe(self) -> str:
        """The run's experiment: its folder's name, or for ``seed_<s>``/``version_<n>`` folders that of the first
        folder above them that is neither (``runs/<name>/version_0/seed_1`` -> ``<name>``)."""
        folder = self.folder
        while SEED_OR_VERSION.match(folder.name) and folder.parent.name:
            folder = folder.parent
        return folder.name

    def series(self, split: str, metric: str) -> dict[int, float]:
        """Server rows of ``metrics.csv`` (empty client) for ``split``/``metric``: value per round."""
        return {r: v for r, c, s, m, v in self.rows or [] if c == "" and s == split and m == metric}


def find_runs(paths: Sequence[str | Path], warnings: list[str]) -> list[Path]:
    """Every run folder (one holding ``results.json``) given or under the given folders, in order, once each; a
    path that is not a folder adds a warning."""
    found: list[Path] = []
    for path in map(Path, paths):
        if not path.is_dir():
            warnings.append(f"{path}: not a folder; give run folders of `fedlit fit` or folders that contain them.")
            continue
        candidates = (
            [path] if (path / "results.json").exists() else sorted(p.parent for p in path.rglob("results.json"))
        )
        # a folder of runs may also hold runs that did not finish or whose results.json was lost: a folder with
        # fedlit's config.json and metrics.csv but no results.json is kept, to be named in a warning by load_run
        candidates += sorted(
            p.parent
            for p in path.rglob("metrics.csv")
            if (p.parent / "config.json").exists() and not (p.parent / "results.json").exists()
        )
        found += [c for c in candidates if c not in found]
    return found


def _read_json(path: Path) -> Any:
    if not path.is_file():
        raise DataError(f"{path}: missing (a run writes it when it finishes); run left out of the report.")
    try:
        return json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise DataError(f"{path}: cannot be read as JSON ({err}); run left out of the report.") from err


def read_metrics(path: Path) -> list[tuple[int, str, str, str, float]]:
    """The rows of a ``metrics.csv`` (``round, client, split, metric, value``).

    Raises:
        DataError: Naming the file, when it is missing or a row is malformed.
    """
    if not path.is_file():
        raise DataError(f"{path}: missing; the run's curves are left out of the report.")
    rows = []
    try:
        with path.open(newline="") as f:
            reader = csv.reader(f)
            header = next(reader, None)
            if header != ["round", "client", "split", "metric", "value"]:
                raise ValueError(f"header {header}, expected round,client,split,metric,value")
            for line, row in enumerate(reader, start=2):
                if len(row) != 5:
                    raise ValueError(f"line {line} has {len(row)} columns, expected 5")
                rows.append((int(row[0]), row[1], row[2], row[3], float(row[4])))
    except (OSError, UnicodeDecodeError, ValueError, csv.Error) as err:
        raise DataError(f"{path}: cannot be read ({err}); the run's curves are left out of the report.") from err
    return rows


def load_run(folder: Path, warnings: list[str]) -> Run:
    """Read a run folder; a bad ``metrics.csv`` or ``config.json`` only adds a warning.

    Raises:
        DataError: When ``results.json`` is missing, unreadable or holds no test results.
    """
    results = _read_json(folder / "results.json")
    if not isinstance(results, dict) or not ("last" in results or "best" in results):
        raise DataError(f"{folder / 'results.json'}: holds no test results ('last' or 'best'); run left out.")
    run = Run(folder, results)
    try:
        run.rows = read_metrics(folder / "metrics.csv")
    except DataError as err:
        warnings.append(str(err))
    recorded = recorded_settings(results)
    try:
        config = _read_json(folder / "config.json")
        run.config = config if isinstance(config, dict) else {}
    except DataError as err:
        left_out = "its configuration is left out" + (
            " (but for the strategy's and callbacks' arguments that results.json records)" if recorded else ""
        )
        warnings.append(str(err).replace("run left out of the report", left_out))
    for key, value in recorded.items():  # a run built in Python has neither in config.json (or no config.json)
        run.config.setdefault(key, value)
    if (folder / "manifest.json").is_file():  # compared by the gain over Local; optional
        try:
            run.manifest = json.loads((folder / "manifest.json").read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
            warnings.append(f"{folder / 'manifest.json'}: cannot be read as JSON ({err}); its data is not compared.")
    return run


def recorded_settings(results: Mapping[str, Any]) -> dict[str, Any]:
    """The strategy's and the extra callbacks' arguments that ``results.json`` records (``strategy_hparams``,
    ``callbacks``), written as a recipe writes them: ``strategy`` (``class_path``, ``init_args``) and
    ``callbacks`` (a list of them). The configuration table shows them for a run whose ``config.json`` lacks them
    (a run built in Python); a recipe's own ``strategy`` and ``callbacks`` are kept."""
    out: dict[str, Any] = {}
    if isinstance(results.get("strategy_hparams"), Mapping):
        out["strategy"] = {"class_path": results.get("strategy_class"), "init_args": dict(results["strategy_hparams"])}
    if isinstance(results.get("callbacks"), list):
        out["callbacks"] = [
            {"class_path": c.get("class"), "init_args": c.get("hparams") or {}}
            for c in results["callbacks"]
            if isinstance(c, Mapping)
        ]
    return out


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (n - 1; NaN for one value) of the finite values (NaN, NaN if none)."""
    values = [v for v in values if not math.isnan(v)]
    if not values:
        return math.nan, math.nan
    mean = sum(values) / len(values)
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1)) if len(values) > 1 else math.nan
    return mean, std


def mean_se(values: Sequence[float]) -> tuple[float, float]:
    """Mean and standard error of the mean (sample std / sqrt(k) over the k finite values; NaN for one value)."""
    mean, std = mean_std(values)
    return mean, std / math.sqrt(sum(not math.isnan(v) for v in values)) if not math.isnan(std) else math.nan


#: Metrics whose per-client sampling standard error :func:`sampling_se` knows (a proportion of test samples).
PROPORTIONS = ("accuracy", "balanced_accuracy")


def held_out_counts(run: Run) -> dict[str, list[int]]:
    """Test samples per class of every client, from the run's ``class_counts.json`` (empty when it has none)."""
    try:
        counts = json.loads((run.folder / "class_counts.json").read_text())
        return {c: [int(n) for n in v["test"]] for c, v in counts.items() if isinstance(v, dict) and "test" in v}
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, TypeError, ValueError, AttributeError):
        return {}


def sampling_se(metric: str, value: float, counts: Sequence[int]) -> float:
    """The sampling standard error of a client's test ``metric`` at ``value`` on its ``counts`` (test samples per
    class): how much the metric moves from one draw of that many test samples to another. ``accuracy``: the
    binomial sqrt(p(1-p)/n), n the client's test samples. ``balanced_accuracy`` (the mean recall over the K
    classes present): sqrt(sum_k p(1-p)/n_k) / K, each class's recall taken as p, so it grows with rare classes.
    NaN for other metrics or no test samples."""
    present = [n for n in counts if n > 0]
    if metric not in PROPORTIONS or not present or math.isnan(value):
        return math.nan
    var = value * (1 - value)
    if metric == "accuracy":
        return math.sqrt(var / sum(present))
    return math.sqrt(sum(var / n for n in present)) / len(present)


def higher_is_better(metric: str, runs: Iterable[Run] = ()) -> bool:
    """The direction of ``metric``: as the runs' modules declared it (``results.json`` ``higher_is_better``); for
    runs written before it was recorded, lower is better for a name containing ``loss`` only.

    Raises:
        ConfigError: When two runs declare opposite directions for ``metric`` (their modules differ).
    """
    declared: dict[bool, Path] = {}
    for run in runs:
        recorded = run.results.get("higher_is_better")
        if isinstance(recorded, Mapping) and metric in recorded:
            declared.setdefault(bool(recorded[metric]), run.folder)
    if len(declared) > 1:
        raise ConfigError(
            f"fedlit report --metric {metric}: the runs' modules rank it in opposite directions (higher is better "
            f"in {declared[True]}, lower in {declared[False]}); report the runs of each module apart."
        )
    return next(iter(declared)) if declared else "loss" not in metric


def client_values(run: Run, when: str, metric: str) -> dict[str, float]:
    """The test ``metric`` per client at ``when`` (``best`` or ``last``); empty when the run has none."""
    table = run.results.get(when) or {}
    return {c: float(v[metric]) for c, v in (table.get("clients") or {}).items() if metric in v}


def client_table(
    groups: Mapping[str, list[Run]], when: str, metric: str, spread: Spread = mean_std
) -> dict[str, dict[str, tuple[float, float]]]:
    """Per client (rows, plus ``average``: the per-run mean over clients), per method: ``spread`` of the values
    over seeds (:func:`mean_std`: mean and std; :func:`mean_se`: mean and standard error)."""
    clients: list[str] = []
    per_method: dict[str, list[dict[str, float]]] = {}
    for method, runs in groups.items():
        per_method[method] = [client_values(r, when, metric) for r in runs]
        for seed_values in per_method[method]:
            clients += [c for c in seed_values if c not in clients]
    table: dict[str, dict[str, tuple[float, float]]] = {c: {} for c in clients}
    table["average"] = {}
    for method, seeds in per_method.items():
        for c in clients:
            values = [s[c] for s in seeds if c in s]
            if values:
                table[c][method] = spread(values)
        means = [mean_std(list(s.values()))[0] for s in seeds if s]
        if means:
            table["average"][method] = spread(means)
    return table


def summary(
    groups: Mapping[str, list[Run]],
    when: str,
    metric: str,
    baseline_class: str = baseline.LOCAL,
    spread: Spread = mean_std,
    higher: bool | None = None,
) -> dict[str, dict[str, Any]]:
    """Per method: ``mean`` and ``worst`` client (``spread`` over seeds: mean and std, or mean and standard error
    with :func:`mean_se`), the ``pooled`` value where the runs recorded one (``results.json`` ``pooled`` of
    ``when``: the metric on all clients' test predictions together), and the mean individual gain over the
    baseline strategy's runs (``gain``, with ``gain_interval``: its 95 % t-interval over the paired seeds, see
    :mod:`fedlit.commands.report.interval`; ``paired``: the seeds paired; ``unpaired``: why the other runs are
    not) when there are some. Runs are paired by seed; a pair whose ``manifest.json`` files differ (other data)
    or whose baseline lacks some of the run's clients is not a pair.

    ``higher``: the metric's direction (None: :func:`higher_is_better` of the runs). It picks the worst client
    (the lowest where higher is better, else the highest) and the gain's sign: positive is better, so for a
    lower-is-better metric the gain is the baseline's value minus the run's.
    """
    if higher is None:
        higher = higher_is_better(metric, (r for runs in groups.values() for r in runs))
    worst = min if higher else max
    local: dict[Any, list[Run]] = {}  # per seed: several where the runs cover several data sets (a grid)
    for r in (r for runs in groups.values() for r in runs if r.strategy_class == baseline_class):
        local.setdefault(r.seed, []).append(r)
    out = {}
    for method, runs in groups.items():
        values = [client_values(r, when, metric) for r in runs]
        row: dict[str, Any] = {
            "seeds": len(runs),
            "mean": spread([mean_std(list(v.values()))[0] for v in values if v]),
            "worst": spread(
                [worst(finite) for v in values if (finite := [x for x in v.values() if not math.isnan(x)])]
            ),  # NaN: undefined
        }
        pooled = [
            float(value)
            for r in runs
            if isinstance(value := ((r.results.get(when) or {}).get("pooled") or {}).get(metric), int | float)
        ]
        if pooled:
            row["pooled"] = spread(pooled)
        if local and runs[0].strategy_class != baseline_class:
            gains, paired, unpaired = [], [], []
            for run, clients in zip(runs, values, strict=True):
                if run.seed not in local or not clients:
                    unpaired.append(
                        f"{run.folder}: "
                        + (
                            f"no {metric} at its {when} round"
                            if not clients
                            else f"no {baseline_class.rsplit('.', 1)[-1]} run of seed {run.seed}"
                        )
                    )
                    continue
                theirs = next((t for t in local[run.seed] if _same_data(t, run)), local[run.seed][0])
                try:
                    if run.manifest and theirs.manifest:
                        baseline.check_same_data(theirs.manifest, theirs.seed, run.manifest, run.seed, theirs.folder)
                    gain = baseline.gain_over_local(
                        {c: {metric: v} for c, v in clients.items()},
                        run.results[when]["round"],
                        when if when in theirs.results else "last",
                        theirs.results,
                        {metric: higher},
                    )
                except ConfigError as err:  # other data or other clients: not a pair
                    unpaired.append(f"{run.folder}: {err}")
                    continue
                if metric in gain["mean"]:
                    gains.append(gain["mean"][metric])  # an improvement: positive is better
                    paired.append(run.seed)
            row.update(gain=spread(gains), gain_interval=t_interval(gains), paired=paired, unpaired=unpaired)
        out[method] = row
    return out


def _same_data(theirs: Run, run: Run) -> bool:
    """Whether the baseline run ``theirs`` trained on the data of ``run`` (True when a manifest is missing)."""
    if not (run.manifest and theirs.manifest):
        return True
    try:
        baseline.check_same_data(theirs.manifest, theirs.seed, run.manifest, run.seed, theirs.folder)
    except ConfigError:
        return False
    return True


def flatten(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}``; lists are kept as their JSON text."""
    flat: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            flat.update(flatten(value, name + "."))
        else:
            flat[name] = json.dumps(value, default=str) if isinstance(value, list | dict) else value
    return flat


def config_differences(runs: Sequence[Run], ignore: Sequence[str] = ("out_dir",)) -> dict[str, list[Any]]:
    """The flattened configuration keys whose values differ between the runs: key -> one value per run."""
    flats = [flatten(r.config) for r in runs]
    keys = sorted({k for f in flats for k in f} - set(ignore))
    return {
        k: [f.get(k, "—") for f in flats]
        for k in keys
        if len({json.dumps(f.get(k, "—"), default=str) for f in flats}) > 1
    }
