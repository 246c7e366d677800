"""The FedSCA recipes through the CLI: the paper's ViT-B costs (36x less upload than FedAvg on the adapters), the
flagship recipe's message when its data is absent, and the same recipe on the real slice samples with the tiny SAM."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fedlit import cli

ROOT = Path(__file__).resolve().parents[1]
PROSTATE = str(ROOT / "recipes" / "fedsca_prostate.yaml")
NET = "--model.init_args.network.init_args."
# One Medical-SAM-Adapter adapter on ViT-B (width 768): Linear(768, 192) and Linear(192, 768) with biases.
ADAPTER = 768 * 192 + 192 + 192 * 768 + 768


def test_vit_b_fedavg_on_the_36_adapters_uploads_36_times_fedsca_with_one(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    report = cli.run(["cost", "--config", PROSTATE, "--compare", "FedAvg", "--format", "json",
                      f"{NET}train_mask_decoder", "false", f"{NET}depth_adapters", "true"])
    capsys.readouterr()
    fedsca, fedavg = report["strategies"]
    assert fedsca["per_client_per_round"]["upload_parameters"] == ADAPTER == 295_872
    assert fedavg["per_client_per_round"]["upload_parameters"] == 36 * ADAPTER
    assert fedavg["upload_ratio"] == pytest.approx(36.0)
    # the recipe as written (2-D: 24 adapters; the mask decoder trains): FedAvg also sends the decoder
    report = cli.run(["cost", "--config", PROSTATE, "--compare", "FedAvg", "--format", "json"])
    fedsca, fedavg = report["strategies"]
    assert fedsca["per_client_per_round"]["upload_parameters"] == ADAPTER
    assert fedavg["per_client_per_round"]["upload_parameters"] > 24 * ADAPTER
    assert not (tmp_path / "runs").exists()


def test_the_flagship_recipe_without_its_data_names_the_layouts(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["fit", "--config", PROSTATE])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert err.startswith("fedlit: error: data.init_args.root: no folder data/Fed-Prostate. FedProstate expects the "
                          "SAML volumes (data/Fed-Prostate/<site>/CaseXX.nii.gz")
    assert "{train,test}/{image,mask}/*.png" in err and "https://liuquande.github.io/SAML/" in err
    assert not (tmp_path / "runs").exists()


def test_the_flagship_recipe_runs_on_the_real_slices_with_the_tiny_sam(shared_data, tmp_path):
    samples = str(shared_data / "site_samples" / "ProstateSlice")
    with pytest.warns(UserWarning, match=r"I2CVB/train/image/00_01\.png \(no mask\), I2CVB/train/mask/00_00\.png"):
        results = cli.run([
            "fit", "--config", PROSTATE, "--data.init_args.root", samples, "--data.init_args.image_size", "64",
            "--data.init_args.crop_size", "56", "--data.init_args.num_workers", "0", f"{NET}variant", "tiny",
            f"{NET}checkpoint", "null", f"{NET}image_size", "64", "--federation.rounds", "1",
            "--federation.progress_bar", "false", "--out_dir", str(tmp_path / "run"),
        ])
    assert set(results["last"]["clients"]) == {"BIDMC", "BMC", "HK", "I2CVB", "RUNMC", "UCL"}
    assert results["evaluation_only"] == ["I2CVB"]
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert config["strategy"]["class_path"].endswith("FedSCA")
    assert config["model"]["init_args"]["network"]["init_args"]["variant"] == "tiny"
