"""Measure start-up time: how long fedlit's commands take before (and without) any real work.

Each command runs in a fresh interpreter ``--repeats`` times; printed: the median, the fastest and the slowest, in
seconds. Rows: ``import fedlit``, ``fedlit --help``, ``fedlit --version``, a 1-round quickstart run (``fedlit fit``
with ``--federation.rounds 1``), and for reference the imports it cannot avoid or that the others pay
(``torch``, ``lightning``, ``torchmetrics``, ``jsonargparse``). The load average is printed before and after:
figures taken while other processes load the machine are not comparable. ``--top N`` also lists the N slowest
packages (cumulative import time, from ``python -X importtime``) imported while building the quickstart's objects.

Nothing is asserted: this prints figures.

Run: python benchmarks/startup.py [--repeats 5] [--top 12] [--no-run]   (about 2 minutes on a 2-core CPU)
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = ROOT / "recipes" / "quickstart.yaml"


def fedlit_command() -> list[str]:
    """The ``fedlit`` console script of this interpreter's environment, or ``python -m fedlit``."""
    script = Path(sys.executable).with_name("fedlit")
    return [str(script)] if script.is_file() else [sys.executable, "-m", "fedlit"]


def timed(command: list[str], repeats: int, cwd: Path) -> list[float]:
    """Wall-clock seconds of ``command`` run ``repeats`` times (each in a new process)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True)
        seconds.append(time.perf_counter() - start)
        if done.returncode != 0:
            raise SystemExit(f"{' '.join(command)} failed ({done.returncode}):\n{done.stderr[-2000:]}")
    return seconds


def slowest_imports(top: int, cwd: Path) -> list[tuple[float, str]]:
    """The ``top`` packages with the largest cumulative import time (seconds, name) while building the quickstart's
    objects; a package imported inside another one is listed under its own name too."""
    code = (
        f"import fedlit.cli; fedlit.cli.prepare(['fit', '--config', {str(QUICKSTART)!r}, "
        f"'--out_dir', {str(cwd / 'importtime')!r}])"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", code], cwd=cwd, env=env, capture_output=True, text=True
    )
    rows = []
    for line in done.stderr.splitlines():
        parts = line.split("|")
        if line.startswith("import time:") and len(parts) == 3 and parts[1].strip().isdigit():
            name = parts[2].strip()
            if "." not in name:  # packages, not their submodules
                rows.append((int(parts[1]) / 1e6, name))
    return sorted(rows, reverse=True)[:top]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="Runs per command (the median is reported).")
    parser.add_argument("--top", type=int, default=0, help="Also list this many slowest imports of a run.")
    parser.add_argument("--no-run", action="store_true", help="Leave out the 1-round quickstart run.")
    args = parser.parse_args()
    fedlit = fedlit_command()
    py = sys.executable
    rows = [
        ("python -c pass", [py, "-c", "pass"]),
        ("import fedlit", [py, "-c", "import fedlit"]),
        ("fedlit --help", [*fedlit, "--help"]),
        ("fedlit --version", [*fedlit, "--version"]),
        ("import jsonargparse", [py, "-c", "import jsonargparse"]),
        ("import torch", [py, "-c", "import torch"]),
        ("import torchmetrics", [py, "-c", "import torchmetrics"]),
        ("import lightning", [py, "-c", "import lightning"]),
        ("import fedlit.federation", [py, "-c", "import fedlit.federation"]),
    ]
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        if not args.no_run:
            run = [
                *fedlit,
                "fit",
                "--config",
                str(QUICKSTART),
                "--federation.rounds",
                "1",
                "--federation.progress_bar",
                "false",
                "--out_dir",
                str(work / "quickstart"),
            ]
            clean = f" >/dev/null && rm -rf {work / 'quickstart'}"
            rows.append(("quickstart, 1 round", ["sh", "-c", " ".join(run) + clean]))
        print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())} ({os.cpu_count()} CPUs)")
        print(f"{'command':<26} {'median s':>9} {'min s':>7} {'max s':>7}")
        for label, command in rows:
            seconds = timed(command, args.repeats, work)
            print(f"{label:<26} {statistics.median(seconds):9.2f} {min(seconds):7.2f} {max(seconds):7.2f}", flush=True)
        print(f"load average after:  {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
        if args.top:
            print("\nslowest packages imported while building the quickstart (cumulative seconds, one run):")
            for seconds, module in slowest_imports(args.top, work):
                print(f"{seconds:7.2f} {module}")
        shutil.rmtree(work / "importtime", ignore_errors=True)


if __name__ == "__main__":
    main()
