"""A real cross-silo deployment on 127.0.0.1: a SuperLink with TLS and SuperNode authentication, two authenticated
SuperNodes (one client each; one keeps its client's state in files), ``flwr run`` of the app that
``fedlit flower-app`` writes for the 2-client quickstart in which site_1's turn raises in round 2 (on its node;
``on_client_error: skip``); the deployed run gives the simulation's per-client results and faults, and every process
it started is gone at the end.

Slow (60 to 90 s on 2 shared CPU cores: each message starts a fresh ``flwr-clientapp`` process that imports torch and
Lightning and builds the recipe): ``pytest -m slow tests/flower/test_deployment.py``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("flwr.app", reason="flwr is not installed (pip install 'fedlit[flower]'): no Flower deployment")

from fedlit.cli import run  # noqa: E402
from fedlit.flower.app import write_app  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
OVERRIDES = ("--data.init_args.num_clients 2 --federation.rounds 2 --federation.local_epochs 1 "
             "--federation.on_client_error skip")
# site_1's turn raises in round 2 (a recipe callback, so it runs on site_1's node): it is left out of that round
FAULT = ("\ncallbacks:\n  - class_path: tests.flower.faults.RaiseAt\n"
         "    init_args: {client_id: site_1, server_round: 2}\n")
CLIENTS = ["site_0", "site_1"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _certificates(out: Path) -> dict[str, Path]:
    spec = importlib.util.spec_from_file_location("flower_certs", ROOT / "scripts" / "flower_certs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.make_certificates(out, ["127.0.0.1", "localhost"], nodes=len(CLIENTS))


def _alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def _stop(processes: list[subprocess.Popen]) -> None:
    """SIGTERM each process group (the SuperLink's and SuperNodes' own children included), SIGKILL what is left."""
    for p in processes:
        if _alive(p.pid):
            os.killpg(p.pid, signal.SIGTERM)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and any(_alive(p.pid) for p in processes):
        for p in processes:
            p.poll()  # reap the group leaders
        time.sleep(0.2)
    for p in processes:
        if _alive(p.pid):
            os.killpg(p.pid, signal.SIGKILL)
        p.wait(timeout=10)


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("flower-superlink", path=str(BIN)) is None,
                    reason=f"flower-superlink is not installed next to {sys.executable}")
def test_tls_authenticated_deployment_equals_simulation(tmp_path):
    certs = _certificates(tmp_path / "certs")
    home = tmp_path / "flwr_home"
    home.mkdir()
    env = {**os.environ, "FLWR_HOME": str(home), "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "FLWR_SUPEREXEC_TASK_POLL_INTERVAL": "0.2", "OMP_NUM_THREADS": "1"}
    port = _free_port()
    (home / "config.toml").write_text(f'[superlink]\ndefault = "test"\n\n[superlink.test]\n'
                                      f'address = "127.0.0.1:{port}"\nroot-certificates = "{certs["ca.crt"]}"\n')
    recipe = tmp_path / "quickstart_fault.yaml"
    recipe.write_text((ROOT / "recipes" / "quickstart.yaml").read_text() + FAULT)
    app = write_app(recipe, tmp_path / "app", overrides=OVERRIDES,
                    out_dir=str(tmp_path / "deployed"), client_ids=",".join(CLIENTS), connect_timeout=120.0,
                    client_timeout=300.0).parent
    processes: list[subprocess.Popen] = []

    def start(args: list[str], log: str) -> None:
        with open(tmp_path / log, "w") as out:
            processes.append(subprocess.Popen([str(BIN / args[0]), *args[1:]], env=env, cwd=tmp_path, stdout=out,
                                              stderr=subprocess.STDOUT, start_new_session=True))

    try:
        start(["flower-superlink", "--ssl-ca-certfile", str(certs["ca.crt"]),
               "--ssl-certfile", str(certs["server.pem"]), "--ssl-keyfile", str(certs["server.key"]),
               "--port", str(port), "--enable-supernode-auth",
               "--disable-runtime-dependency-installation"], "superlink.log")
        for i, client in enumerate(CLIENTS):
            registered = None
            for _ in range(60):  # until the SuperLink answers
                registered = subprocess.run([str(BIN / "flwr"), "supernode", "register", str(certs[f"node_{i}.pub"]),
                                             "test"], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60)
                if registered.returncode == 0:
                    break
                time.sleep(1)
            assert registered.returncode == 0, registered.stdout + registered.stderr
            start(["flower-supernode", "--root-certificates", str(certs["ca.crt"]), "--superlink", f"127.0.0.1:{port}",
                   "--port", str(_free_port()), "--auth-supernode-private-key", str(certs[f"node_{i}.key"]),
                   "--node-config", f"client-id='{client}'" + (f" state-dir='{tmp_path / 'state'}'" if i else "")],
                  f"supernode_{i}.log")
        deployed = subprocess.run([str(BIN / "flwr"), "run", str(app), "test", "--stream"], env=env, cwd=tmp_path,
                                  capture_output=True, text=True, timeout=480)
        assert deployed.returncode == 0, deployed.stdout[-3000:] + deployed.stderr[-3000:]
    finally:
        _stop(processes)
    assert not any(_alive(p.pid) for p in processes)
    logs = "".join((tmp_path / f"supernode_{i}.log").read_text() for i in range(len(CLIENTS)))
    assert logs.count("Receiving: train message") == 2 * len(CLIENTS)  # each node trained its client twice
    # site_1's node keeps its client's state in files (node config state-dir), site_0's in context.state
    assert sorted(p.name for p in (tmp_path / "state").glob("*/site_1/*")) == ["round_1.pt", "round_2.pt"]

    with pytest.warns(UserWarning, match="Round 2: client 'site_1' raised RuntimeError: disk full on site_1"):
        simulated = run(["fit", "--config", str(recipe), *OVERRIDES.split(),
                         "--out_dir", str(tmp_path / "simulated"), "--federation.progress_bar", "false"])
    results = json.loads((tmp_path / "deployed" / "results.json").read_text())
    assert results["faults"] == simulated["faults"] == [
        {"round": 2, "client": "site_1", "kind": "error", "detail": "RuntimeError: disk full on site_1"}]
    assert results["comm"] == simulated["comm"]
    for key in ("last", "best"):
        assert results[key]["round"] == simulated[key]["round"]
        assert set(results[key]["clients"]) == set(CLIENTS)
        for client in CLIENTS:
            for metric, value in simulated[key]["clients"][client].items():
                assert results[key]["clients"][client][metric] == pytest.approx(value, abs=1e-5), (key, client, metric)
    assert (tmp_path / "deployed" / "checkpoints" / "last.ckpt").is_file()
