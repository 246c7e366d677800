"""Every recipe parses with the real CLI, and names a strategy, a model and data that exist."""

from pathlib import Path

import pytest

from fedlit.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
RECIPES = sorted((ROOT / "recipes").rglob("*.yaml"))

# FLamby's Fed-Heart-Disease benchmark settings (its config_heart_disease.json, fed_heart_disease/common.py and
# benchmarks/fed_benchmark.py): client SGD learning rate, then the strategy's own arguments.
FLAMBY_HEART = {
    "heart_disease_fedavg.yaml": (0.001, {"weighting": "num_examples"}),
    "heart_disease_fedprox.yaml": (0.001, {"mu": 0.01, "weighting": "num_examples"}),
    "flamby_heart/heart_disease_fedadam.yaml": (
        0.01, {"eta": 0.01, "tau": 1e-8, "beta_1": 0.9, "beta_2": 0.999, "bias_correction": False}),
    "flamby_heart/heart_disease_fedyogi.yaml": (0.003162, {"eta": 0.01, "tau": 1e-8, "beta_1": 0.9, "beta_2": 0.999}),
    "flamby_heart/heart_disease_fedadagrad.yaml": (0.003162, {"eta": 0.316228, "tau": 1e-8, "beta_1": 0.9}),
    "flamby_heart/heart_disease_scaffold.yaml": (0.001, {"eta_g": 1.0, "weighting": "num_examples"}),
}


def parse(recipe: Path):
    return build_parser().parse_args(["fit", "--config", str(recipe)]).fit


def test_the_expected_recipes_exist():
    names = {str(p.relative_to(ROOT / "recipes")) for p in RECIPES}
    assert {"quickstart.yaml", "pneumoniamnist_fedavg.yaml", "pneumoniamnist_fedbn.yaml",
            "pneumoniamnist_local.yaml", *FLAMBY_HEART} <= names


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: str(p.relative_to(ROOT / "recipes")))
def test_recipe_parses_and_documents_itself(recipe):
    text = recipe.read_text()
    assert text.startswith("# "), "a recipe starts with a comment saying what it reproduces"
    assert f"fedlit fit --config {recipe.relative_to(ROOT)}" in text, "a recipe says how to run it"
    cfg = parse(recipe)
    assert cfg.model.class_path and cfg.data.class_path and cfg.strategy.class_path
    assert cfg.federation.rounds >= 1


@pytest.mark.parametrize("name", FLAMBY_HEART)
def test_flamby_heart_recipes_use_flambys_settings(name):
    client_lr, strategy_args = FLAMBY_HEART[name]
    cfg = parse(ROOT / "recipes" / name)
    model, data, fed = cfg.model.init_args, cfg.data.init_args, cfg.federation
    assert cfg.model.class_path == "fedlit.tasks.ClassificationModule"
    assert model.backbone.class_path == "fedlit.models.Identity" and model.backbone.init_args.num_features == 13
    assert (model.num_classes, model.task, model.roles) == (1, "binary", None)  # Linear(13, 1), BCE, all trained
    assert (model.optimizer, model.lr, model.momentum, model.weight_decay) == ("sgd", client_lr, 0.0, 0.0)
    assert cfg.data.class_path == "fedlit.data.FedHeartDisease"
    assert (data.batch_size, data.val_fraction, data.normalize) == (4, 0.0, True)
    # FLamby: num_updates 100, rounds (486 // 4 // 4) * 50 // 100 = 15, every client each round, seed 0.
    assert (fed.rounds, fed.local_steps, fed.clients_per_round, fed.seed) == ((486 // 4 // 4) * 50 // 100, 100, None, 0)
    strategy = dict(cfg.strategy.init_args)
    assert {key: strategy.get(key) for key in strategy_args} == strategy_args
    assert strategy.get("weighting", "num_examples") == "num_examples"
