"""Each client's gain over Local training, as personalized federated learning papers report it.

``fedlit fit ... --baseline_run DIR`` (or ``fedlit test --run RUN --baseline_run DIR``) names a finished run of
:class:`~fedlit.strategies.local.Local` on the same data (the same ``manifest.json``: data set class, partition,
splits) and the same ``federation.seed``. Per client and metric, the gain is

    gain_i = metric_i(run) - metric_i(Local)

on the test split, both runs taken at the same selection: the round of the best mean validation value when both
runs have one (``best``), else their last rounds (``last``); ``fedlit test`` of ``best.ckpt`` compares with the
baseline's ``best``, of any other checkpoint with its ``last``. The report gives every client's gain, their mean
and their sample standard deviation (n - 1 in the denominator; NaN for a single client), under
``gain_over_local`` in ``results.json``, as a table in ``results.md`` and as ``gain_over_local/<metric>_mean``
and ``_std`` in TensorBoard. A client whose value is NaN in either run (an undefined AUROC) is left out of that
metric's mean and std. For a metric where lower is better (a loss), a negative gain is an improvement.

The two runs must also have been trained alike, or the gain compares, say, round 1 of a 2-round run with round 8 of
a 10-round one: every run records its :func:`protocol` in ``results.json`` (rounds, local steps or epochs, the model
class, backbone and tensor shapes, the optimizer and its settings, the selection metric), and the baseline is
refused, naming each difference, when any of them differs (``--baseline_compare strict``, the default).
``--baseline_compare any`` compares anyway; ``gain_over_local`` then records ``"compare": "any"`` and the
``differences``. The roles (which tensors are shared) are not compared: a strategy changes them by design.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedlit.core.errors import ConfigError, broken
from fedlit.core.names import table_cell

if TYPE_CHECKING:
    from fedlit.engine.records.state import RecordedRun

#: The key of the gains in ``results.json`` (and the prefix of their TensorBoard tags).
KEY = "gain_over_local"
#: The strategy a baseline run must have used (``strategy_class`` in its ``results.json``).
LOCAL = "fedlit.strategies.local.Local"
OPTION = "--baseline_run"
#: The option that lets a baseline trained otherwise be compared (``strict`` or ``any``).
COMPARE_OPTION = "--baseline_compare"
#: The key of the training protocol in ``results.json``.
PROTOCOL = "protocol"


def _read_json(path: Path, what: str) -> Any:
    if not path.is_file():
        raise ConfigError(
            f"{OPTION} {path.parent}: no {path.name} there ({what}). Give the folder of a finished "
            "`fedlit fit` run of strategy Local."
        )
    try:
        return json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ConfigError(
            f"{OPTION}: {path} cannot be read as JSON ({err}); the run may not have finished. "
            "Run it to the end again, or give another run."
        ) from err


def load(folder: str | Path, run: RecordedRun | None = None) -> dict[str, Any]:
    """The baseline run's ``results.json``, checked: a Local run that finished and, with ``fed`` given (set up),
    one on the same data and seed.

    Raises:
        ConfigError: Naming the file that is missing or unreadable, or every difference from ``fed``'s run.
    """
    folder = Path(folder)
    results_path = folder / "results.json"
    results = _read_json(results_path, "a run writes it when it finishes")
    if not isinstance(results, Mapping) or not ("last" in results or "best" in results):
        raise ConfigError(
            f"{OPTION}: {results_path} holds no test results ('last' or 'best'); give the folder of a finished run."
        )
    strategy = results.get("strategy_class")
    if strategy != LOCAL:
        raise ConfigError(
            f"{OPTION}: {results_path} is a run of {strategy or 'an unknown strategy'}, not of "
            f"{LOCAL}; the gain over Local needs a run of strategy Local on the same data and seed."
        )
    if run is not None:
        manifest = _read_json(folder / "manifest.json", "the record of the run's data")
        check_same_data(manifest, results.get("seed"), run.datamodule.manifest(), run.settings.seed, folder)
        problems = differences(results.get(PROTOCOL), protocol(run))
        if problems and run.baseline_compare != "any":
            raise ConfigError(
                f"{OPTION} {folder} was trained otherwise: " + "; ".join(problems) + ". Give a Local "
                f"run of the same recipe, or pass {COMPARE_OPTION} any to compare anyway (recorded)."
            )
    return dict(results)


def protocol(run: RecordedRun) -> dict[str, Any]:
    """What makes two runs' rounds comparable: rounds, local steps (or epochs), the model (class, backbone, and a
    digest of its tensors' names and shapes), the optimizer and its settings, and the selection metric."""
    module = run.module
    shapes = ";".join(f"{n}:{tuple(t.shape)}" for n, t in module.state_dict().items())
    backbone = getattr(module, "backbone", None)
    settings = run.settings
    return {
        "rounds": settings.rounds,
        "local_steps": settings.local_steps,
        "local_epochs": settings.local_epochs if settings.local_steps is None else None,
        "model": {
            "class": f"{type(module).__module__}.{type(module).__qualname__}",
            "backbone": type(backbone).__name__ if backbone is not None else None,
            "shapes": hashlib.sha256(shapes.encode()).hexdigest()[:12],
        },
        "optimizer": {
            key: getattr(module, attr, None)
            for key, attr in (
                ("name", "optimizer_name"),
                ("lr", "lr"),
                ("momentum", "momentum"),
                ("weight_decay", "weight_decay"),
            )
        },
        "selection_metric": run.state.history.selection_metric,
    }


