"""Energy per method for ``fedlit report``, as the FedPxN paper's Table 5 gives each method's power (Yang et al.,
"Towards the Practical Utility of Federated Learning in the Medical Domain", CHIL 2023).

A run records the energy its device used in ``results.json`` (``"energy": {"kwh": ..., "source": "rapl" |
"nvml"}``, :mod:`fedlit.engine.records.energy`); a method's energy is the mean ± standard error over its seeds
that recorded it, with the sources read. Runs that could not measure it (``kwh: null``) are left out of the mean,
and a report where no run measured it shows no energy at all (no empty column)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from fedlit.commands.report.runs import Run, client_values, mean_se, mean_std

__all__ = ["MethodEnergy", "energy_cells", "energy_header", "energy_lines", "method_energy"]


@dataclass(frozen=True)
class MethodEnergy:
    """A method's energy: mean and standard error over ``measured`` of its ``seeds`` runs (kWh), and the sources."""

    kwh: float
    se: float
    measured: int
    seeds: int
    sources: tuple[str, ...]


def method_energy(runs: Sequence[Run]) -> MethodEnergy | None:
    """The energy of one method's runs, or None when none of them recorded it."""
    values, sources = [], set()
    for run in runs:
        energy = run.results.get("energy")
        if not isinstance(energy, Mapping):
            continue
        kwh = energy.get("kwh")
        if isinstance(kwh, int | float) and not isinstance(kwh, bool) and math.isfinite(kwh):
            values.append(float(kwh))
            sources.add(str(energy.get("source") or "unknown"))
    if not values:
        return None
    mean, se = mean_se(values)
    return MethodEnergy(mean, se, len(values), len(runs), tuple(sorted(sources)))


def _unit(energies: Sequence[MethodEnergy]) -> tuple[str, float]:
    """kWh where a method used 1 kWh or more, else Wh (the numbers of small runs stay readable)."""
    return ("kWh", 1.0) if max(e.kwh for e in energies) >= 1 else ("Wh", 1000.0)


def energy_header(groups: Mapping[str, Sequence[Run]]) -> str | None:
    """The column's title (``energy (Wh)``), or None when no run recorded its energy."""
    energies = [e for runs in groups.values() if (e := method_energy(runs)) is not None]
    return f"energy ({_unit(energies)[0]})" if energies else None


def energy_cells(groups: Mapping[str, Sequence[Run]]) -> dict[str, str]:
    """Per method, its energy as shown: ``12.34 ± 0.56 (rapl)`` in the unit of :func:`energy_header` (no ± for one
    seed; ``2 of 3 seeds`` where some did not measure it; ``—`` for a method without any); empty when no run
    recorded energy."""
    energies = {m: method_energy(runs) for m, runs in groups.items()}
    known = [e for e in energies.values() if e is not None]
    if not known:
        return {}
    _, scale = _unit(known)
    cells = {}
    for method, e in energies.items():
        if e is None:
            cells[method] = "—"
            continue
        text = f"{e.kwh * scale:.4g}" + ("" if math.isnan(e.se) else f" ± {e.se * scale:.2g}")
        notes = ", ".join(e.sources) + (f"; {e.measured} of {e.seeds} seeds" if e.measured < e.seeds else "")
        cells[method] = f"{text} ({notes})"
    return cells


def energy_lines(groups: Mapping[str, Sequence[Run]], metric: str) -> list[str]:
    """One line per method, its mean test ``metric`` (best-validation round where every run has one, else the
    last; mean ± standard error over seeds) beside its energy; empty when no run recorded energy."""
    cells = energy_cells(groups)
    if not cells:
        return []
    runs = [r for members in groups.values() for r in members]
    when = "best" if all("best" in r.results for r in runs) else "last"
    header = energy_header(groups)
    lines = []
    for method, members in groups.items():
        per_run = [v for r in members if (v := client_values(r, when, metric))]
        mean, se = mean_se([mean_std(list(v.values()))[0] for v in per_run]) if per_run else (math.nan, math.nan)
        shown = "—" if math.isnan(mean) else f"{mean:.4f}" + ("" if math.isnan(se) else f" ± {se:.4f}")
        lines.append(f"{method}: {metric} {shown} ({when} round), {header} {cells[method]}")
    return lines
