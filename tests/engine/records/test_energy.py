"""Energy of a fit: RAPL counters (wrap-around included) read from a fake sysfs folder, and the unavailable path."""

from __future__ import annotations

import json

import pytest
import torch

from fedlit.engine.records import energy
from fedlit.strategies import FedAvg
from tests.conftest import make_federation


def _zone(root, name, uj, max_uj=1_000_000):
    zone = root / name
    zone.mkdir(parents=True, exist_ok=True)
    (zone / "energy_uj").write_text(f"{uj}\n")
    (zone / "max_energy_range_uj").write_text(f"{max_uj}\n")
    return zone


def test_rapl_sums_the_packages_and_unwraps_a_counter_that_went_back(tmp_path):
    package0 = _zone(tmp_path, "intel-rapl:0", 900_000)
    package1 = _zone(tmp_path, "intel-rapl:1", 10_000)
    core = _zone(tmp_path, "intel-rapl:0:0", 5_000)  # a part of package 0: not added again
    counter = energy.RaplCounter(tmp_path)
    (package0 / "energy_uj").write_text("200000\n")  # wrapped: 900000 -> 1000000 -> 200000, 300000 uJ
    (package1 / "energy_uj").write_text("60000\n")  # 50000 uJ
    (core / "energy_uj").write_text("999999\n")
    assert counter.read() == pytest.approx(0.35)  # joules
    (package0 / "energy_uj").write_text("700000\n")  # 500000 uJ more
    assert counter.read() == pytest.approx(0.85)


def test_rapl_unreadable_or_missing_is_unavailable(tmp_path, monkeypatch):
    with pytest.raises(energy.Unavailable, match="no RAPL package"):
        energy.RaplCounter(tmp_path / "missing")
    _zone(tmp_path, "intel-rapl:0", 1)

    def denied(self, *args, **kwargs):
        if self.name == "energy_uj":
            raise PermissionError(13, "Permission denied")
        return original(self, *args, **kwargs)

    original = type(tmp_path).read_text
    monkeypatch.setattr(type(tmp_path), "read_text", denied)
    with pytest.raises(energy.Unavailable, match="not readable"):
        energy.RaplCounter(tmp_path)


def test_meter_converts_joules_to_kwh_per_round(tmp_path):
    class Fake:
        source = "fake"
        joules = 0.0

        def read(self):
            return self.joules

    counter = Fake()

    class Fed:
        pass

    fed = Fed()
    fed.energy = {"meter": energy.EnergyMeter(counter, interval=60), "why": None, "round_start": 0.0}
    counter.joules = 7.2e6  # 2 kWh
    assert energy.round_kwh(fed) == pytest.approx(2.0)
    counter.joules = 9.0e6
    assert energy.round_kwh(fed) == pytest.approx(0.5)
    assert energy.summary(fed, earlier_kwh=1.0)["kwh"] == pytest.approx(3.5)
    energy.stop(fed)


def test_a_fit_without_counters_says_unavailable_once_and_logs_no_energy(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(energy, "RAPL_ROOT", tmp_path / "no_powercap")
    monkeypatch.setattr(energy.start, "__defaults__", (tmp_path / "no_powercap",))
    assert not torch.cuda.is_available() or pytest.skip("a CUDA device measures with NVML")
    results = make_federation(tmp_path / "run", FedAvg(), rounds=2).fit()
    out = capsys.readouterr().out
    assert out.count("energy: unavailable") == 1
    why = f"no RAPL package under {tmp_path / 'no_powercap'}"
    assert results["energy"] == {"kwh": None, "source": None, "why": why}
    assert json.loads((tmp_path / "run" / "results.json").read_text())["energy"]["kwh"] is None
    assert "energy_kwh" not in (tmp_path / "run" / "metrics.csv").read_text()


def test_a_fit_with_a_fake_rapl_logs_energy_per_round(tmp_path, monkeypatch):
    root = tmp_path / "powercap"
    zone = _zone(root, "intel-rapl:0", 0, max_uj=10**12)
    monkeypatch.setattr(energy.start, "__defaults__", (root,))
    assert not torch.cuda.is_available() or pytest.skip("a CUDA device measures with NVML")
    fed = make_federation(tmp_path / "run", FedAvg(), rounds=2)
    original = energy.round_kwh
    readings = iter([3.6e6 * 1e6, 3 * 3.6e6 * 1e6])  # uJ at the end of rounds 1 and 2: 1 kWh, then 2 kWh

    def round_kwh(fed):
        (zone / "energy_uj").write_text(f"{int(next(readings))}\n")
        return original(fed)

    monkeypatch.setattr(energy, "round_kwh", round_kwh)
    results = fed.fit()
    assert results["energy"]["source"] == "rapl" and results["energy"]["kwh"] == pytest.approx(3.0)
    rows = [r for r in (tmp_path / "run" / "metrics.csv").read_text().splitlines() if "energy_kwh" in r]
    assert len(rows) == 2 and rows[0].rstrip().endswith(",1.0") and rows[1].rstrip().endswith(",2.0")


def test_nvml_integrates_power_over_time_with_trapezoids(monkeypatch):
    import sys
    import types

    powers = iter([100_000, 300_000, 300_000])  # mW at t = 0, 2 and 5 s
    clock = iter([0.0, 2.0, 5.0])
    fake = types.SimpleNamespace(
        NVMLError=RuntimeError,
        nvmlInit=lambda: None,
        nvmlDeviceGetHandleByIndex=lambda index: index,
        nvmlDeviceGetPowerUsage=lambda handle: next(powers),
    )
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    monkeypatch.setattr(energy.time, "perf_counter", lambda: next(clock))
    counter = energy.NvmlPower(0)
    assert counter.read() == pytest.approx(2 * (100 + 300) / 2)  # 400 J
    assert counter.read() == pytest.approx(400 + 3 * 300)  # 1300 J


def test_without_pynvml_a_gpu_is_unavailable(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "pynvml", None)
    with pytest.raises(energy.Unavailable, match="nvidia-ml-py"):
        energy.open_counter(torch.device("cuda", 0))
