"""The figures of ``fedlit report`` (matplotlib, Agg backend) and the writing of ``report.md`` and the
self-contained ``report.html`` (figures embedded as base64 PNG data URIs). See :mod:`fedlit.report`."""

from __future__ import annotations

import base64
import html
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from fedlit.report import Run


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt

    return plt


def convergence(groups: Mapping[str, list[Run]], metric: str, path: Path) -> bool:
    """Mean validation ``metric`` per round, one line per method (mean over seeds), a min-max band over seeds.
    Returns False (and writes nothing) when no run has validation rows."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.2))
    drawn = False
    for method, runs in groups.items():
        series = [s for s in (r.series("val", f"{metric}_mean") for r in runs) if s]
        if not series:
            continue
        rounds = sorted({k for s in series for k in s})
        values = [[s[k] for s in series if k in s] for k in rounds]
        mean = [sum(v) / len(v) for v in values]
        line, = ax.plot(rounds, mean, marker="o", markersize=3, label=f"{method} (n={len(series)})")
        if len(series) > 1:
            ax.fill_between(rounds, [min(v) for v in values], [max(v) for v in values], alpha=0.2,
                            color=line.get_color())
        drawn = True
    if drawn:
        ax.set_xlabel("round")
        ax.set_ylabel(f"mean validation {metric}")
        ax.set_title(f"Convergence: mean validation {metric} (band: min-max over seeds)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
        fig.tight_layout()
        fig.savefig(path, dpi=110)
    plt.close(fig)
    return drawn


def cost(groups: Mapping[str, list[Run]], metric: str, path: Path) -> bool:
    """Mean validation ``metric`` against cumulative upload bytes per round, one line per method (first seed's
    bytes, mean metric over seeds). Returns False when no run has both."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.2))
    drawn = False
    for method, runs in groups.items():
        pairs = [(r.series("comm", "upload_bytes_cumulative"), r.series("val", f"{metric}_mean")) for r in runs]
        pairs = [(b, m) for b, m in pairs if b and m]
        if not pairs:
            continue
        rounds = sorted(set(pairs[0][1]) & set(pairs[0][0]))
        x = [pairs[0][0][k] / 1e6 for k in rounds]
        y = [sum(m[k] for _, m in pairs if k in m) / sum(1 for _, m in pairs if k in m) for k in rounds]
        ax.plot(x, y, marker="o", markersize=3, label=method)
        drawn = True
    if drawn:
        ax.set_xlabel("cumulative upload (MB)")
        ax.set_ylabel(f"mean validation {metric}")
        ax.set_title(f"Mean validation {metric} against bytes uploaded")
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
        fig.tight_layout()
        fig.savefig(path, dpi=110)
    plt.close(fig)
    return drawn


# A report is a list of blocks: ("h", level, text), ("p", text), ("table", header, rows) with cells as strings
# ("**x**" marks bold), ("img", path, caption).
Block = tuple[Any, ...]


def fmt(mean_std: tuple[float, float] | None, sign: bool = False) -> str:
    if mean_std is None or math.isnan(mean_std[0]):
        return "—"
    mean, std = mean_std
    text = f"{mean:+.4f}" if sign else f"{mean:.4f}"
    return text if math.isnan(std) else f"{text} ± {std:.4f}"


def markdown(blocks: Sequence[Block]) -> str:
    lines = []
    for block in blocks:
        if block[0] == "h":
            lines += ["#" * block[1] + " " + block[2], ""]
        elif block[0] == "p":
            lines += [block[1], ""]
        elif block[0] == "table":
            header, rows = block[1], block[2]
            lines.append("| " + " | ".join(header) + " |")
            lines.append("|---|" + "---:|" * (len(header) - 1))
            lines += ["| " + " | ".join(str(c).replace("|", "\\|") for c in row) + " |" for row in rows]
            lines.append("")
        elif block[0] == "img":
            lines += [f"![{block[2]}]({block[1].name})", ""]
    return "\n".join(lines)


def _cell(text: str, tag: str = "td") -> str:
    text = str(text)
    if text.startswith("**") and text.endswith("**") and len(text) > 4:
        return f"<{tag}><b>{html.escape(text[2:-2])}</b></{tag}>"
    return f"<{tag}>{html.escape(text)}</{tag}>"


def to_html(blocks: Sequence[Block], title: str) -> str:
    body = []
    for block in blocks:
        if block[0] == "h":
            body.append(f"<h{block[1]}>{html.escape(block[2])}</h{block[1]}>")
        elif block[0] == "p":
            text = html.escape(block[1]).replace("`", "")
            body.append(f"<p>{text}</p>")
        elif block[0] == "table":
            head = "".join(_cell(h, "th") for h in block[1])
            rows = "".join("<tr>" + "".join(_cell(c) for c in row) + "</tr>" for row in block[2])
            body.append(f"<table><tr>{head}</tr>{rows}</table>")
        elif block[0] == "img":
            data = base64.b64encode(block[1].read_bytes()).decode("ascii")
            body.append(f'<figure><img src="data:image/png;base64,{data}" alt="{html.escape(block[2])}">'
                        f"<figcaption>{html.escape(block[2])}</figcaption></figure>")
    style = ("body{font-family:sans-serif;max-width:1100px;margin:2em auto;padding:0 1em}"
             "table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:3px 8px;"
             "text-align:right}td:first-child,th:first-child{text-align:left}img{max-width:100%}")
    return (f"<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>{html.escape(title)}</title>"
            f"<style>{style}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n")
