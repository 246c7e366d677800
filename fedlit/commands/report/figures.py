"""The content of ``fedlit report`` (:func:`build`): a list of blocks that :mod:`fedlit.commands.report.render`
renders as ``report.md`` and the self-contained ``report.html``, with its figures (drawn in
:mod:`fedlit.commands.report.curves` and :mod:`fedlit.commands.report.partition`). Each figure is a PNG and, unless
``vector`` is None, the same figure as a vector file beside it (``convergence.pdf``...), for papers. Every ranking
(bold best, worst client, the gain's sign) follows the metric's direction as the runs' modules declared it
(:func:`fedlit.commands.report.runs.higher_is_better`). See :mod:`fedlit.commands.report`."""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path

from fedlit.commands.report import client_gain as report_client_gain
from fedlit.commands.report import energy as report_energy
from fedlit.commands.report import interval as report_interval
from fedlit.commands.report import methods as report_methods
from fedlit.commands.report import runs as report_runs
from fedlit.commands.report.curves import convergence, cost, train_metric, training_curve
from fedlit.commands.report.partition import partition_blocks, partition_summary
from fedlit.commands.report.render import Block, fmt, fmt_count, markdown, plural, to_html, twin
from fedlit.commands.report.runs import Run
from fedlit.engine.records import baseline

# The rendering (Block, fmt, fmt_count, markdown, to_html) lives in fedlit.commands.report.render, the curves in
# fedlit.commands.report.curves and the partition in fedlit.commands.report.partition; their names stay
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


def bold_best(cells: dict[str, tuple[float, float]], methods: list[str], higher: bool) -> list[str]:
    """Each method's cell formatted, the best in bold: the highest mean where ``higher`` (is better), else the
    lowest; compared as shown (4 decimals): 0.525 and 0.52499999 are a tie."""
    means = {m: round(cells[m][0], 4) for m in methods if m in cells and not math.isnan(cells[m][0])}
    best = (max if higher else min)(means.values()) if means else None
    return [f"**{fmt(cells.get(m))}**" if m in means and means[m] == best else fmt(cells.get(m)) for m in methods]


