"""The cost report as readable text: what ``fedlit cost`` and ``fedlit fit --dry_run`` print in the ``table`` format.

:func:`format_table` turns the report of :func:`~fedlit.config.costing.estimate` (or
:func:`~fedlit.config.costing.estimate_costs`) into the clients, the reference strategy's roles and one row of
communication costs per strategy; sizes in B/KB/MB/GB, counts with thousands separators.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["format_table"]


def _size(value: int | None) -> str:
    if value is None:
        return "unknown"
    for unit, scale in (("GB", 2**30), ("MB", 2**20), ("KB", 2**10)):
        if value >= scale:
            return f"{value / scale:.2f} {unit}"
    return f"{value} B"


def _count(value: int | None) -> str:
    return "unknown" if value is None else f"{value:,}"


def _ratio(value: float | None) -> str:
    if value is None:
        return "n/a"
    if value >= 10 or round(value, 1) == value:
        return f"{value:.1f}x"
    return f"{value:.2f}x" if value >= 0.01 else f"{value:.3g}x"


def format_table(report: Mapping[str, Any]) -> str:
    """The report as readable text: the clients, the reference strategy's roles, one row per strategy."""
    clients = report["clients"]
    cpr = clients["clients_per_round"]
    lines = [
        f"{report['model']}: {_count(clients['total'])} clients, {_count(clients['per_round'])} per round "
        f"(federation.clients_per_round={'null' if cpr is None else cpr}); {report['rounds']} rounds, "
        f"{report['evaluated_rounds']} evaluated."
    ]
    first = report["strategies"][0]
    lines += [
        "",
        f"Parameter roles under {first['strategy']}:",
        "| role | tensors | parameters | bytes |",
        "|---|---:|---:|---:|",
    ]
    lines += [
        f"| {role} | {r['tensors']:,} | {r['parameters']:,} | {_size(r['bytes'])} |"
        for role, r in first["roles"].items()
    ]
    lines += [
        "",
        "Communication (upload: what a selected client sends; download: what it receives; counts are tensor "
        "elements, buffers included):",
        "| strategy | shared parameters | upload / client / round | download / client / round | "
        "upload / round | download / round | upload / run | download / run | eval download / run | "
        f"upload vs {first['name']} |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in report["strategies"]:
        one, rnd, run = row["per_client_per_round"], row["per_round"], row["run"]
        lines.append(
            f"| {row['name']} | {row['roles']['shared']['parameters']:,} | "
            f"{one['upload_parameters']:,} ({_size(one['upload_bytes'])}) | "
            f"{one['download_parameters']:,} ({_size(one['download_bytes'])}) | "
            f"{_size(rnd['upload_bytes'])} | {_size(rnd['download_bytes'])} | {_size(run['upload_bytes'])} | "
            f"{_size(run['download_bytes'])} | {_size(row['eval_download_bytes']['run'])} | "
            f"{_ratio(row['upload_ratio'])} |"
        )
    lines += [
        f"{row['name']} fine-tunes before every evaluation: {_count(ft['per_client_per_evaluation'])} local "
        f"steps per client and evaluation, {_count(ft['run'])} over the run (beside the rounds' training)."
        for row in report["strategies"]
        if (ft := row["eval_finetune_steps"])["per_client_per_evaluation"]
    ]
    lines += [
        f"{row['name']} in round 1: download {_size(one['download_bytes'])} / client (the table's per-round "
        "figures are a later round's)."
        for row in report["strategies"]
        if (one := row["per_client_first_round"]) != row["per_client_per_round"]
    ]
    ratios = [f"{row['name']} / {first['name']} = {_ratio(row['upload_ratio'])}" for row in report["strategies"][1:]]
    if ratios:
        lines += ["", "Upload per client per round: " + "; ".join(ratios) + "."]
    lines += [f"Note: {note}" for note in report.get("notes", [])]
    return "\n".join(lines)
