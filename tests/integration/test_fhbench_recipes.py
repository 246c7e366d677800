"""The FHBench recipes of PTB-XL, ADFTD and PubMed 200k RCT: the paper's settings, and one line when the data is
absent."""

from pathlib import Path

import pytest

from fedlit.cli import main, run
from fedlit.commands.fit import build_parser

ROOT = Path(__file__).resolve().parents[2]
# recipe -> (data class, the message's layout, the download page, classes, backbone)
RECIPES = {
    "fhbench_ptbxl.yaml": (
        "fedlit.data.PTBXL",
        "ptbxl_database.csv, scp_statements.csv and the WFDB records records100/",
        "https://physionet.org/content/ptb-xl/",
        5,
        "fedlit.models.MomentEncoder",
    ),
    "fhbench_adftd.yaml": (
        "fedlit.data.ADFTD",
        "participants.tsv (participant_id, Group A/F/C) and derivatives/sub-XXX/eeg/sub-XXX_task-eyesclosed_eeg.set",
        "https://openneuro.org/datasets/ds004504",
        3,
        "fedlit.models.MomentEncoder",
    ),
    "fhbench_pubmed_rct.yaml": (
        "fedlit.data.PubMedRCT",
        "train.txt, dev.txt, test.txt of PubMed 200k RCT",
        "https://github.com/Franck-Dernoncourt/pubmed-rct",
        5,
        "fedlit.models.HFEncoder",
    ),
}


@pytest.mark.parametrize("name", RECIPES)
def test_fhbench_settings(name):
    cfg = build_parser().parse_args(["fit", "--config", str(ROOT / "recipes" / name)]).fit
    model, data = cfg.model.init_args, cfg.data.init_args
    assert cfg.data.class_path == RECIPES[name][0]
    assert (data.num_clients, data.partitioner.class_path, data.partitioner.init_args.alpha) == (
        20,
        "fedlit.data.Dirichlet",
        0.1,
    )
    assert tuple(data.split_fractions) == (0.4, 0.3, 0.3) and data.get("split", "clients") == "clients"
    assert (model.optimizer, model.lr, model.momentum, model.num_classes) == ("sgd", 0.001, 0.0, RECIPES[name][3])
    assert model.backbone.class_path == RECIPES[name][4] and model.backbone.init_args.lora.r == 8
    assert cfg.strategy.class_path == "fedlit.strategies.EPFL" and cfg.federation.rounds == 200
    assert model.lr_scheduler.init_args.T_max == 200


@pytest.mark.parametrize("name", RECIPES)
def test_without_the_data_stops_with_one_line_naming_layout_and_page(name, capsys, monkeypatch, tmp_path):
    monkeypatch.chdir(ROOT)  # the recipe's paths are relative to the repository root
    cfg = build_parser().parse_args(["fit", "--config", str(ROOT / "recipes" / name)]).fit
    if Path(cfg.data.init_args.root).is_dir():
        pytest.skip(f"{cfg.data.init_args.root} is present: the missing-data message cannot be shown")
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", f"recipes/{name}", "--out_dir", str(tmp_path / "run")])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith(f"fedlit: error: data.init_args.root: no folder {cfg.data.init_args.root}. It must hold ")
    _, layout, page, *_ = RECIPES[name]
    assert layout in err and page in err
    assert not (tmp_path / "run").exists()


# FHBench's three abdominal CT sets of MedMNIST v2: one recipe each, equal but for the file
ORGANS = ("organamnist", "organcmnist", "organsmnist")


@pytest.mark.parametrize("flag", ORGANS)
def test_fhbench_organ_settings(flag):
    cfg = build_parser().parse_args(["fit", "--config", str(ROOT / "recipes" / f"fhbench_{flag}.yaml")]).fit
    model, data = cfg.model.init_args, cfg.data.init_args
    backbone = model.backbone.init_args
    assert (cfg.data.class_path, data.path) == ("fedlit.data.MedMNIST", f"../shared/data/{flag}/{flag}.npz")
    assert (data.num_clients, data.partitioner.class_path, data.partitioner.init_args.alpha) == (
        20,
        "fedlit.data.Dirichlet",
        0.1,
    )
    assert tuple(data.split_fractions) == (0.4, 0.3, 0.3) and (data.channels, data.image_size) == (3, 224)
    assert (model.optimizer, model.lr, model.momentum, model.num_classes) == ("sgd", 0.001, 0.0, 11)
    assert model.backbone.class_path == "fedlit.models.TimmBackbone" and backbone.name == "vit_base_patch16_224"
    assert (backbone.lora.r, backbone.lora.alpha, backbone.lora.fused_qkv) == (8, 16, "qv")
    assert cfg.strategy.class_path == "fedlit.strategies.EPFL" and cfg.federation.rounds == 200
    assert model.lr_scheduler.init_args.T_max == 200


def test_the_organ_recipes_differ_only_in_the_data_set():
    texts = {flag: (ROOT / "recipes" / f"fhbench_{flag}.yaml").read_text() for flag in ORGANS}
    settings = {flag: text[text.index("\nmodel:") :].replace(flag, "FLAG") for flag, text in texts.items()}
    assert len(set(settings.values())) == 1


@pytest.mark.parametrize("flag", ORGANS)
def test_without_the_organ_file_stops_with_one_line_naming_file_and_page(flag, capsys, monkeypatch, tmp_path):
    monkeypatch.chdir(ROOT)  # the recipe's paths are relative to the repository root
    path = f"../shared/data/{flag}/{flag}.npz"
    if Path(path).exists():
        pytest.skip(f"{path} is present: the missing-data message cannot be shown")
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", f"recipes/fhbench_{flag}.yaml", "--out_dir", str(tmp_path / "run")])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err == (
        f"fedlit: error: data.init_args.path: no MedMNIST .npz file at {path}: download {flag}.npz from "
        "https://zenodo.org/records/10519652\n"
    )
    assert not (tmp_path / "run").exists()


# The CPU grid's generated rows: FHBench's signal and sound pipelines without the data or the weights
GENERATED = {
    "fhbench_signals_generated.yaml": ("fedlit.models.MomentEncoder", 12, 512, 5),
    "fhbench_sounds_generated.yaml": ("fedlit.models.Wav2Vec2Encoder", 1, 4000, 4),
}


@pytest.mark.parametrize("name", GENERATED)
def test_generated_signal_recipes_train_under_epfl_through_the_cli(name, tmp_path):
    backbone, channels, length, classes = GENERATED[name]
    cfg = build_parser().parse_args(["fit", "--config", str(ROOT / "recipes" / name)]).fit
    data = cfg.data.init_args
    assert cfg.data.class_path == "fedlit.data.SyntheticSignals"
    assert (data.channels, data.length, data.num_classes, cfg.model.init_args.num_classes) == (
        channels,
        length,
        classes,
        classes,
    )
    assert cfg.model.init_args.backbone.class_path == backbone and cfg.model.init_args.backbone.init_args.lora.r == 8
    assert cfg.strategy.class_path == "fedlit.strategies.EPFL"
    results = run(
        [
            "fit",
            "--config",
            str(ROOT / "recipes" / name),
            "--data.init_args.num_clients",
            "2",
            "--data.init_args.samples_per_client",
            "12",
            "--federation.rounds",
            "1",
            "--federation.progress_bar",
            "false",
            "--out_dir",
            str(tmp_path / "run"),
        ]
    )
    assert results["last"]["round"] == 1 and sorted(results["last"]["clients"]) == ["site_0", "site_1"]
