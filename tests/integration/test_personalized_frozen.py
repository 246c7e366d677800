"""The frozen setting of benchmarks/personalized_synthetic.py: its ViT pretrained by benchmarks/synthetic_pretrain.py
loads through the recipe's checkpoint_path, and EPFL runs on it (LoRA A travels, B and the head stay personal)."""

import importlib.util
import json
import warnings
from pathlib import Path

import torch

from fedlit.cli import run

ROOT = Path(__file__).resolve().parents[2]
RECIPES = ROOT / "recipes" / "personalized_partitions"


def load_script(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_pretrained_backbone_loads_and_epfl_runs_one_round(tmp_path):
    checkpoint = tmp_path / "vit.pt"
    load_script("synthetic_pretrain").pretrain(checkpoint, steps=2, sites=2, per_site=300, batch_size=8)
    saved = torch.load(checkpoint)
    assert "blocks.0.attn.qkv.weight" in saved and not any(k.startswith("head") for k in saved)
    bench = load_script("personalized_synthetic")
    assert "EPFL" not in bench.FROZEN_SKIPPED and "epfl" in bench.FROZEN_METHODS
    args = bench.recipe_args("epfl", "frozen", checkpoint)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        results = run(
            [
                "fit",
                *args,
                "--data.init_args.samples_per_client",
                "40",
                "--federation.rounds",
                "1",
                "--federation.local_steps",
                "1",
                "--out_dir",
                str(tmp_path / "run"),
            ]
        )
    assert not [w for w in caught if "randomly initialized" in str(w.message)]
    config = json.loads(next((tmp_path / "run").rglob("config.json")).read_text())
    assert config["model"]["init_args"]["backbone"]["init_args"]["checkpoint_path"] == str(checkpoint)
    assert results["last"]["round"] == 1 and len(results["last"]["clients"]) == 6
    # Down: each client's LoRA A mix, 4 blocks x (q, v) x 8 x 64 float32; up: A and B (the B of the distances).
    a_bytes = 4 * 2 * 8 * 64 * 4
    assert results["comm"]["download_bytes"] == 6 * a_bytes and results["comm"]["upload_bytes"] == 6 * 2 * a_bytes
