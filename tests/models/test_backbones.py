"""Backbone specs: the build contract of every spec and registered model, validation, repr, configs."""

from __future__ import annotations

import warnings

import pytest
import timm
import torch
import yaml
from jsonargparse import ArgumentParser
from torch import nn

import fedlit.models.tiny  # noqa: F401  (registers the fedlit_test_* models in timm)
from fedlit.models import (
    CLIP,
    EHRGRU,
    MLP,
    Backbone,
    EfficientNetB0,
    EHRTransformer,
    HFEncoder,
    Identity,
    LoRA,
    MomentEncoder,
    ResNet1dSE,
    SmallCNN,
    TimmBackbone,
    Wav2Vec2Encoder,
    list_models,
    tiny_bert_config,
    tiny_clip_config,
    tiny_moment_config,
    tiny_wav2vec2_config,
)

# One example per spec class, with an input batch: a new spec without one fails test_every_spec_has_example.
EXAMPLES = {
    TimmBackbone: (lambda: TimmBackbone(name="fedlit_test_vit"), lambda: torch.randn(2, 3, 16, 16)),
    HFEncoder: (
        lambda: HFEncoder(config=tiny_bert_config()),
        lambda: {
            "input_ids": torch.randint(0, 30522, (2, 7)),
            "attention_mask": torch.ones(2, 7, dtype=torch.long),
        },
    ),
    SmallCNN: (lambda: SmallCNN(in_channels=1), lambda: torch.randn(2, 1, 16, 16)),
    Identity: (lambda: Identity(num_features=13), lambda: torch.randn(2, 13)),
    MLP: (lambda: MLP(num_features=13, hidden=[8, 4], norm="batch"), lambda: torch.randn(2, 13)),
    Wav2Vec2Encoder: (lambda: Wav2Vec2Encoder(config=tiny_wav2vec2_config()), lambda: torch.randn(2, 1600)),
    MomentEncoder: (lambda: MomentEncoder(config=tiny_moment_config()), lambda: torch.randn(2, 3, 40)),
    CLIP: (lambda: CLIP(config=tiny_clip_config()), lambda: torch.randn(2, 3, 16, 16)),
    # (B, hours, 1 + series + statics): the first feature marks real hours (all real here).
    EHRTransformer: (
        lambda: EHRTransformer(series_features=3, static_features=2, d_model=8, heads=2, feedforward=8, fc=[8]),
        lambda: torch.cat([torch.ones(2, 4, 1), torch.randn(2, 4, 5)], dim=2),
    ),
    EHRGRU: (
        lambda: EHRGRU(series_features=3, static_features=2, hidden=8, layers=1, fc=[6]),
        lambda: torch.cat([torch.ones(2, 4, 1), torch.randn(2, 4, 5)], dim=2),
    ),
    EfficientNetB0: (lambda: EfficientNetB0(), lambda: torch.randn(2, 3, 32, 32)),
    ResNet1dSE: (
        lambda: ResNet1dSE(stem_width=8, widths=[8, 16], blocks=[1, 1], se_reduction=4, norm="group", groups=2),
        lambda: torch.randn(2, 12, 256),
    ),
}


def _build_quietly(spec: Backbone) -> nn.Module:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return spec.build()


def test_every_spec_has_example() -> None:
    specs = {c for c in Backbone.__subclasses__() if c.__module__.startswith("fedlit.models")}
    assert specs == set(EXAMPLES)


@pytest.mark.parametrize("spec_class", list(EXAMPLES), ids=lambda c: c.__name__)
def test_spec_builds_feature_extractor(spec_class: type[Backbone]) -> None:
    make_spec, make_inputs = EXAMPLES[spec_class]
    model = _build_quietly(make_spec())
    features = model(make_inputs())
    assert isinstance(model.num_features, int)
    assert features.shape == (2, model.num_features)
    assert torch.isfinite(features).all()


@pytest.mark.parametrize("name", list_models())
def test_registered_model_builds(name: str, images: torch.Tensor) -> None:
    assert timm.is_model(name)
    with pytest.warns(UserWarning, match="randomly initialized"):
        model = TimmBackbone(name=name).build()
    features = model(images)
    assert features.shape == (2, model.num_features)
    assert torch.isfinite(features).all()
    assert sum(p.numel() for p in model.parameters()) < 100_000


def test_registered_models_refuse_pretrained() -> None:
    with pytest.raises(ValueError, match="no pretrained weights"):
        timm.create_model("fedlit_test_vit", pretrained=True)


def test_build_gives_fresh_modules() -> None:
    spec = SmallCNN()
    assert spec.build() is not spec.build()


