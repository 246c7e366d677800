"""One measured run: a command in a fresh process (its own session), its wall time, the peak memory of its tree.

Memory is the sum over the process and all its descendants (Ray's GCS, raylet and workers for Flower) of the
proportional set size (PSS: a page shared by k processes counts 1/k in each, so shared libraries and Ray's shared
object store are not counted k times), read with psutil every ``interval`` seconds in a thread; where PSS cannot be
read (not Linux), the resident set size (RSS) instead. The peak of the sums is reported.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field

import psutil


@dataclass
class Measured:
    """What one run gave: ``ok`` false with ``error`` (its output's tail) when it failed."""

    ok: bool
    wall_s: float = 0.0
    peak_mib: float = 0.0
    memory_kind: str = "PSS"
    round_seconds: list[float] = field(default_factory=list)
    eval_seconds: float | None = None  # fedlit's evaluations in all (its metrics.csv's system/eval_seconds)
    round_flops: float | None = None  # the floor's count of a round's training FLOPs
    gpu_peak_mib: float | None = None  # torch.cuda.max_memory_allocated, on a GPU
    error: str = ""
    output: str = ""


def tree_memory(root: psutil.Process) -> tuple[float, str]:
    """Bytes of PSS (or RSS) summed over ``root`` and its descendants alive now, and which of the two."""
    total, kind = 0.0, "PSS"
    try:
        processes = [root, *root.children(recursive=True)]
    except psutil.Error:
        return 0.0, kind
    for process in processes:
        try:
            info = process.memory_full_info()
            pss = getattr(info, "pss", None)
            if pss is None:
                kind = "RSS"
            total += info.rss if pss is None else pss
        except psutil.Error:  # gone, or not ours to read
            continue
    return total, kind


def run(command: list[str], *, env: dict[str, str], cwd: str, timeout: float, interval: float = 0.25) -> Measured:
    """Run ``command``; its wall seconds, peak tree memory and the ``round_seconds`` (with the floor's
    ``round_flops`` and ``gpu_peak_mib``) of the JSON on its last line of output that has them (the floor and Flower
    print them; fedlit's come from its ``metrics.csv``)."""
    peak, kind, stop = [0.0], ["PSS"], threading.Event()
    start = time.perf_counter()
    process = subprocess.Popen(
        command, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    watched = psutil.Process(process.pid)

    def sample() -> None:
        while not stop.is_set():
            total, kind[0] = tree_memory(watched)
            peak[0] = max(peak[0], total)
            stop.wait(interval)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        output, _ = process.communicate(timeout=timeout)
        wall = time.perf_counter() - start
    except subprocess.TimeoutExpired:
        _kill_group(process)
        output, _ = process.communicate()
        return Measured(ok=False, error=f"timed out after {timeout:.0f} s", output=output)
    finally:
        stop.set()
        sampler.join()
        _kill_group(process)  # what the run left behind in its session (Ray's daemons)
    if process.returncode != 0:
        return Measured(
            ok=False, error=output.strip().splitlines()[-1] if output.strip() else "no output", output=output
        )
    printed: dict = {"round_seconds": []}
    for line in reversed(output.splitlines()):
        if line.startswith("{") and "round_seconds" in line:
            printed = json.loads(line)
            break
    return Measured(
        ok=True,
        wall_s=wall,
        peak_mib=peak[0] / 2**20,
        memory_kind=kind[0],
        round_seconds=printed["round_seconds"],
        round_flops=printed.get("round_flops"),
        gpu_peak_mib=printed.get("gpu_peak_mib"),
        output=output,
    )


def _kill_group(process: subprocess.Popen) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
