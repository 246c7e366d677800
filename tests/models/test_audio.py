"""Wav2Vec2Encoder on a tiny random wav2vec 2.0: pooling, normalization, LoRA targets, local folders, checks."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from transformers import Wav2Vec2Config, Wav2Vec2ForCTC

from fedlit.core.errors import ConfigError, InputFileError
from fedlit.models import LoRA, Wav2Vec2Encoder, tiny_wav2vec2_config


def _quiet_build(spec: Wav2Vec2Encoder) -> torch.nn.Module:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return spec.build()


def test_random_encoder_warns_normalizes_and_mean_pools() -> None:
    torch.manual_seed(0)
    with pytest.warns(UserWarning, match="randomly initialized"):
        model = Wav2Vec2Encoder(config=tiny_wav2vec2_config()).build().eval()
    assert model.num_features == 32
    names = [name for name, _ in model.named_parameters()]
    assert "wav2vec2.feature_extractor.conv_layers.0.conv.weight" in names
    waves = torch.randn(2, 4000) * 3 + 1
    # zero mean, unit variance per waveform (population variance + 1e-7), worked out with numpy
    normed = np.stack([(w - w.mean()) / np.sqrt(w.var() + 1e-7) for w in waves.double().numpy()])
    hidden = model.wav2vec2(torch.from_numpy(normed).float()).last_hidden_state
    assert hidden.shape[1] == 399  # (4000 - 10) // 5 + 1 = 799 frames, then (799 - 3) // 2 + 1 = 399
    assert torch.allclose(model(waves), hidden.mean(dim=1), atol=1e-5)
    assert torch.allclose(model(waves[:, None]), model(waves), atol=1e-6)  # (B, 1, samples) too
    raw = _quiet_build(Wav2Vec2Encoder(config=tiny_wav2vec2_config(), normalize=False)).eval()
    raw.load_state_dict(model.state_dict())
    assert torch.allclose(raw(waves), model.wav2vec2(waves).last_hidden_state.mean(dim=1), atol=1e-6)


def test_lora_defaults_to_q_and_v_projections_and_starts_as_the_original() -> None:
    torch.manual_seed(0)
    plain = _quiet_build(Wav2Vec2Encoder(config=tiny_wav2vec2_config())).eval()
    adapted = _quiet_build(Wav2Vec2Encoder(config=tiny_wav2vec2_config(), lora=LoRA(r=2, alpha=4))).eval()
    lora = sorted(name for name, _ in adapted.named_parameters() if "lora_" in name)
    assert lora == sorted(
        f"wav2vec2.encoder.layers.{i}.attention.{p}_proj.lora_{ab}.default.weight"
        for i in range(2)
        for p in "qv"
        for ab in "AB"
    )
    state = {
        name.replace(".base_layer.", "."): value for name, value in adapted.state_dict().items() if "lora_" not in name
    }
    plain.load_state_dict(state)
    waves = torch.randn(2, 3000)
    assert torch.allclose(adapted(waves), plain(waves), atol=1e-6)  # B = 0 at the start


def test_loads_local_folder_and_reports_the_ctc_head(tmp_path) -> None:
    config = dict(tiny_wav2vec2_config(vocab_size=8))
    config.pop("model_type")
    source = Wav2Vec2ForCTC(Wav2Vec2Config(**config)).eval()
    source.save_pretrained(tmp_path)
    with pytest.warns(UserWarning, match=r"checkpoint tensors were not used: \['lm_head.bias', 'lm_head.weight'\]"):
        model = Wav2Vec2Encoder(path=tmp_path, normalize=False).build().eval()
    for name, value in model.wav2vec2.state_dict().items():
        assert torch.equal(value, source.wav2vec2.state_dict()[name]), name
    waves = torch.randn(1, 2000)
    with torch.no_grad():
        expected = source.wav2vec2(waves).last_hidden_state.mean(dim=1)
    assert torch.allclose(model(waves), expected, atol=1e-6)


def test_options_and_inputs_are_checked(tmp_path) -> None:
    with pytest.raises(ConfigError, match="exactly one of path"):
        Wav2Vec2Encoder()
    with pytest.raises(ConfigError, match="model_type must be 'wav2vec2', got 'bert'"):
        Wav2Vec2Encoder(config={"model_type": "bert"})
    with pytest.raises(ConfigError, match=r"config\.hiden_size is not an option"):
        Wav2Vec2Encoder(config=tiny_wav2vec2_config(hiden_size=8))
    with pytest.raises(InputFileError, match=r"path=.*w2v.*tried .*config\.json.*never downloads"):
        Wav2Vec2Encoder(path=tmp_path / "w2v").build()
    model = _quiet_build(Wav2Vec2Encoder(config=tiny_wav2vec2_config()))
    with pytest.raises(ConfigError, match=r"float waveforms \(B, samples\).*shape \(2, 3, 100\)"):
        model(torch.randn(2, 3, 100))