def build(
    runs: list[Run], warnings: list[str], out: Path, metric: str, baseline_name: str, vector: str | None = None
) -> list[tuple]:
    """The report's blocks (see :data:`~fedlit.commands.report.render.Block`); writes the figures into ``out``, each
    also as a ``vector`` (``pdf``, ``svg``) file unless it is None."""
    groups = report_methods.by_method(runs)
    methods = list(groups)
    higher = report_runs.higher_is_better(metric, runs)
    direction = "higher" if higher else "lower"
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
            f"{plural(len(runs), 'run')}, {plural(len(methods), 'method')}: "
            + ", ".join(
                f"{m} ({plural(len(r), 'seed')}: " + ", ".join(str(x.seed) for x in r) + ")" for m, r in groups.items()
            )
            + ". A method is a strategy class with one configuration (named by what sets it apart from the other "
            "runs of its class); its runs are its seeds. Values are test metrics, mean ± standard error of the "
            f"mean over the k seeds (sample std / √k; no ± with one seed); {direction} {metric} is better. A gain "
            "over the baseline also has its 95 % t-interval over the paired seeds (k - 1 degrees of freedom), and "
            "a method beats or loses to the baseline only where that interval excludes zero.",
        ),
    ]
    for warning in warnings:
        blocks.append(("p", "Warning: " + warning))
    for when, title in (("best", "at the best-validation round"), ("last", "at the last round")):
        table = report_runs.client_table(groups, when, metric, report_runs.mean_se)
        if not any(table.values()):
            blocks += [("h", 2, f"Per-client test {metric} {title}"), ("p", f"No run has '{when}' results.")]
            continue
        rows = [[f"**{c}**" if c == "average" else c, *bold_best(cells, methods, higher)] for c, cells in table.items()]
        blocks += [
            ("h", 2, f"Per-client test {metric} {title}"),
            ("table", ["client", *methods], rows),
            (
                "p",
                "average: each run's mean over its clients, then mean ± standard error over seeds; bold: "
                f"the best method of the row ({direction} is better).",
            ),
        ]
        blocks += sampling_blocks(groups, when, metric)
    when = "best" if all("best" in r.results for r in runs) else "last"
    rows = []
    found_local = baseline_class is not None
    stats = report_runs.summary(groups, when, metric, baseline_class or baseline.LOCAL, report_runs.mean_se, higher)
    pooled = any("pooled" in row for row in stats.values())
    short_baseline = baseline_name.rsplit(".", 1)[-1]
    energy = report_energy.energy_cells(groups)  # empty (no column) when no run measured its energy
    for method, row in stats.items():
        gain = fmt(row["gain"], sign=True) if "gain" in row else "—"
        interval = row.get("gain_interval")
        judged = [report_interval.shown(interval), report_interval.verdict(interval, short_baseline)]
        paired = ", ".join(map(str, row.get("paired", []))) or "—"
        rows.append(
            [
                method,
                str(row["seeds"]),
                fmt(row["mean"]),
                fmt(row["worst"]),
                *([fmt(row.get("pooled"))] if pooled else []),
                *([energy[method]] if energy else []),
                *([gain, *(judged if "gain" in row else ["—", "—"]), paired] if found_local else []),
            ]
        )
    header = ["method", "seeds", f"mean {metric}", f"worst-client {metric}"]
    header += [f"pooled {metric} (FLamby's pooled test)"] if pooled else []
    header += [str(report_energy.energy_header(groups))] if energy else []
    blocks += [
        ("h", 2, f"Mean and worst client ({when} round)"),
        (
            "table",
            header
            + (
                [f"gain over {baseline_name}", "95 % t-interval of the gain", "verdict", "seeds paired"]
                if found_local
                else []
            ),
            rows,
        ),
        (
            "p",
            f"worst client: the {'lowest' if higher else 'highest'} client {metric} of each run ({direction} is "
            "better), then mean ± standard error over seeds."
            + (
                f" pooled {metric}: FLamby's pooled test figure, {metric} computed once on all clients' test "
                "predictions together (not a mean over clients), then mean ± standard error over the seeds that "
                "recorded it (— where none did)."
                if pooled
                else ""
            )
            + (
                " energy: what the device used over the whole run (results.json energy: rapl, the CPU packages' "
                "counters; nvml, the GPU's power draw), mean ± standard error over the seeds that measured it."
                if energy
                else ""
            ),
        ),
    ]
    blocks.append(
        (
            "p",
            f"Gain over {baseline_name}: per seed, each client's improvement over the {baseline_name} run of the "
            f"same seed (its {when} round; "
            + (
                f"the client's {metric} minus {baseline_name}'s"
                if higher
                else f"{baseline_name}'s {metric} minus the client's"
            )
            + ", so positive is better), averaged over clients; then mean ± standard error over the paired seeds "
            "(sample std / √k). 95 % t-interval: mean ± t(0.975, k - 1) × standard error, Student's t with k - 1 "
            f"degrees of freedom over the k paired seeds (4.303 at 3 seeds, 2.776 at 5). Verdict: beats "
            f"{short_baseline} only where the whole interval is above zero, loses to {short_baseline} only where it "
            "is below; otherwise not separated at k seeds (not the same as equal: more seeds may separate them). "
            "One seed has no interval and no verdict."
            if found_local
            else f"No run of {baseline_name} among the inputs: no gain over it.",
        )
    )
    for method, row in stats.items():
        if "gain" in row:
            blocks.append(("p", f"{method}: {report_interval.gain_sentence(row['gain_interval'], short_baseline)}"))
    for method, row in stats.items():
        for why in row.get("unpaired", []):
            blocks.append(("p", f"Not paired ({method}): {why}"))
    blocks += report_client_gain.blocks(groups, metric, baseline_class)  # the mean gain ± std across clients
    blocks += _curve_blocks(groups, metric, out, vector)
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
            ("img", cost_png, f"Mean validation {metric} against cumulative upload bytes", twin(cost_png, vector)),
        ]
    blocks += partition_blocks(runs, out, vector)
    diff = report_runs.config_differences(runs)
    blocks.append(("h", 2, "Configurations: the keys that differ"))
    blocks.append(
        ("table", ["key", *report_methods.run_names(runs)], [[k, *map(str, v)] for k, v in diff.items()])
        if diff
        else ("p", "The runs' configurations are the same (out_dir aside).")
    )
    return blocks


def _curve_blocks(groups: Mapping[str, list[Run]], metric: str, out: Path, vector: str | None) -> list[Block]:
    """The Convergence section: the validation curves, and the training curves where a method has no validation
    rows (a run without a validation split), so every run is drawn."""
    curves = out / "convergence.png"
    blocks: list[Block] = [("h", 2, "Convergence")]
    if convergence(groups, metric, curves, vector):
        blocks.append(("img", curves, f"Mean validation {metric} per round", twin(curves, vector)))
    no_val = [m for m, runs in groups.items() if not any(r.series("val", f"{metric}_mean") for r in runs)]
    if not no_val:
        return blocks
    name = train_metric(groups)
    train_png = out / "training.png"
    drawn = name is not None and training_curve(groups, name, train_png, vector)
    without = (
        f"{', '.join(no_val)} ha{'s' if len(no_val) == 1 else 've'} no validation {metric} per round in "
        "metrics.csv (a run without a validation split)"
    )
    if drawn and name is not None:
        shown = name.removesuffix("_mean")
        blocks += [
            (
                "p",
                f"{without}: below, the mean training {shown} per round of every method (metrics.csv "
                f"train/{name}); the test {metric} at the end is in the tables above.",
            ),
            ("img", train_png, f"Mean training {shown} per round", twin(train_png, vector)),
        ]
    else:
        blocks.append(("p", f"{without}, and no training rows in metrics.csv: no curve of it."))
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
