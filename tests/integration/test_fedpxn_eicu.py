"""The FedPxN paper's eICU benchmark: its recipe holds the authors' settings, every cell of its grid runs two rounds
on a generated folder of the paper's 30 largest hospitals, and without the data the recipe stops with one line."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from fedlit.cli import main
from fedlit.commands.fit import build_parser
from fedlit.commands.grid import load_grid
from fedlit.commands.seeds import split_seeds
from fedlit.data.eicu import PAPER_HOSPITALS, TASKS, mean_over_hospitals
from tests.data.eicu_files import SERIES, STATICS, write_paper_hospitals

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "recipes" / "fedpxn" / "eicu.yaml"
GRID = ROOT / "recipes" / "grids" / "fedpxn_eicu.yaml"
BACKBONE = "--model.init_args.backbone.init_args."
TINY = [
    *(f"{BACKBONE}{k}" if i % 2 == 0 else k for kv in (
        ("series_features", str(SERIES)), ("static_features", str(STATICS)), ("d_model", "8"), ("heads", "2"),
        ("feedforward", "8"), ("fc", "[8]"), ("out_features", "8"),
    ) for i, k in enumerate(kv)),
    "--data.init_args.batch_size", "16", "--data.init_args.max_hours", "6", "--federation.rounds", "2",
    "--federation.progress_bar", "false",
]  # fmt: skip
CELLS = load_grid(GRID).cells()
# The default suite runs every method on the first row and FedPxN on the others; the rest is `-m slow`.
CELL_PARAMS = [
    pytest.param(d, m, id=f"{d}-{m}", marks=() if d == CELLS[0][0] or m == "FedPxN" else pytest.mark.slow)
    for d, m in CELLS
]


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_paper_hospitals(tmp_path_factory.mktemp("eicu"))


def test_the_recipe_has_the_authors_settings():
    cfg = build_parser().parse_args(["fit", "--config", str(RECIPE)]).fit
    model, data, federation = cfg.model.init_args, cfg.data.init_args, cfg.federation
    assert (model.optimizer, model.lr, model.weight_decay) == ("adam", 0.01, 0.0001)
    assert list(model.task_classes) == list(TASKS) and model.tasks is None
    assert model.backbone.init_args.norm == "layer" and model.backbone.init_args.dropout == 0.5
    assert (data.clients_top_k, data.batch_size, data.max_hours) == (5, 256, 25)
    assert (federation.rounds, federation.local_epochs, federation.local_steps) == (100, 1, None)
    assert federation.selection_metric == "auroc" and federation.clients_per_round is None
    assert cfg.strategy.class_path.endswith("FedPxN") and cfg.strategy.init_args.mu == 0.01


def test_the_grid_has_every_method_and_each_k():
    grid = load_grid(GRID)
    assert grid.seeds == [0, 1, 2]
    assert list(grid.datasets) == ["top5", "top10", "top20", "top30", "top5_gn"]
    assert list(grid.methods) == [
        "FedAvg", "FedProx", "FedAdam", "FedAdagrad", "FedYogi", "FedDyn", "SCAFFOLD", "FedBN", "FedPxN",
    ]  # fmt: skip


@pytest.mark.long
@pytest.mark.parametrize(("dataset", "method"), CELL_PARAMS)
def test_each_grid_cell_runs_two_rounds_on_the_generated_folder(dataset, method, folder, tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    grid = load_grid(GRID)
    _, argv = split_seeds(grid.argv(dataset, method, extra=[*TINY, "--data.init_args.root", str(folder)], seeds=[0]))
    out = tmp_path / "run"
    argv[argv.index("--out_dir") + 1] = str(out)
    main(argv)
    results = json.loads((out / "results.json").read_text())
    k = {"top5": 5, "top10": 10, "top20": 20, "top30": 30, "top5_gn": 5}[dataset]
    clients = results["best"]["clients"]
    assert list(clients) == [f"hospital_{h}" for h in PAPER_HOSPITALS[:k]]
    assert results["strategy_class"].split(".")[-1] == method and results["last"]["round"] == 2
    assert set(clients["hospital_73"]) == {*(f"auroc_{t}" for t in TASKS), "auroc", "loss"}
    assert all(math.isfinite(c["loss"]) for c in clients.values())
    manifest = json.loads((out / "manifest.json").read_text())
    top5 = manifest["details"]["test_hospitals"]
    assert top5 == [f"hospital_{h}" for h in PAPER_HOSPITALS[:5]]
    assert 0.0 <= mean_over_hospitals(clients, top5, "auroc") <= 1.0
    norm = json.loads((out / "config.json").read_text())["model"]["init_args"]["backbone"]["init_args"]["norm"]
    assert norm == ("group" if dataset == "top5_gn" else "layer")


def test_without_the_data_the_recipe_stops_with_one_line_naming_the_files_and_the_page(capsys, monkeypatch, tmp_path):
    monkeypatch.chdir(ROOT)  # the recipe's root is relative to the repository root
    root = build_parser().parse_args(["fit", "--config", str(RECIPE)]).fit.data.init_args.root
    if Path(root).is_dir():
        pytest.skip(f"{root} is present: the missing-data message cannot be shown")
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", "recipes/fedpxn/eicu.yaml", "--out_dir", str(tmp_path / "run")])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith(f"fedlit: error: data.init_args.root: no folder {root}. It must hold patient.csv")
    assert "cached_data/<patientunitstayid>.pt" in err and "https://physionet.org/content/eicu-crd/" in err
    assert not (tmp_path / "run").exists()
