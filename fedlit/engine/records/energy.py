"""Energy a fit uses, measured, never estimated: ``system/energy_kwh`` per round and ``energy`` in results.json.

- On a CUDA device: the GPU's power draw read through NVML (``pynvml``, from the optional ``nvidia-ml-py``
  package) every :data:`INTERVAL` seconds in a background thread, integrated over time (trapezoids).
- On the CPU: the cumulative counters of Intel RAPL (``/sys/class/powercap/intel-rapl:<n>/energy_uj``, the
  packages; their sub-zones are parts of them and are not added again), read at the same interval so that a
  counter's wrap-around (at ``max_energy_range_uj``) is seen; many systems let only root read them.

When neither can be read, the run logs ``energy: unavailable (...)`` once, logs no ``system/energy_kwh``, and
results.json says ``"energy": {"kwh": null, "source": null, "why": ...}``. The energy is the device's (GPU or CPU
packages), not the whole machine's; other processes on the device count too.
"""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fedlit.engine.records.state import RecordedRun

#: Seconds between two readings.
INTERVAL = 0.5
RAPL_ROOT = Path("/sys/class/powercap")
JOULES_PER_KWH = 3.6e6
_PACKAGE = re.compile(r"intel-rapl:\d+")


class Unavailable(Exception):
    """No energy counter can be read here (the message says why)."""


class RaplCounter:
    """The summed energy of the RAPL packages under ``root``, in joules since the first reading."""

    source = "rapl"

    def __init__(self, root: str | Path = RAPL_ROOT) -> None:
        root = Path(root)
        zones = sorted(p for p in root.glob("intel-rapl:*") if _PACKAGE.fullmatch(p.name)) if root.is_dir() else []
        if not zones:
            raise Unavailable(f"no RAPL package under {root}")
        self._zones = zones
        self._ranges = [_read_int(z / "max_energy_range_uj") for z in zones]
        try:
            self._last = [_read_int(z / "energy_uj") for z in zones]
        except PermissionError:
            raise Unavailable(f"{zones[0] / 'energy_uj'} is not readable (root only here)") from None
        self._joules = 0.0

    def read(self) -> float:
        """Joules since the first reading; a counter that went back has wrapped at its range."""
        for i, zone in enumerate(self._zones):
            now = _read_int(zone / "energy_uj")
            delta = now - self._last[i]
            if delta < 0:
                delta += self._ranges[i]
            self._joules += delta / 1e6
            self._last[i] = now
        return self._joules


class NvmlPower:
    """The energy of one GPU from its power draw (NVML), in joules since the first reading (trapezoids)."""

    source = "nvml"

    def __init__(self, index: int = 0) -> None:
        try:
            import pynvml
        except ImportError:
            raise Unavailable("pynvml is not installed (pip install nvidia-ml-py)") from None
        try:
            pynvml.nvmlInit()
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            self._power = pynvml.nvmlDeviceGetPowerUsage
            watts = self._power(self._handle) / 1000.0
        except pynvml.NVMLError as err:
            raise Unavailable(f"NVML: {err}") from None
        self._last = (time.perf_counter(), watts)
        self._joules = 0.0

    def read(self) -> float:
        now, watts = time.perf_counter(), self._power(self._handle) / 1000.0
        self._joules += (now - self._last[0]) * (watts + self._last[1]) / 2
        self._last = (now, watts)
        return self._joules


class EnergyMeter:
    """Reads a counter every ``interval`` seconds in a daemon thread; :meth:`joules` is the total so far."""

    def __init__(self, counter: Any, interval: float = INTERVAL) -> None:
        self.counter, self.source, self.interval = counter, counter.source, interval
        self._lock = threading.Lock()
        self._joules = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="fedlit-energy", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self.joules()

    def joules(self) -> float:
        with self._lock:
            try:
                self._joules = self.counter.read()
            except Exception:  # noqa: BLE001  (a counter that fails mid-run keeps its last total)
                self._stop.set()
            return self._joules

    def stop(self) -> float:
        self._stop.set()
        return self.joules()


def open_counter(device: Any, rapl_root: str | Path = RAPL_ROOT) -> Any:
    """NVML's power on a CUDA device, RAPL on the CPU; raises :class:`Unavailable` otherwise."""
    if getattr(device, "type", str(device)) == "cuda":
        return NvmlPower(device.index or 0)
    return RaplCounter(rapl_root)


def start(run: RecordedRun, rapl_root: str | Path = RAPL_ROOT) -> None:
    """Start measuring (at the start of a fit); says ``energy: unavailable`` once when nothing can be read."""
    previous = run.energy
    if previous is not None and previous["meter"] is not None:
        previous["meter"].stop()
    try:
        meter, why = EnergyMeter(open_counter(run.fabric.device, rapl_root)), None
    except Unavailable as err:
        meter, why = None, str(err)
        if run.fabric.is_global_zero:  # once per run, not once per rank
            print(f"energy: unavailable ({why})", flush=True)
    run.energy = {"meter": meter, "why": why, "round_start": 0.0}


def stop(run: RecordedRun) -> None:
    """Stop the reading thread (at the end of a fit); the total stays readable."""
    energy = run.energy
    if energy is not None and energy["meter"] is not None:
        energy["meter"].stop()


def round_kwh(run: RecordedRun) -> float | None:
    """The kWh since the previous call (the round's), or None without a meter."""
    energy = run.energy
    if energy is None or energy["meter"] is None:
        return None
    joules = energy["meter"].joules()
    kwh, energy["round_start"] = (joules - energy["round_start"]) / JOULES_PER_KWH, joules
    return kwh


def summary(run: RecordedRun, earlier_kwh: float = 0.0) -> dict[str, Any]:
    """``results.json``'s ``energy``: the kWh of this fit (plus ``earlier_kwh`` of the sessions before a
    resume), where it was read, or why it could not be."""
    energy = run.energy
    if energy is None:
        return {"kwh": None, "source": None, "why": "not measured (no fit in this session)"}
    if energy["meter"] is None:
        return {"kwh": None, "source": None, "why": energy["why"]}
    meter = energy["meter"]
    return {
        "kwh": earlier_kwh + meter.joules() / JOULES_PER_KWH,
        "source": meter.source,
        "interval_seconds": meter.interval,
    }


def _read_int(path: Path) -> int:
    return int(path.read_text().strip())
