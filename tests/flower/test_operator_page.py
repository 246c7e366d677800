"""The operator steps of docs/deployment.md, as written: the shell blocks marked ``<!-- operator-step -->`` and the
``flwr`` connection marked ``<!-- operator-config -->``.

- every command names a program that is installed and options that its ``--help`` lists (fast);
- the steps run in order on 127.0.0.1 (slow), in the environment the page exports: certificates, a SuperLink, node
  registration, two SuperNodes, the app, ``flwr run`` (one round) and ``fedlit flower-wait``, then the node-state
  clean-up; only ports, the state folders and ``flwr``'s home are
  substituted. Every process dies with the test (the watchdog of :mod:`tests.flower.test_deployment`).
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("flwr.app", reason="flwr is not installed (pip install 'fedlit[flower]')")

from tests.children import run_child  # noqa: E402
from tests.flower.test_deployment import LIMIT, NEEDS_SUPERLINK, WATCHDOG, _alive, _free_port, _stop  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "deployment.md"
BIN = Path(sys.executable).parent
DAEMONS = ("flower-superlink", "flower-supernode")


def _blocks(marker: str) -> list[str]:
    """The fenced blocks that follow ``<!-- marker -->``, dedented."""
    found = re.findall(rf"<!-- {marker} -->\s*\n\s*```\w*\n(.*?)\n\s*```", PAGE.read_text(), flags=re.S)
    return ["\n".join(line.strip() for line in block.splitlines()) for block in found]


def _commands() -> list[list[str]]:
    """Each command of the steps, continuation lines joined, split as the shell would."""
    commands = []
    for block in _blocks("operator-step"):
        for line in block.replace("\\\n", " ").splitlines():
            if line and not line.startswith("#"):
                commands.append(shlex.split(os.path.expandvars(line)))
    return commands


def _exports() -> dict[str, str]:
    """The environment the steps set (``export NAME=VALUE`` lines of the ``<!-- operator-env -->`` blocks)."""
    found = {}
    for block in _blocks("operator-env"):
        for line in block.splitlines():
            if line and not line.startswith("#"):
                words = shlex.split(line, comments=True)
                assert words[0] == "export", line
                found.update(word.split("=", 1) for word in words[1:])
    return found


def _program(args: list[str]) -> tuple[list[str], list[str]]:
    """The program with its subcommands, and the options given."""
    words = 3 if args[0] == "flwr" and args[1] == "supernode" else 2 if args[0] in ("flwr", "fedlit") else 1
    return args[:words], [a.split("=")[0] for a in args[words:] if re.fullmatch(r"--[\w-]+(=.*)?", a)]


def test_the_page_has_the_steps():
    programs = [_program(c)[0] for c in _commands()]
    assert programs == [
        ["fedlit", "certs"],
        ["flower-superlink"],
        ["flwr", "supernode", "register"],
        ["flwr", "supernode", "register"],
        ["flower-supernode"],
        ["flower-supernode"],
        ["fedlit", "recipes"],
        ["fedlit", "flower-app"],
        ["flwr", "run"],
        ["fedlit", "flower-wait"],
        ["fedlit", "node-state"],
        ["fedlit", "node-state"],
    ]
    superlink = _commands()[1]
    assert superlink[superlink.index("--host") + 1] == "0.0.0.0"  # remote sites can connect
    assert len(_blocks("operator-config")) == 1
    # the settings the per-message figures were measured with (Flower's default poll interval is 1 s)
    assert _exports() == {"FLWR_SUPEREXEC_TASK_POLL_INTERVAL": "0.2", "OMP_NUM_THREADS": "1"}


@pytest.mark.long
def test_every_documented_option_exists():
    env = {
        **os.environ,
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    helps: dict[tuple[str, ...], str] = {}
    for args in _commands():
        program, options = _program(args)
        if tuple(program) not in helps:
            shown = run_child([str(BIN / program[0]), *program[1:], "--help"], env=env)
            assert shown.returncode == 0, f"{program}: {shown.stderr[-2000:]}"
            helps[tuple(program)] = re.sub(r"\x1b\[[0-9;]*m", "", shown.stdout)  # typer's colours
        missing = [o for o in options if not re.search(rf"{re.escape(o)}\b", helps[tuple(program)])]
        assert not missing, f"{' '.join(program)} --help does not list {missing}"


def _start(args: list[str], env: dict[str, str], cwd: Path, log: Path, groups: Path) -> subprocess.Popen:
    with open(log, "w") as out:
        process = subprocess.Popen(
            [str(BIN / args[0]), *args[1:]],
            env=env,
            cwd=cwd,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    with open(groups, "a") as listed:
        listed.write(f"{process.pid}\n")
    return process


def _substitute(args: list[str], ports: dict[str, str], state: Path) -> list[str]:
    out = []
    for a in args:
        for old, new in ports.items():
            a = a.replace(f"127.0.0.1:{old}", f"127.0.0.1:{new}")
        a = a.replace("/var/lib/fedlit", str(state))
        out.append(a)
    for i, a in enumerate(out):
        if a == "--port" and out[i + 1] in ports:
            out[i + 1] = ports[out[i + 1]]
        if a == "--overrides":  # one short round: what is tested is that the steps work, not the quickstart
            out[i + 1] += " --federation.rounds 1 --federation.local_epochs 1"
    return out


@pytest.mark.slow
@NEEDS_SUPERLINK
def test_the_documented_steps_run(tmp_path, monkeypatch):
    ports = {p: str(_free_port()) for p in ("9093", "9094", "9095")}
    state, home = tmp_path / "state", tmp_path / "flwr_home"
    home.mkdir()
    config = _blocks("operator-config")[0].replace("/abs/path/certs/ca.crt", str(tmp_path / "certs" / "ca.crt"))
    (home / "config.toml").write_text(config.replace("127.0.0.1:9093", f"127.0.0.1:{ports['9093']}"))
    env = {
        **os.environ,
        "FLWR_HOME": str(home),
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        "PWD": str(tmp_path),
        **_exports(),
    }
    groups = tmp_path / "process_groups"
    groups.write_text("")
    watchdog = subprocess.Popen([sys.executable, "-c", WATCHDOG, str(groups), str(os.getpid())], start_new_session=True)
    daemons: list[subprocess.Popen] = []
    outputs = {}
    try:
        monkeypatch.setenv("PWD", str(tmp_path))  # $PWD in the page: the folder the steps run in
        commands = [_substitute(c, ports, state) for c in _commands()]
        for i, args in enumerate(commands):
            if args[0] in DAEMONS:
                daemons.append(_start(args, env, tmp_path, tmp_path / f"daemon_{i}.log", groups))
                continue
            deadline = time.monotonic() + LIMIT
            while True:  # `flwr supernode register` until the SuperLink answers
                done = run_child([str(BIN / args[0]), *args[1:]], env=env, cwd=tmp_path, timeout=LIMIT)
                if done.returncode == 0 or args[:2] != ["flwr", "supernode"] or time.monotonic() > deadline:
                    break
                time.sleep(1)
            assert done.returncode == 0, f"{shlex.join(args)}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
            outputs[i] = done.stdout
    finally:
        _stop(daemons)
        watchdog.kill()
        watchdog.wait(timeout=10)
    assert not any(_alive(p.pid) for p in daemons)
    results = tmp_path / "quickstart_app-run" / "results.json"
    assert results.is_file()
    listed, deleted = outputs[len(commands) - 2], outputs[len(commands) - 1]
    assert outputs[len(commands) - 3].endswith(" finished:completed\n")  # fedlit flower-wait
    assert "clients site_0  rounds 1" in listed and deleted.startswith("deleted ")
    assert not any((state / "site_0").iterdir()) and any((state / "site_1").iterdir())
