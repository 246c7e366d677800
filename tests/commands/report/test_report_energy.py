"""``fedlit report``'s energy per method (the FedPxN paper's Table 5), from fabricated results.json files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fedlit.commands import report
from fedlit.commands.report.energy import energy_cells, energy_header, method_energy
from tests.commands.test_report import FEDAVG, LOCAL, make_run


def _with_energy(folder: Path, energy: dict | None) -> None:
    results = json.loads((folder / "results.json").read_text())
    results["energy"] = energy
    (folder / "results.json").write_text(json.dumps(results))


def _experiment(tmp_path: Path, fedavg_kwh: tuple[float, float] | None, local_kwh: float | None = 0.001) -> Path:
    runs = {
        ("fedavg", 0): make_run(tmp_path / "fedavg" / "seed_0", FEDAVG, 0, {"a": 0.8, "b": 0.6}, {"a": 0.9, "b": 0.5}),
        ("fedavg", 1): make_run(tmp_path / "fedavg" / "seed_1", FEDAVG, 1, {"a": 0.6, "b": 0.4}, {"a": 0.7, "b": 0.3}),
        ("local", 0): make_run(tmp_path / "local" / "seed_0", LOCAL, 0, {"a": 0.7, "b": 0.7}, {"a": 0.6, "b": 0.6}),
        ("local", 1): make_run(tmp_path / "local" / "seed_1", LOCAL, 1, {"a": 0.5, "b": 0.3}, {"a": 0.5, "b": 0.1}),
    }
    if fedavg_kwh is not None:
        for seed, kwh in enumerate(fedavg_kwh):
            _with_energy(runs["fedavg", seed], {"kwh": kwh, "source": "rapl", "interval_seconds": 0.5})
        _with_energy(runs["local", 0], {"kwh": local_kwh, "source": "nvml", "interval_seconds": 0.5})
        _with_energy(runs["local", 1], {"kwh": None, "source": None, "why": "no RAPL package under /sys"})
    return tmp_path


def test_energy_per_method_beside_the_metric(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    experiment = _experiment(tmp_path / "runs", (0.002, 0.004))
    md = report.write([experiment], tmp_path / "out", vector=None).read_text()
    # FedAvg: 2 and 4 Wh -> mean 3, sample std sqrt(2) -> standard error sqrt(2) / sqrt(2) = 1. Local: 1 Wh from
    # its one seed that measured it (the other could not read a counter).
    header = next(line for line in md.splitlines() if line.startswith("| method | seeds | mean accuracy"))
    assert "| energy (Wh) |" in header
    assert "| FedAvg | 2 | 0.6000 ± 0.1000 | 0.4000 ± 0.1000 | 3 ± 1 (rapl) |" in md
    assert "| Local | 2 | 0.4500 ± 0.1500 | 0.3500 ± 0.2500 | 1 (nvml; 1 of 2 seeds) |" in md
    out = capsys.readouterr().out
    # best rounds: FedAvg's seeds average (0.9 + 0.5) / 2 = 0.7 and (0.7 + 0.3) / 2 = 0.5 -> 0.6 ± 0.1
    assert "fedlit report: FedAvg: accuracy 0.6000 ± 0.1000 (best round), energy (Wh) 3 ± 1 (rapl)" in out
    assert "fedlit report: Local: accuracy 0.4500 ± 0.1500 (best round), energy (Wh) 1 (nvml; 1 of 2 seeds)" in out


def test_kwh_when_a_method_uses_one_or_more(tmp_path: Path) -> None:
    groups = report.by_method(report.load_runs([_experiment(tmp_path, (1.5, 2.5), local_kwh=0.25)])[0])
    assert energy_header(groups) == "energy (kWh)"
    # 1.5 and 2.5: mean 2, sample std sqrt(0.5), standard error sqrt(0.5) / sqrt(2) = 0.5
    assert energy_cells(groups) == {"FedAvg": "2 ± 0.5 (rapl)", "Local": "0.25 (nvml; 1 of 2 seeds)"}
    fedavg = method_energy(groups["FedAvg"])
    assert fedavg is not None and (fedavg.kwh, fedavg.se, fedavg.measured, fedavg.seeds) == pytest.approx(
        (2.0, 0.5, 2, 2)
    )


def test_no_energy_recorded_prints_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    md = report.write([_experiment(tmp_path / "runs", None)], tmp_path / "out", vector=None).read_text()
    assert "energy" not in md.replace(str(tmp_path), "")
    assert "energy (" not in capsys.readouterr().out  # (the folder, named after this test, says energy)
    only_null = _experiment(tmp_path / "null", (0.1, 0.2))
    for folder in only_null.rglob("results.json"):
        _with_energy(folder.parent, {"kwh": None, "source": None, "why": "not measured"})
    groups = report.by_method(report.load_runs([only_null])[0])
    assert energy_header(groups) is None and energy_cells(groups) == {}
