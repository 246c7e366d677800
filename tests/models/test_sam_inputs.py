"""SamAdapter's reference options (Medical-SAM-Adapter's code): the adapter layout that FedSCA numbers
(MLP, space, depth adapters in every block: K = 36 in ViT-B), unnormalized inputs, nearest upsampling, and click
prompts drawn from the masks in training (not in evaluation unless asked); on tiny random models."""

from __future__ import annotations

import pytest
import torch

from fedlit.core.errors import ConfigError
from fedlit.models import SamAdapter
from fedlit.models.sam.prompts import click_embedding, draw_clicks
from fedlit.strategies.fedsca import adapter_prefixes
from tests.models.test_sam_adapter import tiny_sam

OPTION = "model.init_args.network.init_args"


def twin(reference: torch.nn.Module, **options) -> torch.nn.Module:
    """A tiny SamAdapter with ``options`` and the weights of ``reference`` (keys both have)."""
    net = SamAdapter(variant="tiny", **options).build(reference.out_channels)
    net.load_state_dict({k: v for k, v in reference.state_dict().items() if k in net.state_dict()}, strict=False)
    return net


# --- adapter layout ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "layout, depth_adapters, kinds",
    [
        ("fedlit", False, ["Space_Adapter", "MLP_Adapter"]),
        ("fedlit", True, ["Depth_Adapter", "Space_Adapter", "MLP_Adapter"]),
        ("reference", False, ["MLP_Adapter", "Space_Adapter", "Depth_Adapter"]),
        ("reference", True, ["MLP_Adapter", "Space_Adapter", "Depth_Adapter"]),
    ],
)
def test_vit_b_adapters_in_fedscas_order(layout, depth_adapters, kinds):
    with torch.device("meta"):
        net = SamAdapter(variant="vit_b", adapter_layout=layout, depth_adapters=depth_adapters).build(1)
    expected = [f"image_encoder.blocks.{i}.{kind}" for i in range(12) for kind in kinds]
    assert net.adapter_names() == expected
    assert adapter_prefixes([n for n, _ in net.named_parameters()]) == expected  # what FedSCA ranks
    assert net.adapter_names("network.")[0] == "network." + expected[0]
    if layout == "reference":
        assert len(expected) == 36 and expected[0] == "image_encoder.blocks.0.MLP_Adapter"  # K = 36, A^1


def test_reference_layout_computes_the_same_and_its_2d_depth_adapters_never_train():
    torch.manual_seed(0)
    reference = SamAdapter(variant="tiny", adapter_layout="reference").build(1)
    fedlit = twin(reference)
    assert set(reference.state_dict()) - set(fedlit.state_dict()) == {
        f"image_encoder.blocks.{i}.Depth_Adapter.{fc}.{p}"
        for i in range(2)
        for fc in ("D_fc1", "D_fc2")
        for p in ("weight", "bias")
    }
    images = torch.rand(2, 1, 64, 64)
    logits = reference(images)
    assert torch.allclose(logits, fedlit(images), atol=1e-6)
    logits.sum().backward()
    grads = {n: p.grad for n, p in reference.named_parameters() if "_Adapter." in n}
    assert all((g is None) == ("Depth_Adapter" in n) for n, g in grads.items())


# --- input normalization and upsampling ----------------------------------------------------------------------------


@pytest.mark.parametrize("normalize", [True, False])
def test_the_encoder_gets_sams_normalized_pixels_or_the_images_as_they_are(normalize):
    net = SamAdapter(variant="tiny", normalize_input=normalize).build(1)
    seen = []
    net.image_encoder.patch_embed.register_forward_pre_hook(lambda _, args: seen.append(args[0]))
    images = torch.tensor([0.0, 0.5, 1.0, 0.25]).repeat(16 * 64).reshape(1, 1, 64, 64)
    net(images)
    grey = images.expand(-1, 3, -1, -1)
    if normalize:  # SAM's pixel mean and std for R, G, B on the 0-255 scale
        mean = torch.tensor([123.675, 116.28, 103.53]).view(1, 3, 1, 1)
        std = torch.tensor([58.395, 57.12, 57.375]).view(1, 3, 1, 1)
        expected = (grey * 255 - mean) / std
        assert seen[0][0, 0, 0, 1].item() == pytest.approx((127.5 - 123.675) / 58.395)
    else:
        expected = grey
    assert torch.allclose(seen[0], expected)


