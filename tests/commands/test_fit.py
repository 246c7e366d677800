"""``fedlit fit`` interrupted by Ctrl-C: one line with the round its checkpoint holds and the exact command that
resumes it (exit code 130), not a traceback."""

from __future__ import annotations

import functools
import json
import shlex
from pathlib import Path

import pytest

from fedlit.cli import main, run
from fedlit.engine.loop import rounds
from tests.test_cli import QUICK

SMALL = [*QUICK, "--federation.local_epochs", "1", "--data.init_args.samples_per_client", "20"]


def _interrupt_at(monkeypatch, at: int) -> None:
    real = rounds.run_round

    @functools.wraps(real)
    def run_round(fed, server_round):
        if server_round == at:
            raise KeyboardInterrupt  # what Ctrl-C raises in the main thread, here in the middle of a round
        real(fed, server_round)

    monkeypatch.setattr(rounds, "run_round", run_round)


@pytest.mark.parametrize("where", [["--out_dir=run"], ["--name", "x", "--version", "0"]])
def test_ctrl_c_prints_one_line_with_the_command_that_resumes(tmp_path, capsys, monkeypatch, where):
    monkeypatch.chdir(tmp_path)
    out = Path("run") if where[0].startswith("--out_dir") else Path("runs", "x", "version_0")
    argv = ["fit", *SMALL, *where, "--federation.rounds", "3"]
    _interrupt_at(monkeypatch, 2)
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 130
    command = shlex.join(["fedlit", "fit", *SMALL, "--federation.rounds", "3", "--out_dir", str(out)])
    err = capsys.readouterr().err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err
    assert err.splitlines()[-1] == (
        f"fedlit: fit interrupted after round 1 (its checkpoint is kept); resume it with: {command} --ckpt_path last"
    )
    monkeypatch.setattr(rounds, "run_round", rounds.run_round.__wrapped__)
    resumed = run(shlex.split(f"{command} --ckpt_path last")[1:])  # the printed command, as a shell would run it
    assert resumed["last"]["round"] == 3
    assert json.loads((out / "config.json").read_text())["resumed"][0]["from_round"] == 1


def test_ctrl_c_before_the_first_checkpoint_says_there_is_nothing_to_resume(tmp_path, capsys, monkeypatch):
    _interrupt_at(monkeypatch, 1)
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", *SMALL, "--out_dir", str(tmp_path / "run")])
    assert exit_info.value.code == 130
    assert capsys.readouterr().err.splitlines()[-1] == (
        "fedlit: fit interrupted in round 1, before its first checkpoint: nothing to resume; run the same command "
        "again to start over."
    )
