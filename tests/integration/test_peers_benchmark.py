"""benchmarks/peers: the table and the goals it derives from measured runs, and (slow) a smoke run of the real thing.

The harness's arithmetic is checked on runs made up here (ratios to the floor, the fastest repeat, the median of
rounds after the first, pass and miss at the goals' bounds); the slow test runs ``--quick`` with the floor and
fedlit and checks that the table has their rows with figures. No timing is asserted.
"""

from __future__ import annotations

import argparse
import importlib.util
import re
import sys
from pathlib import Path

import pytest

from tests.children import run_child

ROOT = Path(__file__).resolve().parents[2]
PEERS = ROOT / "benchmarks" / "peers"


@pytest.fixture
def peers(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.syspath_prepend(str(PEERS))  # the benchmark's modules import each other by their file names
    spec = importlib.util.spec_from_file_location("peers_main", PEERS / "__main__.py")
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def _run(peers, wall: float, peak: float, rounds: list[float]):
    return peers.measure.Measured(ok=True, wall_s=wall, peak_mib=peak, round_seconds=rounds)


def _args(**kw) -> argparse.Namespace:
    return argparse.Namespace(**{"fused": [4], "rounds": 4, **kw})


def test_table_gives_ratios_to_the_floor_of_the_same_n(peers) -> None:
    rows = [
        peers.Row("vit", 2, "floor", [_run(peers, 10.0, 500.0, [9.0, 2.0, 4.0, 3.0])]),
        # two repeats: the fastest of each figure; rounds 2..4 have the median 6 and 5
        peers.Row(
            "vit",
            2,
            "fedlit",
            [_run(peers, 30.0, 400.0, [1.0, 6.0, 7.0, 5.0]), _run(peers, 25.0, 450.0, [1.0, 5.0, 5.0, 5.0])],
        ),
        peers.Row("vit", 2, "flower", [], note="skipped (N > --skip-flower-above 1)"),
    ]
    lines = peers.table(rows, 4)
    assert lines[0].startswith("| task | N | system | s / round |") and "4-round run s" in lines[0]
    assert lines[2] == "| vit | 2 | floor | 3.00 | 1.00 | 500 | 1.00 | 10.0 | 1.00 |"
    # fedlit: 5 s a round (5 / 3), 400 MiB (400 / 500), 25 s (25 / 10)
    assert lines[3] == "| vit | 2 | fedlit | 5.00 | 1.67 | 400 | 0.80 | 25.0 | 2.50 |"
    assert lines[4].startswith("| vit | 2 | flower | skipped (N > --skip-flower-above 1) |")


def test_goals_pass_and_miss_at_their_bounds(peers) -> None:
    def rows(fused: float, sampled: float, sampled_mib: float, flower_wall: float, fused_mib: float = 1.1) -> list:
        return [
            peers.Row("vit", 20, "floor", [_run(peers, 1.0, 1.0, [3.0])]),
            peers.Row("vit", 20, "fedlit fused 4", [_run(peers, 1.0, fused_mib, [fused])]),
            peers.Row("vit", 1000, "floor", [_run(peers, 1.0, 1.0, [10.0])]),
            peers.Row("vit", 1000, "fedlit", [_run(peers, 1.0, sampled_mib, [sampled])]),
            peers.Row("vit", 2, "fedlit", [_run(peers, 10.0, 1.0, [1.0])]),
            peers.Row("vit", 2, "flower", [_run(peers, flower_wall, 1.0, [1.0])]),
        ]

    # 3 / 2 = 1.5x faster, 12 / 10 = 1.2x the floor at 2047 MiB, Flower 30 / 10 = 3x slower: all at the bound
    assert [line.split(": ")[1].split()[0] for line in peers.goals(rows(2.0, 12.0, 2047.0, 30.0), _args())] == [
        "pass"
    ] * 3
    missed = peers.goals(rows(2.1, 12.1, 2048.0, 29.0), _args())
    assert [line.split(": ")[1].split()[0] for line in missed] == ["miss"] * 3
    assert "(fastest: fused 4, 1.43x faster, 1.10x the memory)" in missed[0]
    assert "(1.21x, 2.00 GiB)" in missed[1] and "(2.90x)" in missed[2]
    assert peers.goals(rows(2.0, 12.0, 2049.0, 30.0), _args())[1].split(": ")[1].startswith("miss")
    # fast enough, but over 1.1x the floor's memory
    assert peers.goals(rows(2.0, 12.0, 2047.0, 30.0, fused_mib=1.12), _args())[0].split(": ")[1].startswith("miss")
    # several K: the fastest row decides
    several = [*rows(2.1, 12.0, 2047.0, 30.0), peers.Row("vit", 20, "fedlit fused 8", [_run(peers, 1.0, 1.0, [1.5])])]
    assert "pass (fastest: fused 8, 2.00x faster" in peers.goals(several, _args(fused=[4, 8]))[0]


def test_goals_say_what_was_not_measured(peers) -> None:
    rows = [
        peers.Row("vit", 20, "fedlit fused 4", [], note="not available: this fedlit has no federation.fused_clients")
    ]
    lines = peers.goals(rows, _args())
    assert lines[0].endswith("not measured (not available: this fedlit has no federation.fused_clients)")
    assert all("not measured" in line for line in lines)


def test_fedlit_round_seconds_are_training_plus_aggregation_and_evaluations_are_summed(peers, tmp_path: Path) -> None:
    (tmp_path / "metrics.csv").write_text(
        "round,client,split,metric,value\n"
        "1,,system,train_seconds,2.5\n1,,system,aggregate_seconds,0.25\n1,,system,round_seconds,9\n"
        "1,site_0,train,loss,0.7\n2,,system,train_seconds,1.5\n2,,system,aggregate_seconds,0.5\n"
        "2,,system,eval_seconds,1.25\n1,,system,eval_seconds,0.5\n"
    )
    assert peers.fedlit_rounds(tmp_path) == ([2.75, 2.0], 1.75)


def test_the_sampled_protocol_starts_at_1000_clients(peers) -> None:
    args = argparse.Namespace(rounds=2, quick=False, heart_root=Path("/data"))
    assert "--federation.clients_per_round" not in peers.overrides("vit", 100, args)
    sampled = peers.overrides("vit", 1000, args)
    assert sampled[sampled.index("--federation.clients_per_round") + 1] == "0.1"
    assert sampled[sampled.index("--federation.local_steps") + 1] == "1"


@pytest.mark.slow
def test_quick_run_prints_the_floor_and_fedlit_rows(tmp_path: Path) -> None:
    done = run_child(
        [sys.executable, str(PEERS), "--quick", "--task", "vit", "--systems", "floor", "fedlit", "--fused", "2"],
        cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    number = r"\d+\.\d+"
    for system in ("floor", "fedlit"):
        assert re.search(rf"^\| vit \| 2 \| {system} \| {number} \| {number} \| \d+ \| ", done.stdout, re.M), (
            done.stdout
        )
    # the fused row: figures where this fedlit has federation.fused_clients, else said to be unavailable
    assert re.search(rf"^\| vit \| 2 \| fedlit fused 2 \| ({number} \||not available)", done.stdout, re.M)
    assert "2 clients, 2 rounds" not in done.stdout and "not measured" in done.stdout