def test_num_features_is_pooled_width_with_prelogits_layer() -> None:
    # MobileNetV3's conv_head makes its pooled output (1024) wider than its last feature map.
    model = _build_quietly(TimmBackbone(name="mobilenetv3_small_050")).eval()
    assert model(torch.randn(1, 3, 32, 32)).shape == (1, model.num_features) == (1, 1024)


def test_timm_model_args_reach_timm(images: torch.Tensor) -> None:
    model = _build_quietly(TimmBackbone(name="fedlit_test_vit", model_args={"in_chans": 1, "img_size": 8}))
    assert model.patch_embed.proj.in_channels == 1
    assert model(torch.randn(2, 1, 8, 8)).shape == (2, 32)


def test_timm_options_validated_together() -> None:
    with pytest.raises(ValueError) as error:
        TimmBackbone(
            name="fedlit_test_vitt",
            checkpoint_path="weights.npz",
            key_mapping="order",  # type: ignore[arg-type]
            model_args={"num_classes": 3, "pretrained": True},
        )
    message = str(error.value)
    assert "name='fedlit_test_vitt' is not a timm model" in message and "fedlit_test_vit" in message
    assert "checkpoint_path='weights.npz'" in message and ".safetensors" in message
    assert "key_mapping='order'" in message
    assert "model_args.num_classes" in message and "model_args.pretrained" in message


def test_missing_checkpoint_names_option_and_path(tmp_path) -> None:
    spec = TimmBackbone(name="fedlit_test_vit", checkpoint_path=tmp_path / "absent.pth")
    with pytest.raises(FileNotFoundError, match=r"checkpoint_path=.*absent\.pth.*tried") as error:
        spec.build()
    assert str(tmp_path / "absent.pth") in str(error.value)


def test_repr_shows_arguments() -> None:
    spec = TimmBackbone(name="fedlit_test_vit", checkpoint_path="/w/vit.pth", lora=LoRA(r=2))
    assert repr(spec) == (
        "TimmBackbone(name='fedlit_test_vit', checkpoint_path='/w/vit.pth', key_mapping=None, "
        "lora=LoRA(r=2, alpha=16, dropout=0.0, target_modules=None, fused_qkv='all'), model_args={}, "
        "weights=None)"
    )
    assert repr(SmallCNN(width=4)) == "SmallCNN(in_channels=1, width=4, depth=2, norm='batch', groups=8)"
    assert repr(Identity(num_features=3)) == "Identity(num_features=3)"


def test_small_cnn_layout() -> None:
    model = SmallCNN(in_channels=3, width=4, depth=3).build()
    norms = [name for name, m in model.named_modules() if isinstance(m, nn.BatchNorm2d)]
    assert norms == ["blocks.0.bn", "blocks.1.bn", "blocks.2.bn"]
    assert model.num_features == 16
    assert model(torch.randn(2, 3, 16, 16)).shape == (2, 16)
    # ceil-mode pooling keeps deep nets running on tiny images.
    assert SmallCNN(depth=6, width=1).build()(torch.randn(2, 1, 4, 4)).shape == (2, 32)


@pytest.mark.parametrize(
    ("kwargs", "option"),
    [({"depth": 0}, "depth"), ({"width": 2.5}, "width"), ({"in_channels": True}, "in_channels")],
)
def test_small_cnn_validation(kwargs: dict, option: str) -> None:
    with pytest.raises(ValueError, match=f"SmallCNN: {option} must be an integer >= 1"):
        SmallCNN(**kwargs)


def test_identity_passes_features_and_checks_width() -> None:
    model = Identity(num_features=3).build()
    x = torch.randn(4, 3)
    assert model(x) is x
    assert list(model.parameters()) == []
    with pytest.raises(ValueError, match=r"shape \(B, 3\), got \(4, 5\)"):
        model(torch.randn(4, 5))
    with pytest.raises(ValueError, match="num_features must be an integer >= 1"):
        Identity(num_features=0)


def test_specs_parse_from_yaml_config() -> None:
    parser = ArgumentParser()
    parser.add_argument("--backbone", type=Backbone)
    config = {
        "backbone": {
            "class_path": "fedlit.models.TimmBackbone",
            "init_args": {
                "name": "fedlit_test_vit",
                "lora": {"r": 2, "alpha": 4},
                "model_args": {"depth": 1},
            },
        }
    }
    spec = parser.instantiate(parser.parse_string(yaml.safe_dump(config))).backbone
    assert isinstance(spec, TimmBackbone)
    assert spec.lora == LoRA(r=2, alpha=4.0)
    assert spec.model_args == {"depth": 1}
    config["backbone"]["init_args"]["lora"]["r"] = 0
    with pytest.raises(ValueError, match="lora.r must be an integer >= 1, got 0"):
        parser.instantiate(parser.parse_string(yaml.safe_dump(config)))
