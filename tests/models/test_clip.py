"""The CLIP backbone: the tiny random model builds, its features have CLIP's shapes, prompts run through CLIP's own
text path, and a missing folder stops with one line naming it."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch

from fedlit.cli import main
from fedlit.core.errors import ConfigError, InputFileError
from fedlit.models import CLIP, tiny_clip_config

ROOT = Path(__file__).resolve().parents[2]


def tiny():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return CLIP(config=tiny_clip_config()).build()


def test_tiny_clip_builds_frozen_with_image_and_text_features_of_the_right_shapes():
    clip = tiny()
    assert clip.num_features == 32 and clip.width == 32 and clip.image_size == (16, 16)
    assert not any(p.requires_grad for p in clip.parameters())
    assert clip(torch.randn(3, 3, 16, 16)).shape == (3, 32)
    assert clip(torch.randn(2, 1, 28, 28)).shape == (2, 32)  # grey repeated to RGB, resized to 16
    ids, eos = clip.prompt_tokens(["ab", "c"], 4)
    x, dot = ord("X") + 1, ord(".") + 1  # bytes + 1; start 318, end 319, padding 0
    assert ids.tolist() == [
        [318, x, x, x, x, ord("a") + 1, ord("b") + 1, dot, 319],
        [318, x, x, x, x, ord("c") + 1, dot, 319, 0],
    ]
    assert eos.tolist() == [8, 7]
    features = clip.encode_prompts(clip.token_embedding(ids), eos)
    assert features.shape == (2, 32)
    # the same numbers as transformers' own text path on these ids (end token found by its id there)
    assert torch.allclose(features, clip.model.get_text_features(input_ids=ids).pooler_output, atol=1e-6)


def test_a_prompt_longer_than_clips_context_is_refused():
    with pytest.raises(ConfigError, match="num_context"):
        tiny().prompt_tokens(["a very long class name indeed"], 40)


def test_bad_specs_are_refused():
    with pytest.raises(ConfigError, match="exactly one of path"):
        CLIP()
    with pytest.raises(ConfigError, match="model_type 'clip'"):
        CLIP(config={"model_type": "bert"})


def test_a_folder_without_clip_names_the_path_and_what_it_must_hold(tmp_path):
    with pytest.raises(InputFileError, match=r"path='.*nothing' is not a transformers CLIP folder .*config.json"):
        CLIP(path=tmp_path / "nothing").build()


def test_the_vit_b16_recipe_without_weights_stops_with_one_line(capsys, monkeypatch, tmp_path):
    monkeypatch.chdir(ROOT)  # the recipe's paths are relative to the repository root
    if (ROOT / "../shared/models/clip-vit-base-patch16/config.json").is_file():
        pytest.skip("the CLIP weights are present: the missing-folder message cannot be shown")
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", "recipes/pfedmoap_pneumoniamnist.yaml", "--out_dir", str(tmp_path / "run")])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith(
        "fedlit: error: CLIP: path='../shared/models/clip-vit-base-patch16' is not a transformers "
        "CLIP folder (it must hold config.json"
    )
    assert not (tmp_path / "run").exists()
