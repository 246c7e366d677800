"""Measure start-up time: how long fedlit's commands take before (and without) any real work.

First the split of ``fedlit fit --config recipes/quickstart.yaml`` from the interpreter's start to the first client
step (the module's first ``training_step``), stage by stage in a fresh interpreter (``--repeats`` times, the median
of each stage): Python's own start, ``import torch``, the libraries Lightning pulls in through ``torchmetrics``
(``scipy.signal``, ``torchvision``, ``transformers``, each where installed), the rest of ``torchmetrics`` and of
``lightning.fabric``, fedlit's own modules, parsing the recipe and building its objects, and setting the run up until
the first step. Then each command runs in a fresh interpreter ``--repeats`` times; printed: the median, the fastest
and the slowest, in seconds. Rows: ``import fedlit``, ``fedlit --help``, ``fedlit --version``, a 1-round quickstart
run (``fedlit fit`` with ``--federation.rounds 1``), and for reference the imports it cannot avoid or that the others
pay (``torch``, ``lightning``, ``torchmetrics``, ``jsonargparse``). The load average is printed before and after:
figures taken while other processes load the machine are not comparable. ``--top N`` also lists the N slowest
packages (cumulative import time, from ``python -X importtime``) imported while building the quickstart's objects.

Nothing is asserted: this prints figures.

Run: python benchmarks/startup.py [--repeats 5] [--top 12] [--no-run] [--split-only]   (about 2 minutes on 2 cores)
"""

from __future__ import annotations

import argparse
import json
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


#: The child of :func:`first_step_split`: imports stage by stage, then ``fedlit fit`` until its first client step.
SPLIT_CHILD = """
import importlib, importlib.util, json, os, sys, time
marks = [("python start", time.time())]
def mark(label):
    marks.append((label, time.time()))
import torch; mark("import torch")
for name in ("scipy.signal", "torchvision", "transformers"):  # what torchmetrics imports where installed
    if importlib.util.find_spec(name.split(".")[0]) is not None:
        importlib.import_module(name); mark(f"import {name} (via torchmetrics)")
import torchmetrics; mark("import torchmetrics (the rest)")
import lightning.fabric; mark("import lightning.fabric (the rest)")
import fedlit.cli, fedlit.commands.fit, fedlit.tasks; mark("import fedlit's modules")
def first_step(*args, **kwargs):
    mark("set up the run until the first client step")
    print("STARTUP " + json.dumps(marks), flush=True)
    os._exit(0)
fedlit.tasks.ClassificationModule.training_step = first_step
job = fedlit.cli.prepare(sys.argv[1:]); mark("parse the recipe, build its objects")
job()
"""


def first_step_split(repeats: int, cwd: Path) -> list[tuple[str, list[float]]]:
    """Seconds of each stage from the interpreter's start to the quickstart's first client step, per repeat; the
    first stage, ``python start``, is from launching the interpreter to its first line of code."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    stages: dict[str, list[float]] = {}
    for i in range(repeats):
        out = cwd / f"first-step-{i}"
        argv = ["fit", "--config", str(QUICKSTART), "--federation.progress_bar", "false", "--out_dir", str(out)]
        launched = time.time()
        child = [sys.executable, "-c", SPLIT_CHILD, *argv]
        done = subprocess.run(child, cwd=cwd, env=env, capture_output=True, text=True)
        line = next((x for x in done.stdout.splitlines() if x.startswith("STARTUP ")), None)
        if line is None:
            raise SystemExit(f"the first-step child failed ({done.returncode}):\n{done.stderr[-2000:]}")
        previous = launched
        for label, at in json.loads(line.removeprefix("STARTUP ")):
            stages.setdefault(label, []).append(at - previous)
            previous = at
        stages.setdefault("total: start to first client step", []).append(previous - launched)
        shutil.rmtree(out, ignore_errors=True)
    return list(stages.items())


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
    parser.add_argument("--split-only", action="store_true", help="Only the split up to the first client step.")
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
        print(f"\n`fedlit fit` on the quickstart to its first client step ({args.repeats} runs, median of each stage):")
        for label, seconds in first_step_split(args.repeats, work):
            print(f"{label:<46} {statistics.median(seconds):6.2f} s  (min {min(seconds):.2f}, max {max(seconds):.2f})")
        print(f"load average after the split: {' '.join(f'{x:.2f}' for x in os.getloadavg())}\n", flush=True)
        if args.split_only:
            return
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
