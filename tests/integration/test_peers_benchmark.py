"""benchmarks/peers: the table and the goals it derives from measured runs, and (slow) a smoke run of the real thing.

The harness's arithmetic is checked on runs made up here (ratios to the floor and to the compute bound, the fastest
repeat, the median of rounds after the first, pass and miss at the goals' bounds, the GPU options' defaults), the
floor's FLOP count on a two-layer model worked out by hand; the last test runs ``--quick`` on the CPU with the floor
and fedlit (fused too) and checks that the table has their rows with figures, so the benchmark cannot rot. No timing
is asserted.
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
    module.floor_workload = importlib.import_module("workload")  # the floor's loop, for its FLOP count
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
    assert lines[0].startswith("| task | N | precision | system | s / round | x floor | x bound |")
    assert "| GPU MiB | 4-round run s |" in lines[0]
    assert lines[2] == "| vit | 2 | 32-true | floor | 3.00 | 1.00 | - | 500 | 1.00 | - | 10.0 | 1.00 |"
    # fedlit: 5 s a round (5 / 3), 400 MiB (400 / 500), 25 s (25 / 10); no bound, no GPU
    assert lines[3] == "| vit | 2 | 32-true | fedlit | 5.00 | 1.67 | - | 400 | 0.80 | - | 25.0 | 2.50 |"
    assert lines[4].startswith("| vit | 2 | 32-true | flower | skipped (N > --skip-flower-above 1) |")


def test_the_bound_column_divides_by_the_floors_flops_over_the_peak_of_the_rows_precision(peers) -> None:
    floor = peers.measure.Measured(ok=True, wall_s=1.0, peak_mib=1.0, round_seconds=[3.0], round_flops=2e12)
    bf16 = peers.measure.Measured(ok=True, wall_s=1.0, peak_mib=1.0, round_seconds=[1.0], round_flops=2e12)
    fed = peers.measure.Measured(ok=True, wall_s=1.0, peak_mib=1.0, round_seconds=[5.0], gpu_peak_mib=1234.4)
    rows = [
        peers.Row("vit", 20, "floor", [floor]),
        peers.Row("vit", 20, "fedlit", [fed]),
        peers.Row("vit", 20, "floor", [bf16], precision="bf16-mixed"),
    ]
    args = argparse.Namespace(peaks={"fp32": 1.0, "bf16": 4.0, "tf32": 2.0}, matmul_precision=None)
    lines = peers.table(rows, 1, lambda flops, precision: peers.device.bound_seconds(flops, precision, args))
    # fp32: 2 TFLOP / 1 TFLOP/s = 2 s: the floor 3 / 2, fedlit 5 / 2; bf16: 2 / 4 = 0.5 s, the floor 1 / 0.5
    assert lines[2].split(" | ")[4:7] == ["3.00", "1.00", "1.50"]
    assert lines[3].split(" | ")[4:7] == ["5.00", "1.67", "2.50"] and lines[3].split(" | ")[9] == "1234"
    assert lines[4].split(" | ")[2:7] == ["bf16-mixed", "floor", "1.00", "1.00", "2.00"]
    args.matmul_precision = "high"  # TF32: 2 TFLOP / 2 TFLOP/s
    assert peers.device.bound_seconds(2e12, "32-true", args) == 1.0


def test_the_peak_follows_the_precision_and_defaults_to_an_h100_on_cuda_only(peers) -> None:
    kind = peers.device.peak_kind
    assert [kind("bf16-mixed", None), kind("32-true", "medium"), kind("32-true", "high")] == ["bf16", "bf16", "tf32"]
    assert kind("32-true", None) == kind("32-true", "highest") == "fp32"
    options = {
        "clients": None,
        "systems": None,
        "task": None,
        "fused": None,
        "precision": None,
        "matmul_precision": None,
    }
    cuda = argparse.Namespace(accelerator="cuda", peak_bf16=None, peak_tf32=None, peak_fp32=None, **options)
    peers.device.resolve(cuda)
    assert cuda.peaks == {"bf16": 989.0, "tf32": 494.7, "fp32": 66.9}
    assert (cuda.clients, cuda.systems, cuda.precision) == ([20, 100], ["floor", "fedlit"], ["32-true", "bf16-mixed"])
    assert peers.device.bound_seconds(989e12, "bf16-mixed", cuda) == 1.0
    cpu = argparse.Namespace(accelerator="cpu", peak_bf16=None, peak_tf32=None, peak_fp32=None, **options)
    peers.device.resolve(cpu)
    assert cpu.peaks == {"bf16": None, "tf32": None, "fp32": None} and cpu.precision == ["32-true"]
    assert peers.device.bound_seconds(1e12, "32-true", cpu) is None
    assert peers.device.bound_note(cpu) == (
        "x bound: not computed for fp32 (no peak throughput of this device: give --peak-fp32 TFLOP/s)"
    )
    given = argparse.Namespace(accelerator="cpu", peak_bf16=None, peak_tf32=None, peak_fp32=0.5, **options)
    peers.device.resolve(given)
    assert peers.device.bound_seconds(1e12, "32-true", given) == 2.0


def test_the_gpu_goals_pass_and_miss_at_their_bounds(peers) -> None:
    def rows(fedlit: float, fused: float, fused_mib: float) -> list:
        def row(system: str, seconds: float, mib: float | None) -> object:
            run = peers.measure.Measured(ok=True, wall_s=1.0, peak_mib=1.0, round_seconds=[seconds], gpu_peak_mib=mib)
            return peers.Row("vit", 20, system, [run], precision="bf16-mixed")

        return [row("floor", 2.0, 500.0), row("fedlit", fedlit, 1000.0), row("fedlit fused 10", fused, fused_mib)]

    # 2.06 / 2 = 1.03x the floor, 2 / 1 = 2x faster, 2000 / 1000 = 2x the memory: all at the bound
    verdicts = [line.rsplit(": ", 1)[1].split()[0] for line in peers.device.gpu_goals(rows(2.06, 1.0, 2000.0))]
    assert verdicts == ["pass"] * 3
    missed = peers.device.gpu_goals(rows(2.08, 1.01, 2001.0))
    assert [line.rsplit(": ", 1)[1].split()[0] for line in missed] == ["miss"] * 3
    assert "(1.04x)" in missed[0] and "(fedlit fused 10, 1.98x)" in missed[1] and "(at most 2.00x)" in missed[2]
    assert peers.device.gpu_goals(rows(2.0, 1.0, 1.0)[:1]) == ["- GPU, N = 20, bf16-mixed: not measured"]


def test_the_floor_counts_forward_and_backward_flops_as_its_loop_runs_them(peers) -> None:
    import torch
    from torch import nn

    workload = peers.floor_workload

    class TwoLayers(nn.Module):
        """Trainable A (8 -> 8), frozen B (8 -> 4), no biases."""

        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = nn.Linear(8, 8, bias=False), nn.Linear(8, 4, bias=False)
            self.b.weight.requires_grad_(False)

        def training_step(self, batch, batch_idx):
            return {"loss": self.b(self.a(batch[0])).sum()}

    class Data:
        def train_dataloader(self, client_id, generator):
            return [(torch.ones(5, 8), torch.zeros(5))]

    objects = workload.Objects(TwoLayers(), Data(), argparse.Namespace(precision="32-true"))
    # 5 samples: forward 2*5*8*8 + 2*5*8*4 = 960; backward: B's input gradient 2*5*4*8 = 320 (A needs it),
    # A's weight gradient 2*5*8*8 = 640, no gradient of B's weight or of the input: 1,920 in all, 384 a sample
    assert workload.flops_per_sample(objects, "c0") == 384
    assert objects.module.a.weight.grad is None  # the gradients are dropped after the count


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


def test_quick_run_prints_the_floor_and_fedlit_rows_with_their_bound(tmp_path: Path) -> None:
    # in the default suite (about half a minute on 2 cores): the benchmark as documented cannot rot unnoticed
    done = run_child(
        [sys.executable, str(PEERS), "--quick", "--accelerator", "cpu", "--task", "vit", "--systems", "floor", "fedlit"]
        + ["--fused", "2", "--peak-fp32", "0.5"],
        cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    number = r"\d+\.\d+"
    flops = float(re.search(r"^vit N=2 32-true: ([\d.e+]+) GFLOP a round", done.stdout, re.M).group(1)) * 1e9
    assert flops > 0 and "(the round's FLOPs / the peak: fp32 0.5 TFLOP/s)" in done.stdout
    for system in ("floor", "fedlit", "fedlit fused 2"):
        found = re.search(
            rf"^\| vit \| 2 \| 32-true \| {system} \| ({number}) \| {number} \| ({number}) \| \d+ \| ",
            done.stdout,
            re.M,
        )
        assert found, done.stdout
        # x bound: seconds a round (as printed, to 0.005 s) over the bound, flops / 0.5e12
        assert abs(float(found.group(2)) * flops / 0.5e12 - float(found.group(1))) <= 0.006
    assert "2 clients, 2 rounds" not in done.stdout and "not measured" in done.stdout
