"""What a run records: metrics.csv (per round, continued on resume), best.ckpt, the run's description, HParams."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import numpy as np
import pytest
import torch
from lightning.pytorch import Callback

from fedlit.engine.records.hparams import hparams
from fedlit.engine.records.record import git_state
from fedlit.strategies import FedAvg, FedProx
from tests.children import run_child
from tests.conftest import TinyTabular, make_federation

ROOT = Path(__file__).resolve().parents[2]


def read_csv(path):
    with open(path, newline="") as file:
        return list(csv.DictReader(file))


class Killed(RuntimeError):
    pass


class KillAtRoundEnd(Callback):
    """Stops the run in ``on_round_end`` of one round: after its metrics.csv rows, before its checkpoint."""

    def __init__(self, at: int) -> None:
        self.at = at

    def on_round_end(self, trainer, pl_module, server_round, metrics) -> None:
        if server_round == self.at:
            raise Killed(f"killed in round {server_round}")


def test_metrics_csv_rows_match_the_results_and_a_resume_continues_the_same_file(tmp_path):
    straight = make_federation(tmp_path / "straight", FedAvg(), rounds=3)
    results = straight.fit()
    rows = read_csv(tmp_path / "straight" / "metrics.csv")
    assert list(rows[0]) == ["round", "client", "split", "metric", "value"]
    assert sorted({r["round"] for r in rows}) == ["1", "2", "3"]
    # every client's test metrics of the last round are those of the final results
    last = {(r["client"], r["metric"]): float(r["value"]) for r in rows if r["round"] == "3" and r["split"] == "test"}
    for client, values in results["last"]["clients"].items():
        assert {m: last[(client, m)] for m in values} == values
    assert last[("", "accuracy_mean")] == results["last"]["summary"]["accuracy_mean"]
    # per-round traffic on server rows adds up to the run's totals
    for key in ("upload_bytes", "download_bytes", "eval_download_bytes"):
        per_round = [int(r["value"]) for r in rows if r["split"] == "comm" and r["metric"] == key]
        assert len(per_round) == 3 and sum(per_round) == results["comm"][key] > 0
    assert {r["client"] for r in rows if r["split"] == "train"} == {"c0", "c1", "c2", ""}  # "": loss_mean
    assert {r["client"] for r in rows if r["split"] == "val"} == {"c0", "c1", "c2", ""}
    assert all(float(r["value"]) > 0 for r in rows if r["metric"] == "round_seconds")

    # killed after round 3 had written its rows but before its checkpoint (round 2, checkpoint_every=2)
    folder = tmp_path / "resumed"
    with pytest.raises(Killed):
        make_federation(folder, FedAvg(), rounds=3, checkpoint_every=2, callbacks=[KillAtRoundEnd(3)]).fit()
    assert {r["round"] for r in read_csv(folder / "metrics.csv")} == {"1", "2", "3"}
    make_federation(folder, FedAvg(), rounds=3).fit(ckpt_path=folder / "checkpoints" / "last.ckpt")
    resumed = read_csv(folder / "metrics.csv")

    def timeless(table):  # seconds and memory differ between runs; everything else is the same computation
        return [r for r in table if r["split"] != "system"]

    assert timeless(resumed) == timeless(rows)


def test_best_ckpt_holds_the_best_validation_round_and_reproduces_its_numbers(tmp_path):
    fed = make_federation(tmp_path, FedProx(mu=0.01), rounds=4)
    results = fed.fit()
    best = json.loads((tmp_path / "results.json").read_text())["best"]
    assert results["checkpoints"] == {
        "last": "checkpoints/last.ckpt",
        "best": "checkpoints/best.ckpt",
        "best_round": best["round"],
    }
    saved = torch.load(tmp_path / "checkpoints" / "best.ckpt", weights_only=True)
    assert saved["server_round"] == best["round"]
    # the best round by hand: highest mean validation accuracy over the clients, earliest on ties
    means = {r: np.mean([m["accuracy"] for m in v["val"].values()]) for r, v in fed.history.rounds.items()}
    assert best["round"] == min(r for r in means if means[r] == max(means.values()))
    assert best["round"] < 4  # the best round is not the last: best.ckpt differs from last.ckpt
    again = make_federation(tmp_path, FedProx(mu=0.01), rounds=4).evaluate(
        "test", tmp_path / "checkpoints" / "best.ckpt"
    )
    assert again["round"] == best["round"] and again["clients"] == best["clients"]
    assert again["summary"] == best["summary"]
    written = json.loads((tmp_path / "evaluations" / "test_best.json").read_text())
    assert written["clients"] == best["clients"] and written["checkpoint"].endswith("best.ckpt")


class NoValidation(TinyTabular):
    def build(self):
        data = super().build()
        for splits in data.splits.values():
            splits["val"] = splits["val"][:0]
        return data


def test_without_a_validation_split_there_is_no_best_ckpt(tmp_path):
    from fedlit import Federation, RoleRule
    from fedlit.tasks import ClassificationModule
    from tests.conftest import TinyMLP

    torch.manual_seed(0)
    module = ClassificationModule(backbone=TinyMLP(), num_classes=3, lr=0.1, roles=[RoleRule("backbone.*", "shared")])
    results = Federation(module, NoValidation(), FedAvg(), rounds=2, out_dir=tmp_path, progress_bar=False).fit()
    assert "best" not in results and not (tmp_path / "checkpoints" / "best.ckpt").exists()
    assert results["checkpoints"]["best"] is None
    assert results["checkpoints"]["why_no_best"].startswith("no validation split")
    assert "no best.ckpt" in (tmp_path / "results.md").read_text()


def test_results_describe_the_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # not a git checkout
    results = make_federation(tmp_path / "run", FedProx(mu=0.5), rounds=1, seed=3).fit()
    assert results["strategy"] == "FedProx(mu=0.5, weighting='num_examples')"
    assert results["strategy_class"] == "fedlit.strategies.fedprox.FedProx"
    assert results["seed"] == 3 and results["fedlit_version"] == "0.1.0" and results["git"] is None
    started, ended = (datetime.fromisoformat(results[k]) for k in ("started", "ended"))
    assert started.utcoffset().total_seconds() == 0 and started <= ended
    assert 0 < results["wall_seconds"] <= (ended - started).total_seconds() + 1


def test_git_state_of_a_checkout(tmp_path):
    assert git_state(tmp_path) is None
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(tmp_path)]
    if subprocess.run([*git, "init", "-q"], capture_output=True).returncode != 0:
        pytest.skip("git is not usable here")
    (tmp_path / "a.txt").write_text("one")
    subprocess.run([*git, "add", "a.txt"], check=True)
    subprocess.run([*git, "commit", "-qm", "first"], check=True)
    head = (tmp_path / ".git" / "refs" / "heads").iterdir().__next__().read_text().strip()
    assert git_state(tmp_path) == {"commit": head, "dirty": False}
    (tmp_path / "a.txt").write_text("two")
    assert git_state(tmp_path) == {"commit": head, "dirty": True}


def test_hparams_are_a_curated_set(tmp_path):
    fed = make_federation(tmp_path, FedProx(mu=0.25), rounds=2, local_steps=5, clients_per_round=2)
    fed.setup()
    assert hparams(fed) == {
        "strategy": "FedProx",
        "strategy.mu": 0.25,
        "strategy.weighting": "num_examples",
        "backbone": "Sequential",
        "dataset": "TinyTabular",
        "partitioner": "natural",
        "num_clients": 3,
        "clients_per_round": 2,
        "rounds": 2,
        "local_training": "5 steps",
        "lr": 0.1,
        "precision": "32-true",
        "seed": 0,
    }


class SigkillAtRoundEnd(Callback):
    """Kills its own process (SIGKILL: no cleanup at all) in ``on_round_end`` of one round."""

    def __init__(self, at: int) -> None:
        self.at = at

    def on_round_end(self, trainer, pl_module, server_round, metrics) -> None:
        if server_round == self.at:
            os.kill(os.getpid(), signal.SIGKILL)


def test_a_killed_run_keeps_its_rows_and_its_resume_writes_each_round_once(tmp_path):
    from fedlit.cli import run

    args = [
        "--config",
        str(ROOT / "recipes" / "quickstart.yaml"),
        "--federation.progress_bar",
        "false",
        "--data.init_args.samples_per_client",
        "20",
        "--federation.local_epochs",
        "1",
        "--federation.rounds",
        "3",
    ]
    straight = run(["fit", *args, "--out_dir", str(tmp_path / "straight")])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    # killed in round 3 after its rows were written, before its checkpoint (checkpoint_every=2: round 2's is kept)
    folder = tmp_path / "killed"
    killer = f"[{{class_path: {__name__}.SigkillAtRoundEnd, init_args: {{at: 3}}}}]"
    done = run_child(
        [
            sys.executable,
            "-m",
            "fedlit",
            "fit",
            *args,
            "--out_dir",
            str(folder),
            "--callbacks",
            killer,
            "--federation.checkpoint_every",
            "2",
        ],
        env=env,
        cwd=ROOT,
        text=False,
    )
    assert done.returncode == -signal.SIGKILL, done.stderr.decode()[-2000:]
    assert {r["round"] for r in read_csv(folder / "metrics.csv")} == {"1", "2", "3"}
    resumed = run(["fit", *args, "--out_dir", str(folder), "--ckpt_path", "last"])
    assert resumed["last"] == straight["last"] and resumed["best"] == straight["best"]

    def timeless(path):
        return [r for r in read_csv(path) if r["split"] != "system"]

    assert timeless(folder / "metrics.csv") == timeless(tmp_path / "straight" / "metrics.csv")
    best = torch.load(folder / "checkpoints" / "best.ckpt", weights_only=True)["server_round"]
    assert best == straight["best"]["round"]
