"""The breast-cancer case study's recipes (recipes/breast/): each method runs two rounds of each setting on
generated DICOM trees through the CLI, and without the data each stops with one line naming the folder and the
download page."""

import json
from pathlib import Path

import pytest

from fedlit.cli import main
from tests.data.mammography.layouts import make_cbis_ddsm, make_cmmd, make_rsna

ROOT = Path(__file__).resolve().parents[2]
METHODS = {"Local": [], "FedAvg": ["fedavg.yaml"], "APPLE": ["apple.yaml"], "PGFed": ["pgfed.yaml"]}
CLIENTS = {
    "setting1": ["machine_id_49", "machine_id_48", "machine_id_29", "machine_id_21"],
    "setting2": ["site_id_1", "site_id_2", "cbis_ddsm", "cmmd"],
}
TINY = [
    "--model.init_args.backbone",  # a tiny CNN in place of EfficientNet-Lite0 (no weights needed)
    '{"class_path": "fedlit.models.SmallCNN", "init_args": {"in_channels": 3, "width": 8, "depth": 1}}',
    "--data.init_args.image_size", "16",
    "--data.init_args.num_workers", "0",
    "--data.init_args.batch_size", "8",
    "--data.init_args.split_fractions", "[0.5, 0.5, 0.0]",  # 4 of the 8 generated patients: both classes in val
    "--federation.rounds", "2",
    "--federation.local_steps", "2",
    "--federation.progress_bar", "false",
]  # fmt: skip


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    base = tmp_path_factory.mktemp("breast")
    return {
        "rsna_root": make_rsna(base / "rsna"),
        "cbis_ddsm_root": make_cbis_ddsm(base / "cbis"),
        "cmmd_root": make_cmmd(base / "cmmd"),
    }


def _configs(setting: str, method: str) -> list[str]:
    files = [f"{setting}.yaml", *METHODS[method]]
    return [arg for name in files for arg in ("--config", str(ROOT / "recipes" / "breast" / name))]


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("setting", sorted(CLIENTS))
@pytest.mark.parametrize("method", METHODS)
def test_each_recipe_runs_two_rounds_on_generated_dicoms(sources, setting, method, tmp_path):
    roots = ["--data.init_args.rsna_root", str(sources["rsna_root"])]
    if setting == "setting2":
        roots += ["--data.init_args.cbis_ddsm_root", str(sources["cbis_ddsm_root"])]
        roots += ["--data.init_args.cmmd_root", str(sources["cmmd_root"])]
    main(["fit", *_configs(setting, method), *roots, *TINY, "--out_dir", str(tmp_path / "run")])
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["strategy_class"].split(".")[-1] == method and results["last"]["round"] == 2
    clients = results["last"]["clients"]
    assert list(clients) == CLIENTS[setting]
    for values in clients.values():
        assert 0.0 <= values["accuracy"] <= 1.0 and 0.0 <= values["auroc"] <= 1.0
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert manifest["class"] == "Mammograms" and manifest["class_names"] == ["normal", "cancer"]
    assert all(splits["test"] == splits["val"] for splits in manifest["clients"].values())


@pytest.mark.parametrize("setting", sorted(CLIENTS))
@pytest.mark.parametrize("method", METHODS)
def test_without_the_data_each_recipe_stops_with_one_line(capsys, monkeypatch, tmp_path, setting, method):
    monkeypatch.chdir(ROOT)  # the recipes' paths are relative to the repository root
    folder = "../shared/data/rsna-breast-cancer-detection"
    if (ROOT / folder).exists():
        pytest.skip(f"{folder} is present: the missing-data message cannot be shown")
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", *_configs(setting, method), "--out_dir", str(tmp_path / "run")])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err == (
        f"fedlit: error: data.init_args.rsna_root: no folder {folder}. RSNA Screening Mammography expects train.csv "
        "beside train_images/<patient_id>/<image_id>.dcm (the competition's layout); download it from "
        "https://www.kaggle.com/competitions/rsna-breast-cancer-detection/data\n"
    )
    assert not (tmp_path / "run").exists()
