"""Loading local checkpoints by name and by position: every tensor lands, nothing goes unreported."""

from __future__ import annotations

import re
import warnings

import pytest
import timm
import torch
from safetensors.torch import save_file

import fedlit.models.tiny  # noqa: F401  (registers the fedlit_test_* models in timm)
from fedlit.models import TimmBackbone, load_checkpoint, read_state_dict


def _timm(name: str, **kwargs) -> torch.nn.Module:
    return timm.create_model(name, pretrained=False, **kwargs)


def _renamed(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The same tensors under other names, as another implementation would save them."""
    return {f"other_impl.layer{i}.{key.rsplit('.', 1)[-1]}": value for i, (key, value) in enumerate(state.items())}


@pytest.mark.parametrize("suffix", [".pth", ".safetensors"])
def test_by_name_loads_every_tensor_and_drops_head(tmp_path, suffix: str, images: torch.Tensor) -> None:
    source = _timm("fedlit_test_vit", num_classes=5)
    path = tmp_path / f"vit{suffix}"
    state = {k: v.contiguous() for k, v in source.state_dict().items()}
    save_file(state, str(path)) if suffix == ".safetensors" else torch.save(state, path)
    dropped = r"dropped the checkpoint's classifier .*: head\.(weight|bias), head\.(weight|bias)"
    with pytest.warns(UserWarning, match=dropped):
        model = TimmBackbone(name="fedlit_test_vit", checkpoint_path=path).build()
    for key, value in model.state_dict().items():
        assert torch.equal(value, source.state_dict()[key]), key
    source.reset_classifier(0)
    assert torch.equal(model.eval()(images), source.eval()(images))


def test_by_name_reports_missing_and_unexpected(tmp_path) -> None:
    state = _timm("fedlit_test_vit", num_classes=0).state_dict()
    del state["norm.weight"]
    state["decoder.pred.weight"] = torch.zeros(3)
    torch.save(state, tmp_path / "partial.pth")
    report = load_checkpoint(_timm("fedlit_test_vit", num_classes=0), tmp_path / "partial.pth")
    assert report.missing == ["norm.weight"]
    assert report.unexpected == ["decoder.pred.weight"]
    assert report.dropped_classifier == []
    assert not report.complete
    with pytest.warns(UserWarning) as record:
        TimmBackbone(name="fedlit_test_vit", checkpoint_path=tmp_path / "partial.pth").build()
    message = str(record[0].message)
    assert "stay randomly initialized: norm.weight" in message and "not used: decoder.pred.weight" in message


def test_complete_checkpoint_does_not_warn(tmp_path) -> None:
    torch.save(_timm("fedlit_test_cnn", num_classes=0).state_dict(), tmp_path / "cnn.pt")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        TimmBackbone(name="fedlit_test_cnn", checkpoint_path=tmp_path / "cnn.pt").build()


def test_by_name_shape_mismatch_is_an_error(tmp_path) -> None:
    torch.save(_timm("fedlit_test_vit", num_classes=0, embed_dim=16).state_dict(), tmp_path / "vit16.pth")
    with pytest.raises(ValueError, match=r"have another shape.*cls_token \(1, 1, 32\) <- cls_token \(1, 1, 16\)"):
        TimmBackbone(name="fedlit_test_vit", checkpoint_path=tmp_path / "vit16.pth").build()


def test_by_position_maps_renamed_tensors(tmp_path, images: torch.Tensor) -> None:
    source = _timm("fedlit_test_cnn", num_classes=7)
    torch.save(_renamed(source.state_dict()), tmp_path / "renamed.pth")
    # Under other names, only the classifier keeps a recognizable name: rename the trailing pair to `_fc`.
    state = torch.load(tmp_path / "renamed.pth", weights_only=True)
    keys = list(state)
    state = {("_fc." + k.rsplit(".", 1)[-1] if k in keys[-2:] else k): v for k, v in state.items()}
    torch.save(state, tmp_path / "renamed.pth")
    with pytest.warns(UserWarning, match=r"by position\ndropped the checkpoint's classifier .*_fc\.weight, _fc\.bias"):
        model = TimmBackbone(name="fedlit_test_cnn", checkpoint_path=tmp_path / "renamed.pth", key_mapping="position")
        model = model.build()
    for key, value in model.state_dict().items():
        assert torch.equal(value, source.state_dict()[key]), key
    source.reset_classifier(0)
    assert torch.equal(model.eval()(images), source.eval()(images))


def test_by_position_pairs_counters_apart(tmp_path) -> None:
    source = _timm("fedlit_test_cnn", num_classes=0)
    weights_only = {k: v for k, v in _renamed(source.state_dict()).items() if not k.endswith("num_batches_tracked")}
    torch.save(weights_only, tmp_path / "no_counters.pth")
    model = _timm("fedlit_test_cnn", num_classes=0)
    report = load_checkpoint(model, tmp_path / "no_counters.pth", key_mapping="position")
    assert report.missing and all(key.endswith("num_batches_tracked") for key in report.missing)
    assert report.unexpected == []
    for key, value in model.state_dict().items():
        if not key.endswith("num_batches_tracked"):
            assert torch.equal(value, source.state_dict()[key]), key


def test_by_position_wrong_architecture_is_an_error(tmp_path) -> None:
    torch.save(_renamed(_timm("fedlit_test_vit", num_classes=0).state_dict()), tmp_path / "vit.pth")
    with pytest.raises(ValueError, match=r"same architecture") as error:
        load_checkpoint(_timm("fedlit_test_cnn", num_classes=0), tmp_path / "vit.pth", key_mapping="position")
    assert re.search(r"conv_stem\.weight \(8, 3, 3, 3\) <- other_impl\.layer0\.cls_token", str(error.value))


def test_read_state_dict_unwraps_nested_and_ddp(tmp_path) -> None:
    state = {"module.a.weight": torch.ones(2), "module.b.bias": torch.zeros(1)}
    torch.save({"state_dict": state, "epoch": 3}, tmp_path / "lightning.ckpt")
    loaded = read_state_dict(tmp_path / "lightning.ckpt")
    assert list(loaded) == ["a.weight", "b.bias"]
    assert torch.equal(loaded["a.weight"], torch.ones(2))


def test_read_state_dict_refuses_what_is_not_tensors(tmp_path) -> None:
    torch.save({"epoch": 3, "optimizer": {"lr": 0.1}}, tmp_path / "meta.pth")
    with pytest.raises(ValueError, match="not a state dict of tensors"):
        read_state_dict(tmp_path / "meta.pth")
    (tmp_path / "w.npz").write_bytes(b"")
    with pytest.raises(ValueError, match="unsupported suffix '.npz'"):
        read_state_dict(tmp_path / "w.npz")
    with pytest.raises(FileNotFoundError, match="no checkpoint file at"):
        read_state_dict(tmp_path / "absent.pth")


def test_pickled_code_is_refused(tmp_path) -> None:
    torch.save({"weight": torch.ones(1), "fn": print}, tmp_path / "code.pth")
    with pytest.raises(ValueError, match=r"weights_only=True"):
        read_state_dict(tmp_path / "code.pth")
