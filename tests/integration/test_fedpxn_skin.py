"""The FedPxN paper's skin cancer benchmark: its recipe holds the paper's settings, every cell of its grid (nine
strategies, BatchNorm and GroupNorm) runs two rounds on tiny copies of the publishers' files, and without the
data the recipe stops with one line naming the layout and the download pages."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from fedlit.cli import main
from fedlit.commands.fit import build_parser
from fedlit.commands.grid import load_grid
from fedlit.commands.seeds import split_seeds
from tests.data.skin_layouts import write_sources

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "recipes" / "fedpxn" / "skin.yaml"
GRID = ROOT / "recipes" / "grids" / "fedpxn_skin.yaml"
SITES = ["barcelona", "rosendahl", "vienna", "pad_ufes_20", "derm7pt"]
METHODS = ["FedAvg", "FedProx", "FedAdam", "FedAdagrad", "FedYogi", "FedDyn", "SCAFFOLD", "FedBN", "FedPxN"]


def test_the_recipe_holds_the_papers_settings():
    cfg = build_parser().parse_args(["fit", "--config", str(RECIPE)]).fit
    model, data, federation = cfg.model.init_args, cfg.data.init_args, cfg.federation
    assert cfg.data.class_path == "fedlit.data.SkinSources" and data.root == "../shared/data/skin_cancer"
    assert (data.image_size, data.batch_size, tuple(data.split_fractions)) == (256, 128, (0.7, 0.15, 0.15))
    assert model.backbone.class_path == "fedlit.models.EfficientNetB0" and model.backbone.init_args.norm == "batch"
    assert (model.num_classes, model.task, model.optimizer, model.lr, model.weight_decay) == (
        8,
        "multiclass",
        "adam",
        0.001,
        0.0001,
    )
    assert federation.rounds * federation.local_epochs == 300 and federation.clients_per_round is None
    assert federation.selection_metric == "auroc"
    assert cfg.strategy.class_path.endswith("FedPxN") and cfg.strategy.init_args.mu == 0.01


def test_the_grid_has_the_nine_methods_on_batch_and_group_norm_over_three_seeds(monkeypatch):
    monkeypatch.chdir(ROOT)
    grid = load_grid(GRID)
    assert grid.seeds == [0, 1, 2] and list(grid.datasets) == ["skin_bn", "skin_gn"] and list(grid.methods) == METHODS
    for dataset, method in grid.cells():
        cfg = build_parser().parse_args(split_seeds(grid.argv(dataset, method))[1]).fit
        assert cfg.strategy.class_path.split(".")[-1] == method
        assert cfg.model.init_args.backbone.init_args.norm == {"skin_bn": "batch", "skin_gn": "group"}[dataset]
        assert cfg.model.init_args.optimizer == ("sgd" if method == "SCAFFOLD" else "adam")


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> Path:
    return write_sources(tmp_path_factory.mktemp("skin"))  # 10 images per site: 7 / 2 / 1


# EfficientNet-B0 is slow on a CPU: 16x16 images, one local step of 8 images per round
TINY = [
    "--data.init_args.image_size",
    "16",
    "--data.init_args.batch_size",
    "8",
    "--data.init_args.num_workers",
    "0",
    "--federation.rounds",
    "2",
    "--federation.local_steps",
    "1",
]


@pytest.mark.long
@pytest.mark.parametrize(
    ("dataset", "method"),
    # Every method with BatchNorm and FedPxN with GroupNorm in the default suite; the rest is `-m slow`.
    [
        pytest.param(d, m, marks=() if d == "skin_bn" or m == "FedPxN" else pytest.mark.slow)
        for d in ("skin_bn", "skin_gn")
        for m in METHODS
    ],
)
def test_each_grid_cell_runs_two_rounds_on_the_generated_layout(dataset, method, sources, tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    grid = load_grid(GRID)
    _, argv = split_seeds(grid.argv(dataset, method))  # one seed: the cell's settings, not its three runs
    argv = argv[: argv.index("--out_dir")]
    main([*argv, "--data.init_args.root", str(sources), *TINY, "--out_dir", str(tmp_path / "run")])
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["last"]["round"] == 2 and sorted(results["last"]["clients"]) == sorted(SITES)
    for metrics in results["last"]["clients"].values():
        assert {"auroc", "auprc", "loss"} <= set(metrics) and math.isfinite(metrics["loss"])


def test_without_the_data_the_recipe_stops_with_one_line_naming_the_layout(capsys, monkeypatch, tmp_path):
    monkeypatch.chdir(ROOT)  # the recipe's root is relative to the repository root
    if Path("../shared/data/skin_cancer").exists():
        pytest.skip("../shared/data/skin_cancer is present: the missing-data message cannot be shown")
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", "recipes/fedpxn/skin.yaml", "--out_dir", str(tmp_path / "run")])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith(
        "fedlit: error: data.init_args.root: no folder ../shared/data/skin_cancer. It must hold ISIC_2019/ "
        "(ISIC_2019_Training_GroundTruth.csv, ISIC_2019_Training_Metadata.csv, ISIC_2019_Training_Input/; "
        "https://challenge.isic-archive.com/data/#2019) and HAM10000/ (HAM10000_metadata.csv, "
    )
    for page in (
        "https://doi.org/10.7910/DVN/DBW86T",
        "https://data.mendeley.com/datasets/zr7vgbcyr2/1",
        "https://derm.cs.sfu.ca/",
        "https://github.com/owkin/FLamby",
    ):
        assert page in err
    assert not (tmp_path / "run").exists()
