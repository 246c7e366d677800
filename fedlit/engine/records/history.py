"""The evaluation protocol: per-client metrics, their aggregates, model selection on validation, result tables.

Per client and split, every metric is reported as is; across clients as the unweighted mean (``mean``), the
mean weighted by the split's sample count (``wmean``) and the worst client (``worst``: the minimum of a metric
where higher is better, the maximum of a loss), leaving out clients whose value is undefined (NaN, such as a
C-index without a comparable pair): the tables then say over how many clients. Results are given at the last
round and at the round with the best mean validation value of the selection metric. Test metrics are recorded at
every evaluated round but are never used to choose anything.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from fedlit.core.names import table_cell

AGGREGATES = ("mean", "wmean", "worst")
#: What the tables' ``pooled`` row is.
POOLED_NOTE = (
    "_pooled: each metric over all the clients' samples together (FLamby's \"pooled\" figure), not a mean over "
    "clients._"
)
PerClient = dict[str, dict[str, float]]


def summarize(
    per_client: Mapping[str, Mapping[str, float]],
    weights: Mapping[str, int],
    higher_is_better: Mapping[str, bool],
) -> dict[str, float]:
    """``{metric}_{mean,wmean,worst}`` over clients; NaN values are left out of all three."""
    metrics = sorted({m for values in per_client.values() for m in values})
    out: dict[str, float] = {}
    for metric in metrics:
        pairs = [
            (v[metric], weights.get(c, 0)) for c, v in per_client.items() if metric in v and not math.isnan(v[metric])
        ]
        if not pairs:
            continue
        values = [v for v, _ in pairs]
        total = sum(w for _, w in pairs)
        out[f"{metric}_mean"] = sum(values) / len(values)
        out[f"{metric}_wmean"] = sum(v * w for v, w in pairs) / total if total > 0 else float("nan")
        out[f"{metric}_worst"] = min(values) if higher_is_better.get(metric, True) else max(values)
    return out


def counted(per_client: Mapping[str, Mapping[str, float]]) -> dict[str, int]:
    """Per metric, how many clients have a value (not NaN): the clients its aggregates cover."""
    metrics = sorted({m for values in per_client.values() for m in values})
    return {m: sum(1 for v in per_client.values() if m in v and not math.isnan(v[m])) for m in metrics}


class EvaluationHistory:
    """Every evaluated round's per-client metrics, and the model selection they imply.

    Args:
        selection_metric: Metric whose mean over clients on validation picks the best round (the federation
            passes ``federation.selection_metric``, or the module's ``default_selection_metric`` when that is
            None).
        higher_is_better: Direction per metric (the module's); the selection maximizes a metric where it is
            True (or absent) and minimizes it where it is False, such as a loss.
    """

    def __init__(self, selection_metric: str, higher_is_better: Mapping[str, bool]) -> None:
        self.selection_metric = selection_metric
        self.higher_is_better = dict(higher_is_better)
        self.rounds: dict[int, dict[str, PerClient]] = {}
        #: Per round and split, the metrics over every client's samples together (FLamby's "pooled" figure).
        self.pooled: dict[int, dict[str, dict[str, float]]] = {}

    def add(self, server_round: int, split: str, per_client: PerClient) -> None:
        """Record one split's per-client metrics at ``server_round``."""
        self.rounds.setdefault(server_round, {})[split] = {c: dict(m) for c, m in per_client.items()}

    def add_pooled(self, server_round: int, split: str, values: Mapping[str, float]) -> None:
        """Record one split's metrics pooled over its clients at ``server_round``."""
        self.pooled.setdefault(server_round, {})[split] = dict(values)

    @property
    def last_round(self) -> int | None:
        """The last evaluated round."""
        return max(self.rounds) if self.rounds else None

    def best_round(self) -> int | None:
        """The round with the best mean validation ``selection_metric`` (earliest on ties); None without val."""
        best, best_value = None, None
        sign = 1.0 if self.higher_is_better.get(self.selection_metric, True) else -1.0
        for server_round in sorted(self.rounds):
            val = self.rounds[server_round].get("val")
            if not val:
                continue
            values = [
                m[self.selection_metric]
                for m in val.values()
                if self.selection_metric in m and not math.isnan(m[self.selection_metric])
            ]
            if not values:
                continue
            value = sign * sum(values) / len(values)
            if best_value is None or value > best_value:
                best, best_value = server_round, value
        return best

    def best_per_client(self, split: str, weights: Mapping[str, int]) -> dict[str, Any] | None:
        """Each client's ``split`` values at its own best validation ``selection_metric`` round (earliest on ties),
        with those ``rounds`` and the aggregates: the selection of benchmarks that tune each client on its own (a
        strategy's ``per_client_selection``, FHBench's EPFL). None without validation values."""
        sign = 1.0 if self.higher_is_better.get(self.selection_metric, True) else -1.0
        chosen: dict[str, tuple[float, int]] = {}
        for server_round in sorted(self.rounds):
            for client, values in self.rounds[server_round].get("val", {}).items():
                value = values.get(self.selection_metric, math.nan)
                if math.isnan(value) or split not in self.rounds[server_round]:
                    continue
                if client in self.rounds[server_round][split] and (
                    client not in chosen or sign * value > chosen[client][0]
                ):
                    chosen[client] = (sign * value, server_round)
        if not chosen:
            return None
        per_client = {c: self.rounds[r][split][c] for c, (_, r) in chosen.items()}
        return {
            "rounds": {c: r for c, (_, r) in chosen.items()},
            "clients": per_client,
            "summary": summarize(per_client, weights, self.higher_is_better),
            "summary_clients": counted(per_client),
        }

    def results(self, split: str, weights: Mapping[str, int]) -> dict[str, Any]:
        """``{"last": {...}, "best": {...}}`` with round, per-client values and aggregates of ``split``, how many
        clients each metric's aggregates cover (``summary_clients``), and the metrics pooled over the clients
        (``pooled``) where they were computed."""
        out: dict[str, Any] = {"selection_metric": self.selection_metric}
        for key, server_round in (("last", self.last_round), ("best", self.best_round())):
            if server_round is None or split not in self.rounds.get(server_round, {}):
                continue
            per_client = self.rounds[server_round][split]
            out[key] = {
                "round": server_round,
                "clients": per_client,
                "summary": summarize(per_client, weights, self.higher_is_better),
                "summary_clients": counted(per_client),
            }
            pooled = self.pooled.get(server_round, {}).get(split)
            if pooled:
                out[key]["pooled"] = dict(pooled)
        return out

    def state_dict(self) -> dict[str, Any]:
        """Plain containers for a checkpoint."""
        return {
            "rounds": {str(r): v for r, v in self.rounds.items()},
            "pooled": {str(r): v for r, v in self.pooled.items()},
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict` (a checkpoint written before pooled metrics has none)."""
        self.rounds = {int(r): v for r, v in state["rounds"].items()}
        self.pooled = {int(r): v for r, v in state.get("pooled", {}).items()}


def markdown_table(title: str, result: Mapping[str, Any], metrics: list[str]) -> str:
    """A Markdown table: one row per client, then mean / weighted mean / worst rows."""
    per_client, summary = result["clients"], result["summary"]
    metrics = [m for m in metrics if any(m in v for v in per_client.values())]
    lines = [
        f"### {title} (round {result['round']})",
        "",
        "| client | " + " | ".join(metrics) + " |",
        "|---|" + "---:|" * len(metrics),
    ]
    for client, values in per_client.items():
        lines.append(f"| {table_cell(client)} | " + " | ".join(_fmt(values.get(m)) for m in metrics) + " |")
    for agg in AGGREGATES:
        lines.append(f"| **{agg}** | " + " | ".join(_fmt(summary.get(f"{m}_{agg}")) for m in metrics) + " |")
    pooled = result.get("pooled")
    if pooled:
        lines.append("| **pooled** | " + " | ".join(_fmt(pooled.get(m)) for m in metrics) + " |")
    count = counted(per_client)
    fewer = [
        f"{m} over {count.get(m, 0)} of {len(per_client)} clients" for m in metrics if count.get(m, 0) < len(per_client)
    ]
    if fewer:
        lines += ["", f"_Undefined values (—) are left out of mean, wmean and worst: {'; '.join(fewer)}._"]
    if pooled:
        lines += ["", POOLED_NOTE]
    return "\n".join(lines) + "\n"


def _fmt(value: float | None) -> str:
    return "—" if value is None or math.isnan(value) else f"{value:.4f}"
