"""Real cross-silo deployments on 127.0.0.1: a SuperLink with TLS and SuperNode authentication and two authenticated
SuperNodes (one client each), running with ``flwr run`` the app that ``fedlit flower-app`` writes for the 2-client
quickstart:

- FedBN, where site_1's turn raises in round 2 (on its node; ``on_client_error: skip``), one node keeping its
  client's state in files: the deployed run gives the simulation's per-client results and faults;
- FedAvg with SecAgg+: the aggregated model is the simulation's to the protocol's quantization error.

Every process a test starts is gone at its end (the nodes' workers, :mod:`fedlit.flower.worker`, stay in their
SuperNode's process group and exit once its SuperExec is gone). They are part of the default run although they take
about 60 s and 80 s on 2 shared CPU cores: most of that is waiting (the SuperNode polls every 3 s, and each message
starts a fresh ``flwr-clientapp`` process; its node's worker imports torch and builds the recipe once), little CPU.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("flwr.app", reason="flwr is not installed (pip install 'fedlit[flower]'): no Flower deployment")

from fedlit.cli import run  # noqa: E402
from fedlit.core.checkpoint_io import load_checkpoint  # noqa: E402
from fedlit.flower.app import write_app  # noqa: E402
from fedlit.flower.certs import make_certificates  # noqa: E402
from tests.children import popen_child  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
OVERRIDES = (
    "--data.init_args.num_clients 2 --federation.rounds 2 --federation.local_epochs 1 --federation.on_client_error skip"
)
# site_1's turn raises in round 2 (a recipe callback, so it runs on site_1's node): it is left out of that round
FAULT = (
    "\ncallbacks:\n  - class_path: tests.flower.faults.RaiseAt\n    init_args: {client_id: site_1, server_round: 2}\n"
)
CLIENTS = ["site_0", "site_1"]
#: Wall-clock limit (seconds) of every wait here: `flwr run`, the nodes' connection and turns, the SuperLink's start.
#: Generous (an hour, or FEDLIT_TEST_TIMEOUT) so that only a hung deployment fails, never a slow machine.
LIMIT = float(os.environ.get("FEDLIT_TEST_TIMEOUT", "3600"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _certificates(out: Path) -> dict[str, Path]:
    return make_certificates(out, ["127.0.0.1", "localhost"], nodes=len(CLIENTS))


def _alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


#: Kills the processes listed in a file (argv[1]), their descendants (seen every half second, since a child that
#: starts its own session leaves their process group) and their groups once the test process (argv[2]) is gone:
#: the SuperLink's and SuperNodes' processes die with the test run even when it is killed before its ``finally``.
WATCHDOG = """
import os, signal, sys, time

def processes():
    table = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = open(f"/proc/{entry}/stat").read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            table[int(entry)] = (int(fields[1]), int(fields[2]))  # ppid, pgid
    return table

groups, parent = sys.argv[1], int(sys.argv[2])
pids, pgids = set(), set()
while os.getppid() == parent:
    roots = {int(line) for line in open(groups).read().split()}
    table = processes()
    found = set(roots) & set(table)
    while True:
        more = {pid for pid, (ppid, _) in table.items() if ppid in found} - found
        if not more:
            break
        found |= more
    pids |= found
    pgids |= {table[pid][1] for pid in found} | roots
    time.sleep(0.5)
