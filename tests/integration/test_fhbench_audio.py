"""FHBench's audio recipes: their settings, the one-line stop without data, and the tiny recipe end to end through
the CLI on generated ICBHI-layout files (2 rounds of EPFL, then the same run resumed after round 1)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import soundfile

from fedlit.cli import main, run
from fedlit.commands.fit import build_parser

ROOT = Path(__file__).resolve().parents[2]
# recipe -> (data class, classes, FHBench's SGD lr for that data set)
AUDIO_RECIPES = {
    "fhbench_icbhi.yaml": ("fedlit.data.ICBHI", 4, 0.1),
    "fhbench_sprsound.yaml": ("fedlit.data.SPRSound", 7, 0.03),
}


@pytest.mark.parametrize("name", AUDIO_RECIPES)
def test_audio_recipes_use_fhbench_settings(name):
    data_class, num_classes, lr = AUDIO_RECIPES[name]
    cfg = build_parser().parse_args(["fit", "--config", str(ROOT / "recipes" / name)]).fit
    model, data = cfg.model.init_args, cfg.data.init_args
    backbone = model.backbone
    assert backbone.class_path == "fedlit.models.Wav2Vec2Encoder"
    assert Path(backbone.init_args.path).name == "wav2vec2-base-960h"
    lora = backbone.init_args.lora
    assert (lora.r, lora.alpha, lora.dropout, lora.target_modules) == (8, 16, 0.01, ["q_proj", "v_proj"])
    assert [(rule.pattern, rule.role) for rule in model.roles] == [("backbone.*lora_*", "shared")]
    assert (model.num_classes, model.optimizer, model.lr, model.momentum) == (num_classes, "sgd", lr, 0.0)
    assert model.lr_scheduler.init_args.T_max == cfg.federation.rounds == 200
    assert cfg.data.class_path == data_class
    partitioner = data.partitioner
    assert (data.num_clients, partitioner.class_path, partitioner.init_args.alpha, partitioner.init_args.min_size) == (
        20,
        "fedlit.data.Dirichlet",
        0.1,
        5,
    )
    assert tuple(data.split_fractions) == (0.4, 0.3, 0.3)
    assert (data.fraction, data.clip_seconds, data.sample_rate, data.batch_size) == (0.3, 8.0, 16000, 16)
    assert cfg.strategy.class_path == "fedlit.strategies.EPFL" and cfg.federation.local_epochs == 1


@pytest.mark.parametrize(
    "name, url",
    [
        ("fhbench_icbhi.yaml", "https://bhichallenge.med.auth.gr/"),
        ("fhbench_sprsound.yaml", "https://github.com/SJTU-YONGFU-RESEARCH-GRP/SPRSound"),
    ],
)
def test_audio_recipe_without_data_stops_with_one_line(name, url, capsys, monkeypatch, tmp_path):
    monkeypatch.chdir(ROOT)  # the recipe's paths are relative to the repository root
    folder = ROOT / ".." / "shared" / "data" / name.removeprefix("fhbench_").removesuffix(".yaml")
    if folder.is_dir():
        pytest.skip(f"{folder} is present: the missing-data message cannot be shown")
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", f"recipes/{name}", "--out_dir", str(tmp_path / "run")])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith("fedlit: error: data.init_args.root: no folder ../shared/data/") and err.endswith(f"{url})\n")
    assert not (tmp_path / "run").exists()


def write_icbhi(root: Path) -> Path:
    """4 recordings of 2 patients, 6 one-second cycles each (labels cycling through the 4 classes), at 4 kHz."""
    root.mkdir()
    rng = np.random.default_rng(0)
    for k, name in enumerate(
        ["101_1b1_Al_sc_Meditron", "101_1b2_Ar_sc_Meditron", "102_1b1_Tc_sc_LittC2SE", "102_2b1_Pl_sc_LittC2SE"]
    ):
        soundfile.write(root / f"{name}.wav", rng.normal(0, 0.1, 4000 * 6).astype(np.float32), 4000)
        lines = [f"{i}.0\t{i + 1}.0\t{(i + k) % 2}\t{(i + k) // 2 % 2}\n" for i in range(6)]
        (root / f"{name}.txt").write_text("".join(lines))
    return root


def test_tiny_audio_recipe_runs_epfl_and_resumes_exactly(tmp_path):
    root = write_icbhi(tmp_path / "icbhi")
    args = [
        "fit",
        "--config",
        str(ROOT / "recipes" / "fhbench_icbhi_tiny.yaml"),
        "--data.init_args.root",
        str(root),
        "--federation.progress_bar",
        "false",
    ]
    straight = run([*args, "--out_dir", str(tmp_path / "straight")])
    assert straight["last"]["round"] == 2 and sorted(straight["last"]["clients"]) == ["client_0", "client_1"]
    run([*args, "--out_dir", str(tmp_path / "resumed"), "--federation.rounds", "1"])
    resumed = run([*args, "--out_dir", str(tmp_path / "resumed"), "--ckpt_path", "last"])
    assert resumed["last"]["round"] == 2
    assert resumed["last"]["clients"] == straight["last"]["clients"]
    assert resumed["last"]["summary"] == straight["last"]["summary"]
