"""Checkpoints: written after on_round_end, and a resume refuses a checkpoint of another run, naming what differs."""

from __future__ import annotations

import csv
import io
import json
import os

import pytest
import torch
from lightning.pytorch import Callback

from fedlit import FedAvg, Federation, FedProx, RoleRule
from fedlit.core.errors import CheckpointError, RunDirError
from fedlit.strategies import FedAdam
from fedlit.tasks import ClassificationModule
from tests.conftest import TinyMLP, TinyTabular, make_federation

CKPT = ("checkpoints", "last.ckpt")


class RoundCounter(Callback):
    """Server-side state changed in on_round_end."""

    def __init__(self) -> None:
        self.seen: list[int] = []

    def on_round_end(self, server_round) -> None:
        self.seen.append(server_round)

    def state_dict(self):
        return {"seen": list(self.seen)}

    def load_state_dict(self, state_dict) -> None:
        self.seen = list(state_dict["seen"])


def test_what_on_round_end_changes_is_in_the_checkpoint(tmp_path):
    make_federation(tmp_path, FedAvg(), rounds=2, callbacks=[RoundCounter()]).fit()
    payload = torch.load(tmp_path.joinpath(*CKPT), weights_only=True)
    assert payload["callbacks"]["RoundCounter"] == {"seen": [1, 2]}  # [1] when saved before on_round_end
    resumed = RoundCounter()
    make_federation(tmp_path, FedAvg(), rounds=3, callbacks=[resumed]).fit(ckpt_path=tmp_path.joinpath(*CKPT))
    assert resumed.seen == [1, 2, 3]


@pytest.mark.parametrize(
    "other, expected",
    [
        (lambda: FedAdam(), "the strategy was FedAvg(weighting='num_examples'), now FedAdam("),
        (lambda: FedProx(mu=0.5), "now FedProx("),
    ],
)
def test_resume_with_another_strategy_is_refused_by_name(tmp_path, other, expected):
    make_federation(tmp_path, FedAvg(), rounds=1).fit()
    with pytest.raises(CheckpointError, match="belongs to another run") as err:
        make_federation(tmp_path, other(), rounds=2).fit(ckpt_path=tmp_path.joinpath(*CKPT))
    assert expected in str(err.value)


def test_resume_with_other_strategy_settings_is_refused(tmp_path):
    make_federation(tmp_path, FedProx(mu=0.01), rounds=1).fit()
    with pytest.raises(CheckpointError) as err:
        make_federation(tmp_path, FedProx(mu=0.5), rounds=2).fit(ckpt_path=tmp_path.joinpath(*CKPT))
    assert "the strategy was FedProx(mu=0.01" in str(err.value) and "now FedProx(mu=0.5" in str(err.value)


def test_resume_with_another_model_shape_names_the_tensor(tmp_path):
    make_federation(tmp_path, FedAvg(), rounds=1).fit()
    torch.manual_seed(0)
    module = ClassificationModule(
        backbone=TinyMLP(hidden=16), num_classes=3, lr=0.1, roles=[RoleRule("backbone.*", "shared")]
    )
    wider = Federation(module, TinyTabular(), FedAvg(), rounds=2, out_dir=tmp_path, progress_bar=False)
    with pytest.raises(CheckpointError) as err:
        wider.fit(ckpt_path=tmp_path.joinpath(*CKPT))
    assert "the model's tensors differ" in str(err.value) and "backbone.0.bias [8, 'torch.float32'] -> [16" in str(
        err.value
    )


def config(lr: float, rounds: int) -> dict:
    return {
        "model": {"class_path": "fedlit.tasks.ClassificationModule", "init_args": {"lr": lr}},
        "strategy": {"class_path": "fedlit.strategies.FedAvg"},
        "federation": {"rounds": rounds, "seed": 0},
    }


def test_resume_may_change_rounds_and_records_it_but_not_the_model_settings(tmp_path):
    make_federation(tmp_path, FedAvg(), rounds=1, config=config(0.1, 1)).fit()
    with pytest.raises(CheckpointError, match=r"model\.init_args\.lr \(0\.1 -> 0\.5\)"):
        make_federation(tmp_path, FedAvg(), rounds=2, config=config(0.5, 2)).fit(ckpt_path=tmp_path.joinpath(*CKPT))
    make_federation(tmp_path, FedAvg(), rounds=2, config=config(0.1, 2)).fit(ckpt_path=tmp_path.joinpath(*CKPT))
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["federation"]["rounds"] == 1  # the original configuration...
    assert saved["resumed"] == [{"from_round": 1, "changed": {"federation.rounds": [1, 2]}}]  # ...and the resume