def test_nearest_upsampling_repeats_each_low_resolution_pixel():
    torch.manual_seed(0)
    bilinear = SamAdapter(variant="tiny").build(2)
    nearest = twin(bilinear, upsample="nearest")
    low = []
    decode = nearest._decode
    nearest._decode = lambda *args: low.append(decode(*args)) or low[-1]
    images = torch.rand(2, 1, 64, 48)
    out = nearest(images)
    assert low[0].shape == (2, 2, 32, 24)  # the decoder's masks: 4 x the 8 x 6 grid
    assert torch.equal(out, low[0].repeat_interleave(2, dim=-2).repeat_interleave(2, dim=-1))
    assert not torch.allclose(bilinear(images), out)
    with pytest.raises(ConfigError, match=f"{OPTION}.upsample='bicubic' is not one of"):
        SamAdapter(variant="tiny", upsample="bicubic")


# --- click prompts -------------------------------------------------------------------------------------------------


def test_clicks_are_drawn_from_the_foreground_as_x_y_and_background_when_empty():
    masks = torch.zeros(3, 2, 16, 20)
    masks[0, 1, 5, 9] = 1  # row 5, column 9, in the second channel
    masks[1, 0, 2:4, 10:12] = 1
    torch.manual_seed(0)
    points, labels = draw_clicks(masks)
    assert points[0].tolist() == [9, 5] and labels.tolist() == [1, 1, 0]
    drawn = {tuple(draw_clicks(masks[1:2])[0][0].tolist()) for _ in range(200)}
    assert drawn == {(10, 2), (11, 2), (10, 3), (11, 3)}
    assert 0 <= points[2, 0] < 20 and 0 <= points[2, 1] < 16


def test_click_embedding_is_sams_own_point_embedding():
    prompts = tiny_sam().prompt_encoder  # built for 64 x 64 images
    points, labels = torch.tensor([[9, 5], [40, 63]]), torch.tensor([1, 0])
    sams, _ = prompts(points=(points.float()[:, None], labels[:, None]), boxes=None, masks=None)
    assert torch.allclose(click_embedding(prompts, points, labels, (64, 64)), sams, atol=1e-6)


def test_click_prompts_need_the_masks_in_training_and_evaluation_is_unprompted_by_default():
    torch.manual_seed(0)
    clicked = SamAdapter(variant="tiny", prompt="click").build(1)
    images, masks = torch.rand(2, 1, 64, 64), torch.zeros(2, 1, 64, 64)
    assert clicked.training and clicked.needs_masks
    with pytest.raises(ConfigError, match="call network\\(images, masks\\)"):
        clicked(images)
    masks[:, :, 8, 8] = 1
    first = clicked(images, masks)
    masks[:, :, 8, 8], masks[:, :, 50, 40] = 0, 1
    assert first.shape == (2, 1, 64, 64) and not torch.allclose(first, clicked(images, masks))
    clicked.eval()
    assert not clicked.needs_masks and clicked.eval_prompt == "none"
    unprompted = twin(clicked).eval()
    with torch.no_grad():
        assert torch.allclose(clicked(images, masks), unprompted(images), atol=1e-6)
        assert torch.allclose(clicked(images), unprompted(images), atol=1e-6)
    with pytest.warns(UserWarning, match="eval_prompt=click draws each evaluation click from the ground-truth mask"):
        leaky = SamAdapter(variant="tiny", eval_prompt="click").build(1).eval()
    assert leaky.needs_masks and SamAdapter(variant="tiny", prompt="box").eval_prompt == "box"


def test_click_prompts_on_volumes_draw_one_click_per_slice():
    torch.manual_seed(0)
    net = SamAdapter(variant="tiny", prompt="click", depth_adapters=True, adapter_layout="reference").build(1)
    volume, masks = torch.rand(1, 1, 3, 64, 64), torch.zeros(1, 1, 3, 64, 64)
    masks[0, 0, 1, 20, 30] = 1
    logits = net(volume, masks)
    assert logits.shape == (1, 1, 3, 64, 64) and torch.isfinite(logits).all()


def test_the_segmentation_task_hands_the_masks_to_a_clicking_network():
    """``SegmentationModule`` passes the batch's masks to a network that draws clicks from them (training), and none
    to an unprompted evaluation: a training step and a validation step run."""
    from fedlit.tasks import SegmentationModule

    torch.manual_seed(0)
    module = SegmentationModule(network=SamAdapter(variant="tiny", prompt="click"), num_classes=1)
    images, masks = torch.rand(2, 1, 64, 64), torch.zeros(2, 1, 64, 64)
    masks[:, :, 20:30, 20:30] = 1
    module.train()
    out = module.training_step((images, masks), 0)
    assert out["logits"].shape == (2, 1, 64, 64) and torch.isfinite(out["loss"])
    module.eval()
    module.reset_metrics()
    with torch.no_grad():
        assert torch.isfinite(module.validation_step((images, masks), 0))
