"""Loading SAM checkpoints into SamAdapter: SAM ViT-B's 314 keys all load, and a file that leaves the image encoder
(partly) random is refused naming the file, its unmatched keys and the prefix that would make them match."""

from __future__ import annotations

import pytest
import torch
from segment_anything import sam_model_registry

from fedlit.core.errors import CheckpointError, ConfigError
from fedlit.models import SamAdapter
from fedlit.models.sam.checkpoint import key_prefix_fix, load_sam_checkpoint
from tests.models.test_sam_adapter import tiny_sam

OPTION = "model.init_args.network.init_args"


def test_sam_vit_b_loads_314_of_314_keys_and_fills_the_whole_encoder(tmp_path):
    with torch.device("meta"):  # SAM's own ViT-B (segment_anything.build_sam), saved without data
        state = sam_model_registry["vit_b"]().state_dict()
        net = SamAdapter(variant="vit_b", image_size=1024).build(1)
    path = tmp_path / "sam_vit_b_meta.pth"
    torch.save(state, path)
    with pytest.warns(UserWarning, match="96 adapter tensors kept at initialization"):  # 24 adapters x 4
        report = load_sam_checkpoint(net, path)
    assert len(state) == 314 and len(report.loaded) == 314
    assert report.missing == [] and report.unexpected == [] and report.resized == {}


@pytest.mark.parametrize("prefix, extra", [("sam.", {}), ("model.", {}), ("module.", {"step": torch.zeros(())})])
def test_prefixed_keys_are_refused_naming_the_prefix_and_load_once_it_is_given(tmp_path, prefix, extra):
    state = tiny_sam().state_dict()
    path = tmp_path / "prefixed.pth"
    torch.save({**{prefix + k: v for k, v in state.items()}, **extra}, path)
    with pytest.raises(CheckpointError) as err:
        SamAdapter(variant="tiny", checkpoint=str(path)).build(1)
    message = str(err.value)
    assert message.startswith(
        f"{path}: only 0 of the image encoder's 37 tensors are in the file ({OPTION}.min_loaded=1.0 needs 37)"
    )
    assert f"First unmatched file keys: ['{prefix}image_encoder.pos_embed'" in message
    assert f"the file's keys carry the prefix '{prefix}': set {OPTION}.checkpoint_key_prefix: '{prefix}'" in message
    with pytest.warns(UserWarning, match="16 adapter tensors kept"):
        net = SamAdapter(variant="tiny", checkpoint=str(path), checkpoint_key_prefix=prefix).build(1)
    loaded = net.state_dict()
    assert all(torch.equal(loaded[k], v) for k, v in state.items())
    assert net.load_report.missing == [] and net.load_report.unexpected == list(extra)


def test_an_encoder_saved_alone_is_told_which_prefix_its_keys_lack(tmp_path):
    state = {
        k.removeprefix("image_encoder."): v
        for k, v in tiny_sam().state_dict().items()
        if k.startswith("image_encoder.")
    }
    path = tmp_path / "encoder.pth"
    torch.save(state, path)
    with pytest.raises(CheckpointError, match="the file's keys lack the prefix 'image_encoder.'"):
        SamAdapter(variant="tiny", checkpoint=str(path)).build(1)


def test_min_loaded_zero_keeps_the_old_warning_and_bad_values_are_named(tmp_path):
    path = tmp_path / "other.pth"
    torch.save({"backbone.weight": torch.zeros(2)}, path)
    with pytest.warns(UserWarning, match="1 tensors of the file were not used: backbone.weight"):
        net = SamAdapter(variant="tiny", checkpoint=str(path), min_loaded=0.0).build(1)
    assert net.load_report.loaded == []
    with pytest.raises(CheckpointError, match=r"only 0 of .* Fix: give an original SAM or MedSAM checkpoint"):
        SamAdapter(variant="tiny", checkpoint=str(path)).build(1)
    for bad in (1.5, -0.1, True, "all"):
        with pytest.raises(ConfigError, match=f"{OPTION}.min_loaded=.* must be a share between 0 and 1"):
            SamAdapter(variant="tiny", min_loaded=bad)


def test_key_prefix_fix_by_hand():
    model = {"image_encoder.blocks.0.attn.qkv.weight", "image_encoder.pos_embed", "mask_decoder.iou_token.weight"}
    assert key_prefix_fix(["sam.image_encoder.pos_embed", "sam.mask_decoder.iou_token.weight"], model) == (
        "strip",
        "sam.",
    )
    assert key_prefix_fix(["module.sam.image_encoder.pos_embed"], model) == ("strip", "module.sam.")
    assert key_prefix_fix(["blocks.0.attn.qkv.weight", "pos_embed"], model) == ("add", "image_encoder.")
    assert key_prefix_fix(["head.weight"], model) is None
