"""MomentEncoder: MOMENT's embedding worked out by hand, channel independence, resampling, LoRA on q and v, and a
MOMENT checkpoint folder (keys as momentfm names them) loaded by name, or refused naming what does not match."""

from __future__ import annotations

import json
import math
import warnings

import numpy as np
import pytest
import torch
from safetensors.torch import save_file
from transformers import T5Config, T5EncoderModel

from fedlit.core.errors import CheckpointError, ConfigError, InputFileError
from fedlit.models import LoRA, MomentEncoder, tiny_moment_config

D = 16  # tiny_moment_config's d_model


def _quiet(spec):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return spec.build()


def momentfm_state(seed: int = 0) -> dict[str, torch.Tensor]:
    """A random MOMENT-1 state dict for the tiny config, with the keys momentfm's MOMENT module has (read from its
    source: RevIN without parameters, PatchEmbedding, the T5 encoder stack of T5EncoderModel, PretrainHead)."""
    torch.manual_seed(seed)
    stack = T5EncoderModel(T5Config(**tiny_moment_config(), vocab_size=32)).get_encoder()
    state = {f"encoder.{k}": v.clone() for k, v in stack.state_dict().items()}
    state["patch_embedding.value_embedding.weight"] = torch.randn(D, 8)
    state["patch_embedding.mask_embedding"] = torch.randn(D)
    state["patch_embedding.position_embedding.pe"] = torch.randn(1, 5000, D)
    state["head.linear.weight"], state["head.linear.bias"] = torch.randn(8, D), torch.randn(8)
    return state


def write_moment_folder(folder, state) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    config = {
        "task_name": "reconstruction",
        "model_name": "MOMENT",
        "transformer_type": "encoder_only",
        "d_model": None,
        "seq_len": 512,
        "patch_len": 8,
        "patch_stride_len": 8,
        "transformer_backbone": "google/flan-t5-large",
        "t5_config": {
            **tiny_moment_config(),
            "vocab_size": 32,
            "architectures": ["T5ForConditionalGeneration"],
            "is_encoder_decoder": True,
            "eos_token_id": 1,
        },
    }
    (folder / "config.json").write_text(json.dumps(config))
    save_file({k: v.contiguous() for k, v in state.items()}, str(folder / "model.safetensors"))


def by_hand(state: dict[str, torch.Tensor], x: np.ndarray) -> np.ndarray:
    """MOMENT's embed (mean reduction, all observed): RevIN, patches of 8, value embedding + sinusoid, the T5
    encoder per channel, mean over channels and patches."""
    b, c, length = x.shape
    z = (x - x.mean(-1, keepdims=True)) / (x.std(-1, keepdims=True) + 1e-5)
    n = length // 8
    patches = z.reshape(b, c, n, 8)
    pe = np.zeros((n, D))
    for pos in range(n):
        for i in range(0, D, 2):
            pe[pos, i] = math.sin(pos / 10000 ** (i / D))
            pe[pos, i + 1] = math.cos(pos / 10000 ** (i / D))
    embedded = patches @ state["patch_embedding.value_embedding.weight"].double().numpy().T + pe
    stack = T5EncoderModel(T5Config(**tiny_moment_config(), vocab_size=32)).get_encoder()
    stack.load_state_dict({k.removeprefix("encoder."): v for k, v in state.items() if k.startswith("encoder.")})
    with torch.no_grad():
        hidden = stack(inputs_embeds=torch.tensor(embedded.reshape(b * c, n, D), dtype=torch.float32)).last_hidden_state
    return hidden.numpy().reshape(b, c, n, D).mean(axis=(1, 2))


def test_a_moment_folder_loads_by_name_and_computes_momentfm_embed(tmp_path):
    state = momentfm_state()
    write_moment_folder(tmp_path / "moment", state)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # head.*, embed_tokens and the stored position table are left out silently
        model = MomentEncoder(path=tmp_path / "moment", seq_len=None).build().eval()
    loaded = model.state_dict()
    assert sorted(loaded) == sorted(
        k for k in state if not k.startswith(("head.", "encoder.embed_tokens.", "patch_embedding.position_embedding."))
    )
    assert all(torch.equal(loaded[k], state[k]) for k in loaded)
    x = np.random.default_rng(0).normal(3.0, 2.0, size=(2, 3, 64))
    with torch.no_grad():
        out = model(torch.tensor(x, dtype=torch.float32)).numpy()
    np.testing.assert_allclose(out, by_hand(state, x), rtol=1e-4, atol=1e-5)


