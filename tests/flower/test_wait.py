"""``fedlit flower-wait``: exit 0 once the run completed, 1 when it failed (with Flower's reason), 2 on its own errors;
and, on a real SuperLink, a run whose out-dir lies inside the app folder (given through ``--run-config``) is refused
by the ServerApp although ``flwr run --stream`` exits 0: ``flower-wait`` says so, and nothing of it is bundled."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("flwr.app", reason="flwr is not installed (pip install 'fedlit[flower]'): no Flower deployment")

from fedlit.cli import run  # noqa: E402
from fedlit.core.errors import FedlitError  # noqa: E402
from fedlit.flower import wait  # noqa: E402
from fedlit.flower.app import write_app  # noqa: E402
from tests.flower.test_bundle import _fab  # noqa: E402
from tests.flower.test_deployment import BIN, LIMIT, NEEDS_SUPERLINK, _deployment  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
#: A stand-in for the `flwr` CLI: each call logs its arguments and prints the next answer of the answers file.
FAKE = """#!{python}
import json, sys
from pathlib import Path
here = Path(__file__).parent
with open(here / "calls.jsonl", "a") as log:
    log.write(json.dumps(sys.argv[1:]) + "\\n")
answers = json.loads((here / "answers.json").read_text())
answer = answers.pop(0)
(here / "answers.json").write_text(json.dumps(answers))
print(json.dumps(answer["json"]))
sys.exit(answer.get("exit", 0))
"""


def _run(status: str, details: str = "", run_id: str = "7") -> dict:
    return {"success": True, "runs": [{"run-id": run_id, "status": status, "status-details": details}]}


@pytest.fixture
def fake_flwr(tmp_path, monkeypatch):
    program = tmp_path / "flwr"
    program.write_text(FAKE.format(python=sys.executable))
    program.chmod(0o755)
    monkeypatch.setattr(wait, "flwr_program", lambda: str(program))

    def answers(*items: dict) -> Path:
        (tmp_path / "answers.json").write_text(json.dumps([{"json": item} for item in items]))
        return tmp_path / "calls.jsonl"

    return answers


def test_waits_for_the_newest_run_until_it_completed(fake_flwr, capsys):
    calls = fake_flwr(
        {"success": True, "runs": [{"run-id": "9", "status": "running"}, {"run-id": "7", "status": "finished"}]},
        _run("pending", run_id="9"),
        _run("running", run_id="9"),
        _run("finished:completed", run_id="9"),
    )
    assert run(["flower-wait", "--superlink", "site", "--poll_s", "0.01"])["run-id"] == "9"
    assert capsys.readouterr().out == "fedlit flower-wait: run 9 finished:completed\n"
    assert [json.loads(line) for line in calls.read_text().splitlines()] == [
        ["ls", "site", "--format", "json"],
        *[["ls", "site", "--format", "json", "--run-id", "9"]] * 3,
    ]


@pytest.mark.parametrize("status", ["finished:failed", "finished:stopped"])
def test_a_run_that_did_not_complete_exits_1_with_flowers_reason(fake_flwr, capsys, status):
    fake_flwr(_run("running"), _run(status, "ServerApp failed with exception: the run folder is inside the app"))
    with pytest.raises(SystemExit) as exited:
        run(["flower-wait", "--run_id", "7", "--poll_s", "0.01"])
    assert exited.value.code == 1
    assert capsys.readouterr().err == (
        f"fedlit flower-wait: run 7 {status}: ServerApp failed with exception: the run folder is inside the app\n"
    )


def test_a_superlink_that_refuses_is_an_error_and_a_blip_while_waiting_is_not(fake_flwr):
    fake_flwr({"success": False, "error-message": "Run ID 8 not found"})
    refused = r"^`ls --format json --run-id 8` failed \(exit code 0\): Run ID 8 not found$"
    with pytest.raises(FedlitError, match=refused):
        run(["flower-wait", "--run_id", "8"])
    fake_flwr(_run("running"), {"success": False, "error-message": "unavailable"}, _run("finished:completed"))
    assert run(["flower-wait", "--run_id", "7", "--poll_s", "0.01"])["status"] == "finished:completed"
    fake_flwr(*[_run("running")] * 3)
    with pytest.raises(FedlitError, match=r"^run 7 still 'running' after --timeout_s 0.01 s; see `flwr log 7"):
        run(["flower-wait", "--run_id", "7", "--poll_s", "0.02", "--timeout_s", "0.01"])


@NEEDS_SUPERLINK
@pytest.mark.long
def test_an_out_dir_inside_the_app_given_through_the_run_config_is_refused_and_flower_wait_says_so(tmp_path):
    app = write_app(ROOT / "recipes" / "quickstart.yaml", tmp_path / "app", connect_timeout=LIMIT).parent
    inside = app / "run_inside"
    with _deployment(tmp_path, clients=[]) as env:  # the server refuses before it asks for any node
        deadline = time.monotonic() + LIMIT
        while time.monotonic() < deadline:  # until the SuperLink answers
            listed = subprocess.run([str(BIN / "flwr"), "ls", "test"], env=env, capture_output=True, timeout=LIMIT)
            if listed.returncode == 0:
                break
            time.sleep(1)
        started = subprocess.run(
            [str(BIN / "flwr"), "run", str(app), "test", "--run-config", f"out-dir='{inside}'", "--stream"],
            env=env,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=LIMIT,
        )
        waited = subprocess.run(
            [str(BIN / "fedlit"), "flower-wait", "--superlink", "test", "--poll_s", "0.5", "--timeout_s", str(LIMIT)],
            env=env,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=LIMIT,
        )
    assert started.returncode == 0, started.stderr[-3000:]  # Flower's stream ends with 0 whatever became of the run
    assert waited.returncode == 1, waited.stdout[-3000:] + waited.stderr[-3000:]
    assert "finished:failed: ServerApp failed with exception: The server's run folder (out-dir) " in waited.stderr
    assert f"{inside} is inside the Flower app folder {app}" in waited.stderr
    assert not inside.exists()
    assert _fab(app) == [".info/CONTENT", "pyproject.toml"]  # the bundle the next `flwr run` ships
