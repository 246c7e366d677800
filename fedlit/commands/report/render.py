"""The rendering of ``fedlit report``'s blocks (:data:`Block`): :func:`markdown` writes ``report.md``, :func:`to_html`
the self-contained ``report.html`` (figures embedded as base64 PNG data URIs); :func:`fmt` and :func:`fmt_count`
format the numbers of their tables. :mod:`fedlit.commands.report.figures` builds the blocks."""

from __future__ import annotations

import base64
import html
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fedlit.core.names import table_cell

__all__ = ["Block", "fmt", "fmt_count", "markdown", "plural", "to_html", "twin"]


# A report is a list of blocks: ("h", level, text), ("p", text), ("table", header, rows) with cells as strings
# ("**x**" marks bold), ("img", path, caption, vector_path or None).
Block = tuple[Any, ...]


def fmt(mean_std: tuple[float, float] | None, sign: bool = False) -> str:
    if mean_std is None or math.isnan(mean_std[0]):
        return "—"
    mean, std = mean_std
    text = f"{mean:+.4f}" if sign else f"{mean:.4f}"
    return text if math.isnan(std) else f"{text} ± {std:.4f}"


def fmt_count(mean_std: tuple[float, float]) -> str:
    """A count (bytes, parameters) with thousands separators; ± std only when the seeds differ."""
    mean, std = mean_std
    if math.isnan(mean):
        return "—"
    return f"{mean:,.0f}" if math.isnan(std) or std == 0 else f"{mean:,.0f} ± {std:,.0f}"


def twin(path: Path, vector: str | None) -> Path | None:
    """The vector file written beside the figure ``path`` (None without one)."""
    return None if vector is None else path.with_suffix(f".{vector}")


def plural(count: int, noun: str) -> str:
    """``1 method``, ``2 methods``."""
    return f"{count} {noun}{'' if count == 1 else 's'}"


def markdown(blocks: Sequence[Block]) -> str:
    lines = []
    for block in blocks:
        if block[0] == "h":
            lines += ["#" * block[1] + " " + block[2], ""]
        elif block[0] == "p":
            lines += [block[1], ""]
        elif block[0] == "table":
            header, rows = block[1], block[2]
            lines.append("| " + " | ".join(map(table_cell, header)) + " |")
            lines.append("|---|" + "---:|" * (len(header) - 1))
            lines += ["| " + " | ".join(map(table_cell, row)) + " |" for row in rows]
            lines.append("")
        elif block[0] == "img":
            lines += [f"![{block[2]}]({block[1].name})", ""]
            if block[3] is not None:
                lines += [f"Vector: [{block[3].name}]({block[3].name})", ""]
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
            body.append(
                f'<figure><img src="data:image/png;base64,{data}" alt="{html.escape(block[2])}">'
                f"<figcaption>{html.escape(block[2])}</figcaption></figure>"
            )
    style = (
        "body{font-family:sans-serif;max-width:1100px;margin:2em auto;padding:0 1em}"
        "table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:3px 8px;"
        "text-align:right}td:first-child,th:first-child{text-align:left}img{max-width:100%}"
    )
    return (
        f'<!DOCTYPE html><html><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
        f"<style>{style}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n"
    )