def test_channels_are_encoded_independently_and_averaged():
    model = _quiet(MomentEncoder(config=tiny_moment_config(), seq_len=None)).eval()
    x = torch.randn(2, 3, 32)
    with torch.no_grad():
        whole = model(x)
        each = torch.stack([model(x[:, c : c + 1]) for c in range(3)]).mean(0)
        single = model(x[:, 0])  # (B, L) is one channel
    torch.testing.assert_close(whole, each)
    torch.testing.assert_close(single, model(x[:, :1]))


def test_other_lengths_are_resampled_linearly_to_seq_len():
    model = _quiet(MomentEncoder(config=tiny_moment_config(), seq_len=64)).eval()
    x = np.random.default_rng(1).normal(size=(2, 2, 100))
    grid = np.linspace(0, 99, 64)
    resampled = np.stack([[np.interp(grid, np.arange(100), row) for row in rows] for rows in x])
    with torch.no_grad():
        torch.testing.assert_close(
            model(torch.tensor(x, dtype=torch.float32)),
            model(torch.tensor(resampled, dtype=torch.float32)),
            rtol=1e-4,
            atol=1e-5,
        )
    unresampled = _quiet(MomentEncoder(config=tiny_moment_config(), seq_len=None))
    with pytest.raises(ConfigError, match="100 samples are not a multiple of patch_len=8"):
        unresampled(torch.randn(1, 1, 100))


def test_lora_adapts_q_and_v_of_every_layer_and_starts_as_the_original():
    torch.manual_seed(0)
    plain = _quiet(MomentEncoder(config=tiny_moment_config(), seq_len=None)).eval()
    torch.manual_seed(0)
    adapted = _quiet(MomentEncoder(config=tiny_moment_config(), seq_len=None, lora=LoRA(r=2))).eval()
    names = [n for n, _ in adapted.named_parameters() if "lora_A" in n]
    assert names == [
        f"encoder.block.{i}.layer.0.SelfAttention.{p}.lora_A.default.weight" for i in range(2) for p in ("q", "v")
    ]
    x = torch.randn(2, 2, 32)
    with torch.no_grad():
        torch.testing.assert_close(adapted(x), plain(x))


def test_a_checkpoint_that_does_not_match_is_refused_naming_the_tensors(tmp_path):
    state = momentfm_state()
    del state["encoder.final_layer_norm.weight"]
    state["patch_embedding.value_embedding.weight"] = torch.randn(D, 16)
    write_moment_folder(tmp_path / "bad", state)
    with pytest.raises(
        CheckpointError,
        match=r"missing \['encoder.final_layer_norm.weight'\].*"
        r"patch_embedding.value_embedding.weight \(16, 16\)",
    ):
        MomentEncoder(path=tmp_path / "bad").build()
    state = {**momentfm_state(), "extra.weight": torch.zeros(1)}
    write_moment_folder(tmp_path / "extra", state)
    with pytest.warns(UserWarning, match=r"1 checkpoint tensors were not used: \['extra.weight'\]"):
        MomentEncoder(path=tmp_path / "extra").build()


def test_an_absent_folder_and_bad_options_say_what_to_do(tmp_path):
    with pytest.raises(InputFileError, match="not a MOMENT folder.*config.json.*huggingface-cli download"):
        MomentEncoder(path=tmp_path / "MOMENT-1-large").build()
    with pytest.raises(ConfigError, match=r"config.d_modle is not an option of T5Config \(closest: \['d_model'"):
        MomentEncoder(config={**tiny_moment_config(), "d_modle": 8})
    with pytest.raises(ConfigError, match="exactly one of path"):
        MomentEncoder()
    with pytest.raises(ConfigError, match="seq_len must be null or a multiple of patch_len=8, got 100"):
        MomentEncoder(config=tiny_moment_config(), seq_len=100)