for pgid in pgids:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
for pid in pids:
    try:
        os.kill(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
"""


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


NEEDS_SUPERLINK = pytest.mark.skipif(
    shutil.which("flower-superlink", path=str(BIN)) is None,
    reason=f"flower-superlink is not installed next to {sys.executable}",
)


@contextlib.contextmanager
def _deployment(
    tmp_path: Path,
    state_dir: Path | None = None,
    clients: list[str] = CLIENTS,
    node_config: dict[str, str] | None = None,
) -> Iterator[dict[str, str]]:
    """A SuperLink (TLS, SuperNode authentication) and one authenticated SuperNode per client of ``clients`` on
    127.0.0.1 (the second keeps its client's state in ``state_dir`` when given; ``node_config`` adds a client's own
    node config entries); yields the environment for ``flwr`` and stops every process, checking that none is
    left."""
    certs = _certificates(tmp_path / "certs")
    home = tmp_path / "flwr_home"
    home.mkdir()
    env = {
        **os.environ,
        "FLWR_HOME": str(home),
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        "FLWR_SUPEREXEC_TASK_POLL_INTERVAL": "0.2",
        "OMP_NUM_THREADS": "1",
    }
    port = _free_port()
    (home / "config.toml").write_text(
        f'[superlink]\ndefault = "test"\n\n[superlink.test]\n'
        f'address = "127.0.0.1:{port}"\nroot-certificates = "{certs["ca.crt"]}"\n'
    )
    processes: list[subprocess.Popen] = []
    groups = tmp_path / "process_groups"
    groups.write_text("")
    watchdog = subprocess.Popen([sys.executable, "-c", WATCHDOG, str(groups), str(os.getpid())], start_new_session=True)

    def start(args: list[str], log: str) -> None:
        with open(tmp_path / log, "w") as out:
            processes.append(
                subprocess.Popen(
                    [str(BIN / args[0]), *args[1:]],
                    env=env,
                    cwd=tmp_path,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )
        with open(groups, "a") as listed:
            listed.write(f"{processes[-1].pid}\n")

    try:
        start(
            [
                "flower-superlink",
                "--ssl-ca-certfile",
                str(certs["ca.crt"]),
                "--ssl-certfile",
                str(certs["server.pem"]),
                "--ssl-keyfile",
                str(certs["server.key"]),
                "--port",
                str(port),
                "--enable-supernode-auth",
                "--disable-runtime-dependency-installation",
            ],
            "superlink.log",
        )
        for i, client in enumerate(clients):
            deadline = time.monotonic() + LIMIT
            while True:  # until the SuperLink answers
                registered = subprocess.run(
                    [str(BIN / "flwr"), "supernode", "register", str(certs[f"node_{i}.pub"]), "test"],
                    env=env,
                    cwd=tmp_path,
                    capture_output=True,
                    text=True,
                    timeout=LIMIT,
                )
                if registered.returncode == 0 or time.monotonic() > deadline:
                    break
                time.sleep(1)
            assert registered.returncode == 0, registered.stdout + registered.stderr
            start(
                [
                    "flower-supernode",
                    "--root-certificates",
                    str(certs["ca.crt"]),
                    "--superlink",
                    f"127.0.0.1:{port}",
                    "--port",
                    str(_free_port()),
                    "--auth-supernode-private-key",
                    str(certs[f"node_{i}.key"]),
                    "--node-config",
                    f"client-id='{client}'"
                    + (f" state-dir='{state_dir}'" if i and state_dir else "")
                    + (f" {node_config[client]}" if node_config and client in node_config else ""),
                ],
                f"supernode_{i}.log",
            )
        yield env
    finally:
        _stop(processes)
        watchdog.kill()
        watchdog.wait(timeout=10)
    assert not any(_alive(p.pid) for p in processes)


def _flwr_run(app: Path, env: dict[str, str], cwd: Path) -> None:
    start = time.monotonic()
    deployed = subprocess.run(
        [str(BIN / "flwr"), "run", str(app), "test", "--stream"],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=LIMIT,
    )
    print(f"flwr run took {time.monotonic() - start:.0f} s (limit {LIMIT:g} s, FEDLIT_TEST_TIMEOUT)")
    assert deployed.returncode == 0, deployed.stdout[-3000:] + deployed.stderr[-3000:]


@NEEDS_SUPERLINK
@pytest.mark.long
def test_tls_authenticated_deployment_equals_simulation(tmp_path):
    recipe = tmp_path / "quickstart_fault.yaml"
    recipe.write_text((ROOT / "recipes" / "quickstart.yaml").read_text() + FAULT)
    app = write_app(
        recipe,
        tmp_path / "app",
        overrides=OVERRIDES,
        out_dir=str(tmp_path / "deployed"),
        client_ids=",".join(CLIENTS),
        connect_timeout=LIMIT,
        client_timeout=LIMIT,
    ).parent
    with _deployment(tmp_path, state_dir=tmp_path / "state") as env:
        _flwr_run(app, env, tmp_path)
    logs = "".join((tmp_path / f"supernode_{i}.log").read_text() for i in range(len(CLIENTS)))
    assert logs.count("Receiving: train message") == 2 * len(CLIENTS)  # each node trained its client twice
    # site_1's node keeps its client's state in files (node config state-dir), site_0's in context.state
    assert sorted(p.name for p in (tmp_path / "state").glob("*/site_1/*")) == ["round_1.pt", "round_2.pt"]

    with pytest.warns(UserWarning, match="Round 2: client 'site_1' raised RuntimeError: disk full on site_1"):
        simulated = run(
            [
                "fit",
                "--config",
                str(recipe),
                *OVERRIDES.split(),
                "--out_dir",
                str(tmp_path / "simulated"),
                "--federation.progress_bar",
                "false",
            ]
        )
    results = json.loads((tmp_path / "deployed" / "results.json").read_text())
    assert (
        results["faults"]
        == simulated["faults"]
        == [{"round": 2, "client": "site_1", "kind": "error", "detail": "RuntimeError: disk full on site_1"}]
    )
    assert results["comm"] == simulated["comm"]
    for key in ("last", "best"):
        assert results[key]["round"] == simulated[key]["round"]
        assert set(results[key]["clients"]) == set(CLIENTS)
        for client in CLIENTS:
            for metric, value in simulated[key]["clients"][client].items():
                assert results[key]["clients"][client][metric] == pytest.approx(value, abs=1e-5), (key, client, metric)
    assert (tmp_path / "deployed" / "checkpoints" / "last.ckpt").is_file()


@NEEDS_SUPERLINK
@pytest.mark.long
def test_secagg_plus_fedavg_deployment_gives_the_simulations_aggregate(tmp_path):
    """FedAvg with SecAgg+ through the same TLS deployment: the server only ever sees the masked sum, and the model
    it aggregates is the plain simulation's to the protocol's quantization error (2**22 levels over +-8: a few 1e-6
    per value per round)."""
    recipe = tmp_path / "quickstart_fedavg.yaml"
    recipe.write_text(
        (ROOT / "recipes" / "quickstart.yaml").read_text().replace("class_path: FedBN", "class_path: FedAvg")
    )
    overrides = OVERRIDES.replace(" --federation.on_client_error skip", "")
    app = write_app(
        recipe,
        tmp_path / "app",
        overrides=overrides,
        out_dir=str(tmp_path / "deployed"),
        client_ids=",".join(CLIENTS),
        connect_timeout=LIMIT,
        client_timeout=LIMIT,
        secure_aggregation='{"max_weight": 200}',
    ).parent  # about the clients' sizes: a finer grid
    with _deployment(tmp_path) as env:
        _flwr_run(app, env, tmp_path)
    logs = "".join((tmp_path / f"supernode_{i}.log").read_text() for i in range(len(CLIENTS)))
    # SecAgg+'s four stages (setup, share keys, collect masked vectors, unmask) are four train messages a round
    assert logs.count("Receiving: train message") == 4 * 2 * len(CLIENTS)
    simulated = run(
        [
            "fit",
            "--config",
            str(recipe),
            *overrides.split(),
            "--out_dir",
            str(tmp_path / "simulated"),
            "--federation.progress_bar",
            "false",
        ]
    )
    deployed = load_checkpoint(tmp_path / "deployed" / "checkpoints" / "last.ckpt")["strategy"]["global_state"]
    plain = load_checkpoint(tmp_path / "simulated" / "checkpoints" / "last.ckpt")["strategy"]["global_state"]
    assert set(deployed) == set(plain)
    worst = max(float((deployed[n].double() - plain[n].double()).abs().max()) for n in plain)
    # Not bit-identical (SecAgg+ quantizes: at most about 5e-6 per value and round with max_weight 200), yet the
    # same model: round 2 trains from round 1's slightly different aggregate, which grows the gap (4e-5 measured).
    assert 0 < worst < 2e-4, worst
    results = json.loads((tmp_path / "deployed" / "results.json").read_text())
    assert results["comm"] == simulated["comm"]
    for client in CLIENTS:
        for metric, value in simulated["last"]["clients"][client].items():
            assert results["last"]["clients"][client][metric] == pytest.approx(value, abs=1e-3), (client, metric)


@pytest.mark.slow
@NEEDS_SUPERLINK
def test_a_node_killed_in_round_2_is_reported_with_flowers_reason(tmp_path):
    """``kill -9`` of site_1's SuperNode (and its worker: the same process group) once it has received its round-2
    train message: the SuperLink answers for the gone node, and the server stops the run naming the node, Flower's
    reason (NODE_UNAVAILABLE) and the seconds it waited (well under the client timeout), keeping round 1's
    checkpoint."""
    app = write_app(
        ROOT / "recipes" / "quickstart.yaml",
        tmp_path / "app",
        overrides=OVERRIDES.replace(" --federation.on_client_error skip", ""),
        out_dir=str(tmp_path / "deployed"),
        client_ids=",".join(CLIENTS),
        connect_timeout=LIMIT,
        client_timeout=LIMIT,
    ).parent
    with _deployment(tmp_path) as env:
        deployed = popen_child(
            [str(BIN / "flwr"), "run", str(app), "test", "--stream"],
            env=env,
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        node_log = tmp_path / "supernode_1.log"
        deadline = time.monotonic() + LIMIT
        while node_log.read_text().count("Receiving: train message") < 2:
            assert deployed.poll() is None and time.monotonic() < deadline, "round 2 never reached site_1's node"
            time.sleep(0.2)
        node = int((tmp_path / "process_groups").read_text().split()[2])  # the SuperLink, then one per client
        os.killpg(node, signal.SIGKILL)
        output, _ = deployed.communicate(timeout=LIMIT)
    said = re.search(
        r"Round 2: the turn of client 'site_1' \(Flower node \d+\) failed: node \d+ failed after "
        r"(\d+) s: Flower error NODE_UNAVAILABLE",
        output,
    )
    assert said is not None, output[-6000:]
    assert int(said.group(1)) < LIMIT
    assert load_checkpoint(tmp_path / "deployed" / "checkpoints" / "last.ckpt")["server_round"] == 1


HEART = ROOT.parent / "shared" / "data" / "heart_disease"


@NEEDS_SUPERLINK
@pytest.mark.long
def test_each_hospital_holds_only_its_own_file_and_the_deployment_equals_the_simulation(tmp_path):
    """FedHeartDisease across two hospitals: each SuperNode's folder holds its own ``processed.<site>.data`` only
    (its node config points the recipe's root there), the server's recipe names a folder it does not have, and the
    deployed run gives the simulation's per-client results on all the files."""
    if not HEART.is_dir():
        pytest.skip(f"the real Fed-Heart-Disease files are absent ({HEART})")
    sites = ["cleveland", "hungarian"]
    folders = {}
    for site in sites:
        folders[site] = tmp_path / "hospitals" / site
        folders[site].mkdir(parents=True)
        shutil.copy(HEART / f"processed.{site}.data", folders[site])
    recipe = tmp_path / "heart.yaml"
    recipe.write_text(
        (ROOT / "recipes" / "heart_disease_fedavg.yaml")
        .read_text()
        .replace("root: ../shared/data/heart_disease", f"root: {tmp_path / 'not_on_the_server'}")
    )
    overrides = "--data.init_args.sites [cleveland,hungarian] --federation.rounds 2 --federation.local_steps 10"
    app = write_app(
        recipe,
        tmp_path / "app",
        overrides=overrides,
        out_dir=str(tmp_path / "deployed"),
        client_ids=",".join(sites),
        connect_timeout=LIMIT,
        client_timeout=LIMIT,
    ).parent
    node_config = {site: f"overrides='--data.init_args.root {folders[site]}'" for site in sites}
    with _deployment(tmp_path, clients=sites, node_config=node_config) as env:
        _flwr_run(app, env, tmp_path)
    assert sorted(p.name for p in folders["cleveland"].iterdir()) == ["processed.cleveland.data"]
    assert not (tmp_path / "not_on_the_server").exists()
    simulated = run(
        [
            "fit",
            "--config",
            str(recipe),
            *overrides.split(),
            "--data.init_args.root",
            str(HEART),
            "--out_dir",
            str(tmp_path / "simulated"),
            "--federation.progress_bar",
            "false",
        ]
    )
    deployed = json.loads((tmp_path / "deployed" / "results.json").read_text())
    assert set(deployed["last"]["clients"]) == set(sites)
    for site in sites:
        for metric, value in simulated["last"]["clients"][site].items():
            assert deployed["last"]["clients"][site][metric] == pytest.approx(value, abs=1e-5), (site, metric)