def differences(theirs: Mapping[str, Any] | None, ours: Mapping[str, Any]) -> list[str]:
    """Each difference between the baseline's :func:`protocol` and this run's, as ``what baseline (this run:
    ours)``; one entry when the baseline recorded none (a run of an older fedlit)."""
    if not isinstance(theirs, Mapping):
        return [f"its results.json records no training {PROTOCOL} (a run of an older fedlit: rerun it)"]
    names = {
        "rounds": "federation.rounds",
        "local_steps": "federation.local_steps",
        "local_epochs": "federation.local_epochs",
        "selection_metric": "the selection metric",
    }
    out = []
    for key, value in ours.items():
        other = theirs.get(key)
        if isinstance(value, Mapping) and isinstance(other, Mapping):
            out += [
                f"{key} {sub} {other.get(sub)!r} (this run: {v!r})" for sub, v in value.items() if other.get(sub) != v
            ]
        elif other != value:
            out.append(f"{names.get(key, key)} {other!r} (this run: {value!r})")
    return out


def gain(
    run: RecordedRun, clients: Mapping[str, Mapping[str, float]], server_round: int, selection: str
) -> dict[str, Any]:
    """:func:`gain_over_local` of ``run`` over its ``baseline_run`` (checked by :func:`load`), with how they were
    compared: ``compare`` (``strict`` or ``any``) and, under ``any``, the ``differences`` that were let through."""
    if not (run.baseline_run is not None):  # asked for only with a baseline run
        raise broken("asked for only with a baseline run")
    results = load(run.baseline_run, run)
    out = gain_over_local(clients, server_round, selection, results, run.module.higher_is_better)
    out["compare"] = run.baseline_compare
    if run.baseline_compare == "any":
        out["differences"] = differences(results.get(PROTOCOL), protocol(run))
    return out


