"""``fedlit fit --seeds``: one run per seed under one experiment folder, each the same as a plain run of that seed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fedlit.cli import main, run
from fedlit.commands.seeds import split_seeds

ROOT = Path(__file__).resolve().parents[2]
ARGS = [
    "--config",
    str(ROOT / "recipes" / "quickstart.yaml"),
    "--federation.progress_bar",
    "false",
    "--data.init_args.samples_per_client",
    "20",
    "--federation.local_epochs",
    "1",
    "--federation.rounds",
    "2",
]


def test_each_seed_is_its_own_run_and_reproduces_a_plain_run_of_that_seed(tmp_path):
    results = run(["fit", *ARGS, "--seeds", "0", "1", "--out_dir", str(tmp_path / "exp")])
    assert sorted(results) == [0, 1]
    for seed in (0, 1):
        config = json.loads((tmp_path / "exp" / f"seed_{seed}" / "config.json").read_text())
        assert config["federation"]["seed"] == seed and config["data"]["init_args"]["seed"] == seed
    plain = run(
        ["fit", *ARGS, "--federation.seed", "1", "--data.init_args.seed", "1", "--out_dir", str(tmp_path / "plain")]
    )
    assert results[1]["last"] == plain["last"]
    assert results[0]["last"] != plain["last"]  # the seed matters: seed 0 is another run
    saved = json.loads((tmp_path / "exp" / "seed_1" / "results.json").read_text())
    assert saved["last"] == json.loads((tmp_path / "plain" / "results.json").read_text())["last"]
    experiment = json.loads((tmp_path / "exp" / "experiment.json").read_text())
    assert experiment["seeds"] == [0, 1] and experiment["finished"] == [0, 1]
    assert experiment["runs"] == {"0": str(tmp_path / "exp" / "seed_0"), "1": str(tmp_path / "exp" / "seed_1")}
    assert "--seeds 0 1" in experiment["command"]


def test_without_out_dir_the_seeds_share_one_version_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    run(["fit", *ARGS, "--federation.rounds", "1", "--seeds", "3", "--name", "exp"])
    assert sorted(p.name for p in (tmp_path / "runs" / "exp" / "version_0").iterdir()) == ["experiment.json", "seed_3"]
    assert (tmp_path / "runs" / "exp" / "version_0" / "seed_3" / "results.json").is_file()


def test_split_seeds():
    assert split_seeds(["fit", "--seeds", "2", "0", "--x", "1"]) == ([2, 0], ["fit", "--x", "1"])
    assert split_seeds(["fit", "--seeds=[1,2]"]) == ([1, 2], ["fit"])


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--seeds", "0", "1", "0"], "seed 0 is given twice"),
        (["--seeds", "0", "--ckpt_path", "best"], "--seeds with --ckpt_path best"),
        (["--seeds", "0", "--dry_run"], "--seeds with --dry_run"),
        (["--seeds", "a"], "seeds are integers"),
        (["--seeds"], "at least one seed"),
        (["--seeds", "0", "--federation.seed", "4"], "leave out --federation.seed"),
        (["--seeds", "0", "1", "--federation.devices", "2"], "Start one command per seed"),
        (["--seeds", "0", "--seeds_vary", "data"], "seeds_vary"),
    ],
)
def test_bad_seeds_are_one_line_errors(tmp_path, capsys, extra, message):
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", *ARGS, "--out_dir", str(tmp_path / "exp"), *extra])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
    assert not (tmp_path / "exp").exists()


def test_seeds_vary_training_keeps_the_recipes_data_split(tmp_path):
    # quickstart.yaml gives data.init_args.seed 0; --data.init_args.seed 5 stands for a recipe's own data seed
    results = run(
        [
            "fit",
            *ARGS,
            "--data.init_args.seed",
            "5",
            "--seeds",
            "1",
            "2",
            "--seeds_vary",
            "training",
            "--out_dir",
            str(tmp_path / "exp"),
        ]
    )
    runs = {s: tmp_path / "exp" / f"seed_{s}" for s in (1, 2)}
    for seed, folder in runs.items():
        config = json.loads((folder / "config.json").read_text())
        assert config["federation"]["seed"] == seed and config["data"]["init_args"]["seed"] == 5
        assert "seeds_vary" not in config
    manifests = [json.loads((runs[s] / "manifest.json").read_text()) for s in (1, 2)]
    assert manifests[0]["clients"] == manifests[1]["clients"]  # one split, trained twice
    assert results[1]["last"] != results[2]["last"]  # the training differs
    experiment = json.loads((tmp_path / "exp" / "experiment.json").read_text())
    assert experiment["seeds_vary"] == "training" and experiment["finished"] == [1, 2]
    drawn = run(["fit", *ARGS, "--seeds", "1", "2", "--out_dir", str(tmp_path / "all")])
    assert sorted(drawn) == [1, 2]
    assert json.loads((tmp_path / "all" / "experiment.json").read_text())["seeds_vary"] == "all"
    split = [json.loads((tmp_path / "all" / f"seed_{s}" / "manifest.json").read_text())["clients"] for s in (1, 2)]
    assert split[0] != split[1]  # each seed re-draws the split


def test_seeds_vary_without_seeds_is_refused(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", *ARGS, "--out_dir", str(tmp_path / "run"), "--seeds_vary", "training"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert "--seeds_vary training without --seeds" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "run").exists()
