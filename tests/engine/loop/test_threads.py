"""``federation.threads`` pins PyTorch's CPU threads, so a run's numbers do not follow ``OMP_NUM_THREADS``."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from fedlit.core.errors import ConfigError
from fedlit.engine.loop.settings import Settings
from tests.children import run_child

ROOT = Path(__file__).resolve().parents[3]
SHORT = ["--federation.rounds", "2", "--federation.local_epochs", "2", "--federation.progress_bar", "false"]


def _quickstart(out: Path, omp_threads: int, *extra: str) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": str(omp_threads), "PYTHONPATH": str(ROOT)}
    done = run_child(
        [
            sys.executable,
            "-m",
            "fedlit",
            "fit",
            "--config",
            str(ROOT / "recipes" / "quickstart.yaml"),
            *SHORT,
            *extra,
            "--out_dir",
            str(out),
        ],
        cwd=ROOT,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    results = json.loads((out / "results.json").read_text())
    return {"last": results["last"], "best": results["best"]}


@pytest.mark.long
def test_quickstart_gives_the_same_numbers_with_one_and_two_threads(tmp_path):
    """The recipe pins ``threads: 1``: the environment's thread count changes nothing, to the last bit."""
    one = _quickstart(tmp_path / "one", 1)
    two = _quickstart(tmp_path / "two", 2)
    assert one == two


@pytest.mark.long
def test_threads_is_set_for_the_run_and_recorded(tmp_path):
    """The pinned count is what PyTorch runs with, and ``config.json`` records it with the other settings."""
    env = {**os.environ, "OMP_NUM_THREADS": "2", "PYTHONPATH": str(ROOT)}
    code = (
        "import torch, sys; from fedlit.cli import main; "
        "main(['fit', '--config', sys.argv[1], *sys.argv[2:]]); print('threads', torch.get_num_threads())"
    )
    done = run_child(
        [
            sys.executable,
            "-c",
            code,
            str(ROOT / "recipes" / "quickstart.yaml"),
            "--federation.rounds",
            "1",
            "--federation.local_epochs",
            "1",
            "--federation.progress_bar",
            "false",
            "--federation.threads",
            "3",
            "--out_dir",
            str(tmp_path / "run"),
        ],
        cwd=ROOT,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "threads 3" in done.stdout
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert config["federation"]["threads"] == 3


@pytest.mark.parametrize("value", [0, -2])
def test_threads_below_one_is_refused_naming_the_option(value):
    with pytest.raises(ConfigError, match=rf"federation.threads={value} must be >= 1"):
        Settings(threads=value)
