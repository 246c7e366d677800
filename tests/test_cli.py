"""The ``fedlit`` command end to end: quickstart, resume, validate/test, and the errors a new user meets."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.hparams import plugin_data_pb2

from fedlit.cli import main, run
from fedlit.engine.records.run_folder import claim_run_dir
from fedlit.strategies import FedAvg
from tests.engine.records.test_run_folder import killed_run

ROOT = Path(__file__).resolve().parents[1]
QUICK = [
    "--config",
    str(ROOT / "recipes" / "quickstart.yaml"),
    "--federation.progress_bar",
    "false",
    "--data.init_args.samples_per_client",
    "60",
]


def test_quickstart_fit_resume_validate_and_test(tmp_path, capsys):
    out = ["--out_dir", str(tmp_path)]
    first = run(["fit", *QUICK, *out, "--federation.rounds", "2"])
    assert first["last"]["round"] == 2 and len(first["last"]["clients"]) == 4
    # runs line up in TensorBoard's HParams view: a curated set of hparams, final metrics attached
    events = EventAccumulator(str(tmp_path / "tensorboard")).Reload()
    start = plugin_data_pb2.HParamsPluginData.FromString(
        events.PluginTagToContent("hparams")["_hparams_/session_start_info"]
    ).session_start_info
    logged = {k: v.string_value or v.number_value for k, v in start.hparams.items()}
    assert logged == {
        "strategy": "FedBN",
        "strategy.weighting": "num_examples",
        "backbone": "SmallCNN",
        "dataset": "SyntheticImages",
        "partitioner": logged["partitioner"],
        "num_clients": 4,
        "clients_per_round": 4,
        "rounds": 2,
        "local_training": "3 epochs",
        "lr": 0.02,
        "precision": "32-true",
        "seed": 0,
    }
    assert logged["partitioner"] and logged["partitioner"] != "-"
    scalars = events.Tags()["scalars"]
    for when in ("last", "best"):
        assert {f"hparams/{when}/{split}/accuracy_mean" for split in ("val", "test")} <= set(scalars)
    assert events.Scalars("hparams/last/test/accuracy_mean")[-1].value == pytest.approx(
        first["last"]["summary"]["accuracy_mean"]
    )
    # a second fresh run into the same folder is refused before it builds anything; the first run's files stay
    finished = (tmp_path / "results.json").read_text()
    err = error_of(["fit", *QUICK, *out, "--federation.rounds", "2"], capsys)
    assert f"out_dir {tmp_path} already holds a run (results.json, results.md" in err
    assert "resume that run with --ckpt_path last" in err and (tmp_path / "results.json").read_text() == finished
    resumed = run(["fit", *QUICK, *out, "--federation.rounds", "3", "--ckpt_path", "last"])
    assert resumed["last"]["round"] == 3
    assert json.loads((tmp_path / "results.json").read_text())["last"]["round"] == 3
    assert (tmp_path / "checkpoints" / "config.json").is_file()
    assert json.loads((tmp_path / "manifest.json").read_text())["clients"].keys() == first["last"]["clients"].keys()
    validated = run(["validate", *QUICK, *out])
    tested = run(["test", *QUICK, *out])
    assert validated["round"] == tested["round"] == 3
    # the test subcommand reproduces the fit's final test numbers from the checkpoint alone
    assert tested["clients"] == resumed["last"]["clients"] and tested["summary"] == resumed["last"]["summary"]
    assert "| **mean** |" in capsys.readouterr().out
    # test --run DIR: rebuilt from the run's config.json alone, its numbers written into the run
    saved = {name: (tmp_path / name).read_bytes() for name in ("config.json", "manifest.json", "results.json")}
    from_run = run(["test", "--run", str(tmp_path), "--federation.progress_bar", "false"])
    assert from_run["clients"] == resumed["last"]["clients"]
    best = run(["test", "--run", str(tmp_path), "--ckpt_path", "best"])
    assert best["round"] == resumed["best"]["round"] and best["clients"] == resumed["best"]["clients"]
    assert best["summary"] == resumed["best"]["summary"]
    assert json.loads((tmp_path / "evaluations" / "test_last.json").read_text())["clients"] == from_run["clients"]
    assert json.loads((tmp_path / "evaluations" / "test_best.json").read_text())["round"] == best["round"]
    assert {name: (tmp_path / name).read_bytes() for name in saved} == saved


def test_heart_disease_recipe_on_the_real_data(shared_data, tmp_path):
    results = run(
        [
            "fit",
            "--config",
            str(ROOT / "recipes" / "heart_disease_fedavg.yaml"),
            "--data.init_args.root",
            str(shared_data / "heart_disease"),
            "--out_dir",
            str(tmp_path),
            "--federation.rounds",
            "15",
            "--federation.local_steps",
            "100",
            "--federation.progress_bar",
            "false",
        ]
    )
    assert list(results["last"]["clients"]) == ["cleveland", "hungarian", "switzerland", "va"]
    # FLamby's FedAvg on Fed-Heart-Disease reaches about 0.68 mean accuracy over the four centers at this budget
    # (the 2-round model is at chance: 0.52); a broken loader or loop lands far from it.
    summary = results["last"]["summary"]
    assert summary["accuracy_mean"] == pytest.approx(0.678, abs=0.02)
    assert summary["auroc_mean"] > 0.75


def error_of(argv, capsys) -> str:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    return capsys.readouterr().err


@pytest.mark.parametrize(
    "extra, expected",
    [
        (["--federation.roundz", "3"], "federation.roundz is not an option. Did you mean 'rounds'?"),
        (
            ["--model.init_args.lrr", "0.1"],
            "model.init_args.lrr is not an option of fedlit.tasks.ClassificationModule. Did you mean 'lr'?",
        ),
        (["--strategy", "FedAvgg"], "strategy.class_path='FedAvgg' is not a known Strategy. Did you mean 'FedAvg'?"),
        (["--federation.local_epochs", "x"], "federation.local_epochs: expected"),
        (
            ["--federation.optimizer_state", "keep"],
            "federation.optimizer_state: expected typing.Literal['reset', 'persist'], got 'keep'",
        ),
        (["--model.init_args.task", "multi"], "model.init_args.task: expected typing.Literal['multiclass'"),
        (
            ["--model.init_args.backbone.init_args.widht", "8"],
            "model.init_args.backbone.init_args.widht is not an option of fedlit.models.SmallCNN. "
            "Did you mean 'width'?",
        ),
        (
            ["--data.init_args.partitioner", "IID"],
            "data.init_args.partitioner is not an option of fedlit.data.SyntheticImages",
        ),
        (
            ["--strategy", "fedlit.nowhere.FedAvg"],
            "strategy.class_path='fedlit.nowhere.FedAvg': no module named 'fedlit.nowhere'. Check the spelling",
        ),
        (
            ["--strategy.class_path", "fedlit.strategies.FedAvgg"],
            "strategy.class_path='fedlit.strategies.FedAvgg': module fedlit.strategies has no 'FedAvgg'. Did you mean "
            "fedlit.strategies.FedAvg?",
        ),
        (
            ["--strategy", "fedlit.tasks.ClassificationModule"],
            "strategy.class_path='fedlit.tasks.ClassificationModule' is a FederatedModule, not a Strategy",
        ),
        (
            ["--data", "collections.OrderedDict"],
            "data.class_path='collections.OrderedDict' is a class, not a FederatedDataModule",
        ),
    ],
)
def test_bad_input_gets_one_clear_error(extra, expected, capsys, tmp_path):
    err = error_of(["fit", *QUICK, "--out_dir", str(tmp_path), *extra], capsys)
    assert expected in err
    assert "Traceback" not in err and err.count("\n") <= 2


def test_missing_data_folder_names_the_option_and_the_source(capsys, tmp_path):
    err = error_of(
        [
            "fit",
            "--config",
            str(ROOT / "recipes" / "heart_disease_fedavg.yaml"),
            "--data.init_args.root",
            str(tmp_path / "nope"),
            "--out_dir",
            str(tmp_path),
        ],
        capsys,
    )
    assert "data.init_args.root" in err and str(tmp_path / "nope") in err and "archive.ics.uci.edu" in err


def test_dirichlet_alpha_must_be_positive(capsys, shared_data, tmp_path):
    err = error_of(
        [
            "fit",
            "--config",
            str(ROOT / "recipes" / "pneumoniamnist_fedavg.yaml"),
            "--model.init_args.backbone",
            "fedlit.models.SmallCNN",
            "--data.init_args.partitioner.init_args.alpha",
            "0",
            "--out_dir",
            str(tmp_path),
        ],
        capsys,
    )
    assert "data.init_args.partitioner.init_args.alpha must be > 0" in err


def test_more_clients_than_samples(capsys, shared_data, tmp_path):
    err = error_of(
        [
            "fit",
            "--config",
            str(ROOT / "recipes" / "pneumoniamnist_fedavg.yaml"),
            "--model.init_args.backbone",
            "fedlit.models.SmallCNN",
            "--data.init_args.num_clients",
            "6000",
            "--out_dir",
            str(tmp_path),
        ],
        capsys,
    )
    assert "cannot give 6000 clients at least one sample out of 5030" in err
    assert "lower data.init_args.num_clients" in err


def test_resume_without_a_checkpoint_says_what_to_do(capsys, tmp_path):
    err = error_of(["fit", *QUICK, "--out_dir", str(tmp_path), "--ckpt_path", "last"], capsys)
    assert "no checkpoint at" in err and "Run `fedlit fit`" in err


def test_a_run_killed_before_its_first_checkpoint_is_started_again_in_its_folder(capsys, tmp_path):
    out = killed_run(tmp_path / "run")
    argv = [
        "fit",
        *QUICK,
        "--out_dir",
        str(out),
        "--federation.rounds",
        "1",
        "--federation.local_epochs",
        "1",
        "--data.init_args.samples_per_client",
        "20",
    ]
    err = error_of([*argv, "--ckpt_path", "last"], capsys)
    assert (
        f"the run in {out} stopped before its first checkpoint, so there is nothing to resume. Start it again "
        "with `fedlit fit` without --ckpt_path (it takes over that folder)"
    ) in err and err.count("\n") == 1
    with pytest.warns(
        UserWarning, match="stopped before its first checkpoint .*starts it again from round 1 and replaces its files"
    ):
        results = run(argv)
    assert results["last"]["round"] == 1 and (out / "checkpoints" / "last.ckpt").is_file()
    assert json.loads((out / "config.json").read_text())["federation"]["rounds"] == 1  # the new run's files only
    assert "c0,train,loss,0.5" not in (out / "metrics.csv").read_text()
    assert b"killed" not in b"".join(p.read_bytes() for p in (out / "tensorboard").iterdir() if p.is_file())
    # now it has a checkpoint: a fresh run is refused again, before it builds anything
    assert f"out_dir {out} already holds a run" in error_of(argv, capsys)


def test_resume_of_the_newest_run_never_falls_back_to_an_older_one(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    older, newest = Path("runs/quickstart_fedbn/version_0"), Path("runs/quickstart_fedbn/version_1")
    (older / "checkpoints").mkdir(parents=True)
    (older / "checkpoints" / "last.ckpt").write_bytes(b"the older run's checkpoint")
    (older / "results.json").write_text("older results")
    newest.mkdir()
    (newest / "config.json").write_text("{}")  # the newest run stopped before its first checkpoint
    for argv in (["fit", *QUICK, "--ckpt_path", "last"], ["validate", *QUICK], ["test", *QUICK]):
        err = error_of(argv, capsys)
        assert (
            f"the newest run of this name, {newest}, has no checkpoint: it stopped before its first "
            "checkpoint. `last` never falls back to an older run. Pass --out_dir of an older run (the newest "
            f"with one is {older}), or --ckpt_path"
        ) in err
        assert f"`fedlit fit` without --ckpt_path starts the run again (with --out_dir {newest}, in its" in err
    with claim_run_dir(newest, resume=True):
        err = error_of(["fit", *QUICK, "--ckpt_path", "last"], capsys)
        assert f"it is still running (pid {os.getpid()}) and has not saved one yet" in err
    assert (older / "results.json").read_text() == "older results"


def test_runs_get_their_own_version_folders(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    small = [*QUICK, "--federation.local_epochs", "1", "--data.init_args.samples_per_client", "20"]
    tiny = [*small, "--federation.rounds", "1"]
    first, second = run(["fit", *tiny]), run(["fit", *tiny])
    root = Path("runs/quickstart_fedbn")
    assert [p.name for p in sorted(root.iterdir())] == ["version_0", "version_1"]
    assert json.loads((root / "version_0" / "results.json").read_text())["last"] == first["last"]
    assert json.loads((root / "version_1" / "results.json").read_text())["last"] == second["last"]
    capsys.readouterr()
    run(["test", *tiny])  # the newest run's checkpoint
    assert f"out_dir={root / 'version_1'}" in capsys.readouterr().out
    resumed = run(["fit", *small, "--federation.rounds", "2", "--ckpt_path", "last"])
    assert resumed["last"]["round"] == 2
    assert json.loads((root / "version_1" / "results.json").read_text())["last"]["round"] == 2
    assert json.loads((root / "version_0" / "results.json").read_text())["last"]["round"] == 1
    # a run refused while it was being built leaves no empty version folder behind
    assert "federation.rounds=0 must be >= 1" in error_of(["fit", *small, "--federation.rounds", "0"], capsys)
    assert [p.name for p in sorted(root.iterdir())] == ["version_0", "version_1"]


class KeyErrorInAggregate(FedAvg):
    """A custom strategy with a bug: its own traceback must reach the user."""

    def aggregate(self, server_round, updates):
        raise KeyError("num_samples")


def test_a_bug_in_user_code_keeps_its_traceback(tmp_path):
    with pytest.raises(KeyError, match="num_samples") as info:
        main(
            [
                "fit",
                *QUICK,
                "--out_dir",
                str(tmp_path),
                "--federation.rounds",
                "1",
                "--federation.local_epochs",
                "1",
                "--strategy",
                f"{__name__}.KeyErrorInAggregate",
            ]
        )
    assert info.traceback[-1].name == "aggregate" and info.traceback[-1].path == Path(__file__)


def test_a_fedlit_error_while_running_is_one_line(capsys, tmp_path):
    bad = tmp_path / "bad.ckpt"
    bad.write_bytes(b"PK\x03\x04 half a zip file")
    err = error_of(["test", *QUICK, "--ckpt_path", str(bad)], capsys)
    assert f"fedlit: error: ckpt_path: {bad} is not a readable fedlit checkpoint" in err
    assert "truncated or corrupted" in err and "weights_only" not in err and "Traceback" not in err
    assert err.count("\n") == 1


def test_a_model_with_nothing_to_train_is_refused_before_the_folder_holds_a_run(capsys, tmp_path):
    argv = [
        "fit",
        *QUICK,
        "--out_dir",
        str(tmp_path),
        "--federation.rounds",
        "1",
        "--model.init_args.roles",
        '[{pattern: "*", role: frozen}]',
    ]
    err = error_of(argv, capsys)
    assert "fedlit: error: Nothing to train: every parameter is frozen." in err and "model.init_args.roles" in err
    assert err.count("\n") == 1 and list(tmp_path.iterdir()) == []


def test_a_yaml_syntax_error_names_the_file_line_and_column(capsys, tmp_path):
    recipe = tmp_path / "broken.yaml"
    recipe.write_text(
        "model:\n  class_path: fedlit.tasks.ClassificationModule\n  init_args:\n    lr: [0.1\n    num_classes: 3\n"
    )
    err = error_of(["fit", "--config", str(recipe)], capsys)
    assert (
        f"fedlit: error: {recipe} line 5, column 16: expected ',' or ']', but got ':' (while parsing a flow "
        "sequence that starts at line 4, column 9). Fix the YAML syntax of the recipe."
    ) in err
    assert "Traceback" not in err
    err = error_of(["fit", "--config", str(tmp_path / "absent.yaml")], capsys)
    assert f"--config {tmp_path / 'absent.yaml'}: no such file" in err


def test_print_config(capsys):
    with pytest.raises(SystemExit):
        main(["fit", *QUICK, "--print_config"])
    out = capsys.readouterr().out
    assert "class_path: fedlit.data.SyntheticImages" in out and "rounds: 10" in out


def test_the_same_recipe_gives_the_same_numbers_twice(tmp_path):
    args = [*QUICK, "--federation.rounds", "1"]
    first = run(["fit", *args, "--out_dir", str(tmp_path / "a")])
    second = run(["fit", *args, "--out_dir", str(tmp_path / "b")])
    assert first["last"] == second["last"]


def test_run_names_and_versions(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    tiny = [
        *QUICK,
        "--federation.local_epochs",
        "1",
        "--data.init_args.samples_per_client",
        "20",
        "--federation.rounds",
        "1",
    ]
    run(["fit", *tiny, "--strategy", "FedProx"])
    assert (tmp_path / "runs/quickstart_fedprox/version_0/results.json").is_file()
    run(["fit", *tiny, "--version", "4"])
    run(["fit", *tiny, "--name", "mine", "--version", "baseline"])
    assert sorted(str(p.relative_to("runs")) for p in Path("runs").glob("*/*")) == [
        "mine/baseline",
        "quickstart_fedbn/version_4",
        "quickstart_fedprox/version_0",
    ]
    err = error_of(["fit", *tiny, "--version", "4"], capsys)
    assert f"out_dir {Path('runs/quickstart_fedbn/version_4')} already holds a run" in err
    assert "resume that run with --ckpt_path last" in err
    capsys.readouterr()
    run(["test", *tiny, "--name", "mine", "--version", "baseline"])
    assert f"out_dir={Path('runs/mine/baseline')}" in capsys.readouterr().out
    run(["test", *tiny])  # the newest run of the name quickstart_fedbn
    assert f"out_dir={Path('runs/quickstart_fedbn/version_4')}" in capsys.readouterr().out
    assert "--name 'a/b' is not a folder name" in error_of(["fit", *tiny, "--name", "a/b"], capsys)
    assert "give one of them" in error_of(["fit", *tiny, "--version", "1", "--out_dir", "x"], capsys)
    assert "--ckpt_path best is for validate and test" in error_of(["fit", *tiny, "--ckpt_path", "best"], capsys)
    err = error_of(["test", "--run", str(tmp_path / "nowhere")], capsys)
    assert "no config.json there" in err


def test_other_loggers_replace_tensorboard(tmp_path):
    loggers = f"[{{class_path: lightning.fabric.loggers.CSVLogger, init_args: {{root_dir: {tmp_path / 'csv'}}}}}]"
    run(
        [
            "fit",
            *QUICK,
            "--out_dir",
            str(tmp_path / "run"),
            "--federation.rounds",
            "1",
            "--federation.local_epochs",
            "1",
            "--federation.loggers",
            loggers,
        ]
    )
    assert not (tmp_path / "run" / "tensorboard").exists() and (tmp_path / "run" / "metrics.csv").is_file()
    header = (tmp_path / "csv" / "lightning_logs" / "version_0" / "metrics.csv").read_text().splitlines()[0]
    assert "server/val/accuracy_mean" in header and "hparams/last/test/accuracy_mean" in header


@pytest.mark.parametrize(
    "recipe, expected",
    [
        (
            "federation:\n  roundz 3\n",
            "federation: expected a mapping of options (`key: value` lines), got 'roundz 3': a "
            "key without ':', or a misspelled one. Did you mean 'rounds: <value>'? Valid "
            "options: rounds, ",
        ),
        (
            "model:\n  class_path: fedlit.tasks.ClassificationModule\n  init_args:\n    lrr 0.1\n",
            "model.init_args: expected a mapping of options (`key: value` lines), got 'lrr 0.1': a key without ':', "
            "or a misspelled one. Did you mean 'lr: <value>'? Valid options of fedlit.tasks.ClassificationModule: "
            "backbone, ",
        ),
        (
            "- model\n- data\n",
            "--config: the recipe is not a mapping of sections: it reads as '- model\\n- data'. A "
            "recipe is YAML whose top-level keys are sections (config, model, data, ",
        ),
        ("", "--config: the recipe is empty. "),
        ("federation:\n  roundz: 3\n", "federation.roundz is not an option. Did you mean 'rounds'?"),
    ],
)
def test_a_recipe_that_is_not_a_mapping_names_the_section_and_the_close_key(recipe, expected, capsys, tmp_path):
    path = tmp_path / "recipe.yaml"
    path.write_text(recipe)
    err = error_of(["fit", "--config", str(path), "--out_dir", str(tmp_path / "out")], capsys)
    assert err.startswith(f"fedlit: error: {expected}")
    assert "fedlit fit --print_config" in err or "Valid options" in err
    assert err.count("\n") == 1 and "Unexpected config" not in err and "Unable to load" not in err


@pytest.mark.parametrize("out_dir", ["given/a/b", None])
def test_a_run_refused_at_setup_leaves_no_folder_it_made(out_dir, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "kept").mkdir()  # an empty folder the run did not make stays
    where = ["--out_dir", out_dir] if out_dir else []
    err = error_of(["fit", *QUICK, "--federation.min_clients", "99", *where], capsys)
    assert "federation.min_clients=99" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kept"]  # no given/, no runs/quickstart_fedbn/
    (tmp_path / "given").mkdir()
    error_of(["fit", *QUICK, "--federation.min_clients", "99", "--out_dir", "given/a/b"], capsys)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["given", "kept"]  # it existed before the run


def test_fit_help_shows_each_federation_setting_with_its_declared_help(capsys):
    from dataclasses import fields

    from fedlit.engine.loop.settings import Settings

    with pytest.raises(SystemExit):
        main(["fit", "--help"])
    shown = "".join(capsys.readouterr().out.split())  # argparse wraps the help: compare without whitespace
    assert "--federation.roundsROUNDSNumberofserverroundsR.(type:int,default:10)" in shown
    for declared in fields(Settings):
        assert f"--federation.{declared.name}" in shown
        assert "".join(declared.metadata["doc"].split()) in shown, declared.name
