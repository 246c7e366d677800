"""The FedSCA recipes through the CLI: the paper's costs (FedSCA sends one adapter, the baselines every adapter), the
flagship recipe's message when its data is absent, and the same recipe on the real slice samples with the tiny SAM;
under the ``gpu`` marker (``make test-gpu``), the flagship itself on CUDA for 2 rounds with a random SAM ViT-B."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fedlit import cli

ROOT = Path(__file__).resolve().parents[2]
PROSTATE = str(ROOT / "recipes" / "fedsca_prostate.yaml")
TINY = str(ROOT / "recipes" / "fedsca_tiny.yaml")
BASELINES = ROOT / "recipes" / "fedsca_baselines"
NET = "--model.init_args.network.init_args."
# One Medical-SAM-Adapter adapter on ViT-B (width 768): Linear(768, 192) and Linear(192, 768) with biases.
ADAPTER = 768 * 192 + 192 + 192 * 768 + 768


def _cost(*args: str) -> dict:
    return cli.run(["cost", "--format", "json", *args])


def test_vit_b_baselines_send_only_adapters_as_in_the_paper(capsys, tmp_path, monkeypatch):
    """FedSCA's Table 3 with the recipe as shipped: FedAvg sends every adapter (36: the recipe's
    ``adapter_layout: reference`` builds, as Medical-SAM-Adapter's code does, a depth adapter in every block even for
    2-D images), FedSCA one, FedSA the down projections (half of FedAvg); the decoder (4.06M) stays home."""
    monkeypatch.chdir(tmp_path)
    down = 768 * 192 + 192  # an adapter's D_fc1, what FedSA sends of it
    report = _cost("--config", PROSTATE, "--compare", "FedAvg", "FedProx", "FedHEAL", "FedRA", "FedSA")
    capsys.readouterr()
    fedsca, *baselines, fedsa = report["strategies"]
    assert fedsca["per_client_per_round"]["upload_parameters"] == ADAPTER == 295_872
    for baseline in baselines:
        assert baseline["per_client_per_round"]["upload_parameters"] == 36 * ADAPTER, baseline["name"]
        assert baseline["upload_ratio"] == pytest.approx(36.0)
    assert fedsa["per_client_per_round"]["upload_parameters"] == 36 * down
    # fedlit's own 2-D layout (a space and an MLP adapter per block, no depth adapters): 24 adapters, 24x
    report = _cost("--config", PROSTATE, "--compare", "FedAvg", "FedSA", f"{NET}adapter_layout", "fedlit")
    fedsca, fedavg, fedsa = report["strategies"]
    assert fedsca["per_client_per_round"]["upload_parameters"] == ADAPTER
    assert fedavg["per_client_per_round"]["upload_parameters"] == 24 * ADAPTER
    assert fedavg["upload_ratio"] == pytest.approx(24.0)
    assert fedsa["per_client_per_round"]["upload_parameters"] == 24 * down
    assert not (tmp_path / "runs").exists()


# The tiny SAM: 2 blocks of width 64, each with a space and an MLP adapter, Linear(64, 16) and Linear(16, 64).
TINY_DOWN = 64 * 16 + 16
TINY_ADAPTER = TINY_DOWN + 16 * 64 + 64


def test_tiny_recipe_baselines_send_4_adapters_fedsca_1(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    # (FedRA's default block counts are ViT-B's 12 blocks: it is counted on ViT-B above)
    report = _cost("--config", TINY, "--compare", "FedAvg", "FedProx", "FedHEAL", "FedSA")
    capsys.readouterr()
    assert report["clients"]["total"] == 4
    fedsca, *baselines, fedsa = report["strategies"]
    assert fedsca["per_client_per_round"]["upload_parameters"] == TINY_ADAPTER == 2128
    for baseline in baselines:
        assert baseline["per_client_per_round"]["upload_parameters"] == 4 * TINY_ADAPTER, baseline["name"]
        assert baseline["per_client_per_round"]["download_parameters"] == 4 * TINY_ADAPTER, baseline["name"]
        assert baseline["upload_ratio"] == pytest.approx(4.0)
    assert fedsa["per_client_per_round"]["upload_parameters"] == 4 * TINY_DOWN
    assert fedsa["upload_ratio"] == pytest.approx(4 * TINY_DOWN / TINY_ADAPTER)


def test_tiny_recipe_with_the_decoder_shared(capsys, tmp_path, monkeypatch):
    """The alternative, --model.init_args.roles '[]' (the model's default roles): the baselines average the decoder
    too; FedSA's recipe still keeps it personal (its head); FedSCA still sends one adapter."""
    from fedlit.models import SamAdapter

    monkeypatch.chdir(tmp_path)
    decoder = sum(
        p.numel()
        for p in SamAdapter(variant="tiny", image_size=64, in_channels=1, prompt="none")
        .build(out_channels=1)
        .mask_decoder.parameters()
    )
    report = _cost("--config", TINY, "--compare", "FedAvg", "--model.init_args.roles", "[]")
    fedsca, fedavg = report["strategies"]
    assert fedsca["per_client_per_round"]["upload_parameters"] == TINY_ADAPTER
    assert fedavg["per_client_per_round"]["upload_parameters"] == 4 * TINY_ADAPTER + decoder
    report = _cost("--config", TINY, "--config", str(BASELINES / "fedsa.yaml"), "--model.init_args.roles", "[]")
    capsys.readouterr()
    (fedsa,) = report["strategies"]
    assert fedsa["per_client_per_round"]["upload_parameters"] == 4 * TINY_DOWN


def test_the_flagship_recipe_without_its_data_names_the_layouts(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["fit", "--config", PROSTATE])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert err.startswith(
        "fedlit: error: data.init_args.root: no folder data/Fed-Prostate. FedProstate expects the "
        "SAML volumes (data/Fed-Prostate/<site>/CaseXX.nii.gz"
    )
    assert "{train,test}/{image,mask}/*.png" in err and "https://liuquande.github.io/SAML/" in err
    assert not (tmp_path / "runs").exists()


def test_the_flagship_recipe_runs_on_the_real_slices_with_the_tiny_sam(shared_data, tmp_path):
    samples = str(shared_data / "site_samples" / "ProstateSlice")
    with pytest.warns(UserWarning, match=r"I2CVB/train/image/00_01\.png \(no mask\), I2CVB/train/mask/00_00\.png"):
        results = cli.run(
            [
                "fit",
                "--config",
                PROSTATE,
                "--data.init_args.root",
                samples,
                "--data.init_args.image_size",
                "64",
                "--data.init_args.crop_size",
                "56",
                "--data.init_args.num_workers",
                "0",
                f"{NET}variant",
                "tiny",
                f"{NET}checkpoint",
                "null",
                f"{NET}image_size",
                "64",
                "--federation.rounds",
                "1",
                "--federation.progress_bar",
                "false",
                "--out_dir",
                str(tmp_path / "run"),
            ]
        )
    assert set(results["last"]["clients"]) == {"BIDMC", "BMC", "HK", "I2CVB", "RUNMC", "UCL"}
    assert results["evaluation_only"] == ["I2CVB"]
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert config["strategy"]["class_path"].endswith("FedSCA")
    assert config["model"]["init_args"]["network"]["init_args"]["variant"] == "tiny"


@pytest.mark.gpu
def test_the_flagship_recipe_runs_2_rounds_on_cuda_with_a_random_sam_vit_b_and_resumes(shared_data, tmp_path):
    """The flagship as shipped (SAM ViT-B, 384 px, the recipe's DataLoader workers), in bf16-mixed on one GPU, on the
    real slice samples, with a randomly initialised ViT-B checkpoint written here: 2 rounds straight, then 1 round
    and a resume to round 2 with the same results (``make test-gpu``; skipped without CUDA)."""
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs CUDA: run `make test-gpu` on a machine with an NVIDIA GPU")
    from segment_anything import sam_model_registry

    checkpoint = tmp_path / "sam_vit_b_random.pth"
    torch.manual_seed(0)
    torch.save(sam_model_registry["vit_b"](checkpoint=None).state_dict(), checkpoint)
    args = [
        "--config",
        PROSTATE,
        "--data.init_args.root",
        str(shared_data / "site_samples" / "ProstateSlice"),
        f"{NET}checkpoint",
        str(checkpoint),
        "--federation.accelerator",
        "cuda",
        "--federation.precision",
        "bf16-mixed",
        "--federation.progress_bar",
        "false",
    ]

    def fit(folder: str, rounds: int, *extra: str) -> dict:
        more = ["--federation.rounds", str(rounds), "--out_dir", str(tmp_path / folder), *extra]
        with pytest.warns(UserWarning, match="no mask"):
            return cli.run(["fit", *args, *more])

    straight = fit("straight", 2)
    assert straight["last"]["round"] == 2 and straight["evaluation_only"] == ["I2CVB"]
    assert set(straight["last"]["clients"]) == {"BIDMC", "BMC", "HK", "I2CVB", "RUNMC", "UCL"}
    fit("resumed", 1)
    resumed = fit("resumed", 2, "--ckpt_path", "last")
    # CUDA's bilinear upsampling backward adds with atomics: the same run to a tolerance, not to the bit
    for client, metrics in straight["last"]["clients"].items():
        for name, value in metrics.items():
            got = resumed["last"]["clients"][client][name]
            assert got == pytest.approx(value, rel=0.02, abs=1e-3, nan_ok=True), (client, name)
    saved = torch.load(tmp_path / "resumed" / "checkpoints" / "last.ckpt", weights_only=True)
    assert saved["server_round"] == 2 and saved["strategy"]["global_state"]  # FedSCA's one shared adapter