def check_same_data(
    manifest: Mapping[str, Any], seed: Any, ours: Mapping[str, Any], our_seed: int, folder: str | Path
) -> None:
    """Raise :class:`ConfigError` naming each difference between the baseline's data and seed and this run's."""
    problems = []
    for key in ("class", "dataset", "task", "num_classes", "seed", "partitioner"):
        if manifest.get(key) != ours.get(key):
            problems.append(f"data {key} {manifest.get(key)!r} (this run: {ours.get(key)!r})")
    theirs_clients, our_clients = manifest.get("clients", {}), ours.get("clients", {})
    if sorted(theirs_clients) != sorted(our_clients):
        problems.append(f"clients {sorted(theirs_clients)[:6]} (this run: {sorted(our_clients)[:6]})")
    else:
        differing = [
            c
            for c in our_clients
            if json.dumps(theirs_clients[c], sort_keys=True, default=str)
            != json.dumps(our_clients[c], sort_keys=True, default=str)
        ]
        if differing:
            problems.append(f"the splits of clients {differing[:6]} (other samples in train, val or test)")
    if seed != our_seed:
        problems.append(f"federation.seed {seed!r} (this run: {our_seed!r})")
    if problems:
        raise ConfigError(
            f"{OPTION} {folder} was run on other data or seed: " + "; ".join(problems) + ". Give a "
            "Local run of the same recipe's data section and federation.seed."
        )


def gain_over_local(
    clients: Mapping[str, Mapping[str, float]],
    server_round: int,
    selection: str,
    baseline: Mapping[str, Any],
    higher_is_better: Mapping[str, bool],
) -> dict[str, Any]:
    """Every client's gain over the baseline at ``selection`` (``best`` or ``last``), their mean and std. A gain is
    an improvement: this run's value minus the baseline's for a metric where higher is better, the baseline's
    minus this run's where lower is better (a loss, an error), so a positive gain is better either way.

    Args:
        clients: This run's test metrics per client at ``selection``.
        server_round: The round they were measured at.
        selection: ``best`` (falls back to ``last`` when the baseline has no best round) or ``last``.
        baseline: The baseline's ``results.json`` (:func:`load`).
        higher_is_better: The metrics compared (those both runs have), with their direction.

    Raises:
        ConfigError: If a client of this run has no value in the baseline.
    """
    if selection not in baseline:
        selection = "last"
    theirs = baseline[selection]["clients"]
    missing = [c for c in clients if c not in theirs]
    if missing:
        raise ConfigError(
            f"{OPTION}: clients {missing[:6]} have no test values in the baseline run's "
            f"results.json ({selection}); give a Local run of the same data."
        )
    gains = {
        c: {
            m: (1.0 if up else -1.0) * (float(values[m]) - float(theirs[c][m]))
            for m, up in higher_is_better.items()
            if m in values and m in theirs[c]
        }
        for c, values in clients.items()
    }
    mean, std, count = {}, {}, {}
    for metric in higher_is_better:
        values = [g[metric] for g in gains.values() if metric in g and not math.isnan(g[metric])]
        if not values:
            continue
        mean[metric] = sum(values) / len(values)
        std[metric] = (
            math.sqrt(sum((v - mean[metric]) ** 2 for v in values) / (len(values) - 1)) if len(values) > 1 else math.nan
        )
        count[metric] = len(values)
    return {
        "selection": selection,
        "round": server_round,
        "baseline_round": baseline[selection]["round"],
        "clients": gains,
        "mean": mean,
        "std": std,
        "num_clients": count,
    }


def markdown(gain: Mapping[str, Any], metrics: list[str]) -> str:
    """The gains as a Markdown table: one row per client, then the mean and std rows."""
    metrics = [m for m in metrics if m in gain["mean"]]
    lines = [
        f"### Gain over Local ({gain['selection']}: round {gain['round']}, Local's round {gain['baseline_round']})",
        "",
        "| client | " + " | ".join(metrics) + " |",
        "|---|" + "---:|" * len(metrics),
    ]
    for client, values in gain["clients"].items():
        lines.append(f"| {table_cell(client)} | " + " | ".join(_fmt(values.get(m)) for m in metrics) + " |")
    for agg in ("mean", "std"):
        lines.append(f"| **{agg}** | " + " | ".join(_fmt(gain[agg].get(m)) for m in metrics) + " |")
    return "\n".join(lines) + "\n"


def _fmt(value: float | None) -> str:
    return "—" if value is None or math.isnan(value) else f"{value:+.4f}"