def test_a_checkpoint_with_an_edited_tensor_shape_names_the_file_the_tensor_and_both_shapes(tmp_path):
    make_federation(tmp_path, FedAvg(), rounds=1).fit()
    path = tmp_path.joinpath(*CKPT)
    payload = torch.load(path, weights_only=True)
    payload["strategy"]["global_state"]["backbone.0.weight"] = torch.zeros(33)  # TinyMLP's first layer is [8, 4]
    torch.save(payload, path)
    with pytest.raises(CheckpointError) as err:
        make_federation(tmp_path, FedAvg(), rounds=2).fit(ckpt_path=path)
    assert str(err.value).startswith(
        f"ckpt_path: {path}: tensor strategy.global_state.backbone.0.weight has shape "
        "[33], the model's backbone.0.weight has shape [8, 4]"
    )
    assert "\n" not in str(err.value)


def test_a_metrics_csv_that_is_not_utf8_stops_the_resume_naming_the_byte_and_is_left_as_it_is(tmp_path):
    make_federation(tmp_path, FedAvg(), rounds=1).fit()
    metrics = tmp_path / "metrics.csv"
    header = b"round,client,split,metric,value\r\n"
    assert metrics.read_bytes().startswith(header)
    damaged = header + b"1,c\xe9,train,loss,1.0\r\n" + metrics.read_bytes()[len(header) :]
    metrics.write_bytes(damaged)
    with pytest.raises(RunDirError) as err:
        make_federation(tmp_path, FedAvg(), rounds=2).fit(ckpt_path=tmp_path.joinpath(*CKPT))
    assert str(err.value).startswith(f"{metrics}: not UTF-8 text: byte {len(header) + 3} (line 2) is 0xe9; ")
    assert metrics.read_bytes() == damaged


def test_a_row_cut_by_a_kill_is_dropped_on_resume_and_appends_are_whole_and_synced(tmp_path, monkeypatch):
    make_federation(tmp_path, FedAvg(), rounds=1).fit()
    metrics = tmp_path / "metrics.csv"
    whole = metrics.read_bytes()
    metrics.write_bytes(whole + b"2,c0,train,lo")  # killed while round 2's rows were written
    synced, writes = [], []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: synced.append(fd) or real_fsync(fd))
    with pytest.warns(UserWarning, match=r"metrics\.csv: its last line '2,c0,train,lo' has no newline"):
        make_federation(tmp_path, FedAvg(), rounds=2).fit(ckpt_path=tmp_path.joinpath(*CKPT))
    text = metrics.read_bytes()
    assert text.startswith(whole) and b"lo\r\n" not in text and b"2,c0,train,lo," not in text
    rows = list(csv.reader(io.StringIO(text.decode(), newline="")))
    assert all(len(r) == 5 for r in rows) and {r[0] for r in rows[1:]} == {"1", "2"}
    assert synced  # the rewrite and round 2's rows reached the disk
    from fedlit.engine.records import record

    path = tmp_path / "one.csv"
    monkeypatch.setattr(record, "open", lambda *a, **k: _Counting(open(*a, **k), writes), raising=False)
    record._append(path, [(3, "c0", "train", "loss", 0.5), (3, "", "train", "loss_mean", 0.25)])
    assert writes == [b"3,c0,train,loss,0.5\r\n3,,train,loss_mean,0.25\r\n"]  # one write, whole rows


