"""The per-client gain over the baseline (Local), summarized across clients as personalized-FL papers' tables give
it: each client's value and its gain over the baseline run of the same seed and data (averaged over the paired
seeds), then the mean gain ± sample standard deviation *across clients* (not across seeds, which the report's
summary gives). Positive is better whatever the metric's direction."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from fedlit.commands.report import runs as report_runs
from fedlit.commands.report.render import fmt
from fedlit.commands.report.runs import Run
from fedlit.core.errors import ConfigError
from fedlit.engine.records import baseline

#: The metrics the table shows besides the report's own, where the runs recorded them.
ALSO = ("auroc", "accuracy")


def client_gains(
    runs: Sequence[Run], theirs: Sequence[Run], when: str, metric: str, higher: bool
) -> dict[str, tuple[float, float]]:
    """Per client: (its ``metric``, its gain over the baseline), each the mean over the seeds that pair a run of
    ``runs`` with a baseline run of ``theirs`` on the same data; clients where either value is NaN are left out
    of the gain of that seed."""
    values: dict[str, list[float]] = {}
    gains: dict[str, list[float]] = {}
    for run in runs:
        mine = report_runs.client_values(run, when, metric)
        for client, value in mine.items():
            values.setdefault(client, []).append(value)
        base = next((b for b in theirs if b.seed == run.seed and _same_data(b, run)), None)
        if base is None:
            continue
        reference = report_runs.client_values(base, when if when in base.results else "last", metric)
        for client, value in mine.items():
            if client in reference and not (math.isnan(value) or math.isnan(reference[client])):
                gain = value - reference[client] if higher else reference[client] - value
                gains.setdefault(client, []).append(gain)
    return {
        client: (report_runs.mean_std(v)[0], report_runs.mean_std(gains.get(client, []))[0])
        for client, v in values.items()
    }


def across_clients(gains: Mapping[str, tuple[float, float]]) -> tuple[float, float]:
    """Mean and sample standard deviation (n - 1) of the clients' gains (NaN gains left out)."""
    return report_runs.mean_std([gain for _, gain in gains.values()])


def blocks(
    groups: Mapping[str, list[Run]], metric: str, baseline_class: str | None, when: str = "last"
) -> list[tuple[Any, ...]]:
    """The report's "Per-client gain" section: one row per method and client, and per method the mean gain ±
    std across clients, for ``metric`` and, where recorded, :data:`ALSO`; empty without a baseline run."""
    if baseline_class is None:
        return []
    theirs = [r for runs in groups.values() for r in runs if r.strategy_class == baseline_class]
    every = [r for runs in groups.values() for r in runs]
    recorded = {m for r in every for v in ((r.results.get(when) or {}).get("clients") or {}).values() for m in v}
    metrics = [metric, *(m for m in ALSO if m != metric and m in recorded)]
    short = baseline_class.rsplit(".", 1)[-1]
    rows = []
    for method, runs in groups.items():
        if runs[0].strategy_class == baseline_class:
            continue
        per_metric = {m: client_gains(runs, theirs, when, m, report_runs.higher_is_better(m, every)) for m in metrics}
        for client in per_metric[metric]:
            cells = [per_metric[m].get(client, (math.nan, math.nan)) for m in metrics]
            rows.append(
                [method, client, *(f"{fmt((v, math.nan))} ({fmt((g, math.nan), sign=True)})" for v, g in cells)]
            )
        rows.append(
            [
                f"**{method}**",
                "**mean gain ± std across clients**",
                *(fmt(across_clients(per_metric[m]), sign=True) for m in metrics),
            ]
        )
    if not rows:
        return []
    return [
        ("h", 2, f"Per-client gain over {short} ({when} round)"),
        ("table", ["method", "client", *(f"{m} (gain)" for m in metrics)], rows),
        (
            "p",
            f"Each cell: the client's test value at the {when} round, mean over seeds, and in brackets its gain over "
            f"the {short} run of the same seed and data (positive is better), mean over the paired seeds. Each "
            f"method's last row: the mean of its clients' gains ± their sample standard deviation across clients "
            "(n - 1), the spread between sites rather than between seeds; clients whose value is undefined (AUROC "
            "with one class in the test split) are left out of it.",
        ),
    ]


def _same_data(theirs: Run, run: Run) -> bool:
    if not (run.manifest and theirs.manifest):
        return True
    try:
        baseline.check_same_data(theirs.manifest, theirs.seed, run.manifest, run.seed, theirs.folder)
    except ConfigError:
        return False
    return True
