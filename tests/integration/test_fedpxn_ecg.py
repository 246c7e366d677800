"""The FedPxN paper's ECG benchmark: its recipe's settings, every cell of its grid for two rounds on a generated
challenge layout, and one line when the data is absent."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from fedlit.cli import main, run
from fedlit.commands.fit import build_parser
from fedlit.commands.grid import load_grid
from tests.data.cinc2021_files import write_layout

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "recipes" / "fedpxn" / "ecg.yaml"
GRID = ROOT / "recipes" / "grids" / "fedpxn_ecg.yaml"
CLIENTS = ["chapman_shaoxing", "cpsc_2018", "georgia", "ningbo", "ptb-xl"]
METHODS = ["FedAvg", "FedProx", "FedAdam", "FedAdagrad", "FedYogi", "FedDyn", "SCAFFOLD", "FedBN", "FedPxN"]
# A backbone of a few hundred weights and 1-s segments: the pipeline, not the paper's sizes.
TINY = [
    "--data.init_args.seconds",
    "1",
    "--data.init_args.batch_size",
    "4",
    "--model.init_args.backbone.init_args.stem_width",
    "4",
    "--model.init_args.backbone.init_args.widths",
    "[4]",
    "--model.init_args.backbone.init_args.expansion",
    "2",
    "--model.init_args.backbone.init_args.se_reduction",
    "2",
    "--model.init_args.backbone.init_args.kernel_size",
    "3",
    "--federation.rounds",
    "2",
    "--federation.progress_bar",
    "false",
]


def test_the_recipe_holds_the_papers_settings():
    cfg = build_parser().parse_args(["fit", "--config", str(RECIPE)]).fit
    model, data = cfg.model.init_args, cfg.data.init_args
    assert (cfg.data.class_path, data.root, data.batch_size) == ("fedlit.data.CinC2021", "../shared/data/cinc2021", 64)
    assert (model.task, model.num_classes, model.backbone.class_path) == ("multilabel", 26, "fedlit.models.ResNet1dSE")
    assert model.backbone.init_args.norm == "batch" and model.extra_metrics == ["cinc2021"]
    assert (model.loss, dict(model.loss_options)) == ("asymmetric", {"gamma_neg": 0.2, "gamma_pos": 0.0, "clip": 0.05})
    optimizer = model.optimizer
    assert optimizer.class_path == "torch.optim.AdamW"
    adamw = optimizer.init_args
    assert (adamw.lr, adamw.weight_decay, adamw.amsgrad) == (0.001, 0.01, True)
    assert (cfg.strategy.class_path, cfg.strategy.init_args.mu) == ("fedlit.strategies.FedPxN", 0.01)
    federation = cfg.federation
    assert (federation.rounds, federation.local_epochs, federation.selection_metric) == (200, 1, "cinc2021")


def test_the_grid_has_the_papers_nine_methods_over_three_seeds():
    grid = load_grid(GRID)
    assert list(grid.datasets) == ["ecg"] and list(grid.methods) == METHODS and grid.seeds == [0, 1, 2]


@pytest.mark.parametrize("method", METHODS)
def test_every_grid_cell_runs_two_rounds_on_a_generated_layout(method, tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    root = write_layout(tmp_path / "training", records=5, seconds=2.0)
    grid = load_grid(GRID)
    argv = grid.argv("ecg", method)
    argv = argv[: argv.index("--seeds")]  # one seed here
    results = run([*argv, *TINY, "--data.init_args.root", str(root), "--out_dir", str(tmp_path / "run")])
    assert results["selection_metric"] == "cinc2021" and results["last"]["round"] == 2
    assert sorted(results["last"]["clients"]) == CLIENTS
    scores = [client["cinc2021"] for client in results["last"]["clients"].values()]
    assert all(math.isfinite(s) and s <= 1.0 for s in scores)
    assert results["best"]["round"] in (1, 2) and results["higher_is_better"]["cinc2021"] is True


def test_without_the_data_stops_with_one_line_naming_layout_and_page(capsys, monkeypatch, tmp_path):
    monkeypatch.chdir(ROOT)  # the recipe's paths are relative to the repository root
    if Path("../shared/data/cinc2021").is_dir():
        pytest.skip("../shared/data/cinc2021 is present: the missing-data message cannot be shown")
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", "recipes/fedpxn/ecg.yaml", "--out_dir", str(tmp_path / "run")])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith("fedlit: error: data.init_args.root: no folder ../shared/data/cinc2021. It must hold ")
    assert "chapman_shaoxing, cpsc_2018, cpsc_2018_extra, georgia, ningbo, ptb-xl" in err
    assert "https://physionet.org/content/challenge-2021/" in err
    assert not (tmp_path / "run").exists()