class _Counting:
    def __init__(self, file, writes):
        self.file, self.writes = file, writes

    def write(self, data):
        self.writes.append(data)
        return self.file.write(data)

    def __getattr__(self, name):
        return getattr(self.file, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.file.close()


def test_a_resume_into_its_folder_that_lost_metrics_csv_is_refused_and_an_empty_one_goes_on(tmp_path):
    make_federation(tmp_path, FedAvg(), rounds=2).fit()
    metrics, ckpt = tmp_path / "metrics.csv", tmp_path.joinpath(*CKPT)
    metrics.unlink()
    with pytest.raises(RunDirError) as err:
        make_federation(tmp_path, FedAvg(), rounds=3).fit(ckpt_path=ckpt)
    assert str(err.value) == (
        f"{metrics} is missing: resuming {ckpt} (round 2) would start a new one at round 3, without the rows of "
        f"rounds 1..2. Restore it from a copy; or, to go on with a metrics.csv of the rounds after 2 only, create "
        f"it empty (touch {metrics}) and resume again."
    )
    assert not metrics.exists()  # refused before anything was written
    metrics.touch()
    make_federation(tmp_path, FedAvg(), rounds=3).fit(ckpt_path=ckpt)
    rows = list(csv.reader(io.StringIO(metrics.read_text(), newline="")))
    assert rows[0] == ["round", "client", "split", "metric", "value"] and {r[0] for r in rows[1:]} == {"3"}


def test_a_resume_into_another_folder_says_where_the_earlier_rows_are(tmp_path):
    make_federation(tmp_path / "a", FedAvg(), rounds=1).fit()
    ckpt = tmp_path.joinpath("a", *CKPT)
    with pytest.warns(UserWarning) as caught:
        make_federation(tmp_path / "b", FedAvg(), rounds=2).fit(ckpt_path=ckpt)
    said = [str(w.message) for w in caught if "metrics.csv" in str(w.message)]
    assert said == [
        f"{tmp_path / 'b' / 'metrics.csv'} starts at round 2: the rows of round 1 are in the metrics.csv of the run "
        f"of {ckpt}."
    ]


def test_a_resume_that_lost_config_json_warns_and_records_it(tmp_path):
    make_federation(tmp_path, FedAvg(), rounds=1, config=config(0.1, 1)).fit()
    (tmp_path / "config.json").unlink()
    with pytest.warns(UserWarning, match=r"config\.json is missing: it is written again from this command's"):
        make_federation(tmp_path, FedAvg(), rounds=2, config=config(0.1, 2)).fit(ckpt_path=tmp_path.joinpath(*CKPT))
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["federation"]["rounds"] == 2  # the command's: the first value (1) is lost
    assert saved["resumed"] == [{"from_round": 1, "config_json_missing": True}]


@pytest.mark.parametrize(("rounds", "where"), [(1, "already past"), (2, "at")])
def test_a_resume_with_rounds_not_above_the_checkpoints_says_so(tmp_path, capsys, rounds, where):
    make_federation(tmp_path, FedAvg(), rounds=2).fit()
    ckpt, metrics = tmp_path.joinpath(*CKPT), (tmp_path / "metrics.csv").read_bytes()
    capsys.readouterr()
    make_federation(tmp_path, FedAvg(), rounds=rounds).fit(ckpt_path=ckpt)
    assert (
        f"Note: {ckpt} is of round 2, {where} federation.rounds={rounds}: no round is run, and its results are "
        "reported again. To train on, resume with --federation.rounds above 2.\n"
    ) in capsys.readouterr().out
    assert (tmp_path / "metrics.csv").read_bytes() == metrics


def test_a_runs_checkpoints_are_written_by_the_writer_thread_and_complete_when_fit_returns(tmp_path, monkeypatch):
    import threading

    from fedlit.core import checkpoint_io
    from fedlit.engine.loop import resume

    writes = []

    def save(path, payload):
        writes.append((threading.current_thread().name, path.name, payload["server_round"]))
        return checkpoint_io.save_checkpoint(path, payload)

    monkeypatch.setattr(resume, "save_checkpoint", save)
    make_federation(tmp_path, FedAvg(), rounds=3, checkpoint_every=2).fit()
    # best.ckpt (rounds whose validation accuracy is the best so far) then last.ckpt (rounds 2 and 3), in order
    lasts = [(thread, r) for thread, name, r in writes if name == "last.ckpt"]
    assert lasts == [("fedlit-checkpoint-writer", 2), ("fedlit-checkpoint-writer", 3)]
    assert {thread for thread, _, _ in writes} == {"fedlit-checkpoint-writer"}
    assert torch.load(tmp_path.joinpath(*CKPT), weights_only=True)["server_round"] == 3
    assert not list(tmp_path.joinpath("checkpoints").glob("*.tmp"))
