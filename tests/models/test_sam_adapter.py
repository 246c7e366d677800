"""SamAdapter (Medical SAM Adapter): shapes, the adapter block against SAM's own block, adapter names and counts,
loading SAM-format checkpoints (exact reload, reports, interpolation, refusals), roles, volumes, and FedSCA on it
for two rounds with an exact resume."""

from __future__ import annotations

import copy
from functools import partial

import numpy as np
import pytest
import torch
from segment_anything.modeling import ImageEncoderViT, MaskDecoder, PromptEncoder, Sam, TwoWayTransformer
from segment_anything.modeling.image_encoder import Attention, Block
from torch import nn
from torch.nn import functional as F

from fedlit.core.errors import CheckpointError, ConfigError, DataError
from fedlit.core.roles import is_norm_module
from fedlit.data import SyntheticSegmentation
from fedlit.federation import Federation
from fedlit.models import SamAdapter
from fedlit.models.dry import skip_weight_loading
from fedlit.models.sam.adapter import AdapterBlock
from fedlit.models.sam.blocks import _attend
from fedlit.strategies import FedSCA
from fedlit.strategies.fedsca import adapter_prefixes
from fedlit.tasks import SegmentationModule
from tests.conftest import _equal


def tiny_sam(image_size: int = 64) -> Sam:
    """segment_anything's own ``Sam`` with the sizes of the ``tiny`` variant (written out here, not taken from
    fedlit), relative and absolute position tables randomized (SAM initializes them at zero)."""
    grid = image_size // 8
    sam = Sam(
        image_encoder=ImageEncoderViT(
            img_size=image_size,
            patch_size=8,
            embed_dim=64,
            depth=2,
            num_heads=2,
            mlp_ratio=4,
            out_chans=32,
            norm_layer=partial(nn.LayerNorm, eps=1e-6),
            use_rel_pos=True,
            global_attn_indexes=(1,),
            window_size=4,
        ),
        prompt_encoder=PromptEncoder(
            embed_dim=32, image_embedding_size=(grid, grid), input_image_size=(image_size, image_size), mask_in_chans=8
        ),
        mask_decoder=MaskDecoder(
            transformer_dim=32,
            num_multimask_outputs=3,
            iou_head_hidden_dim=32,
            transformer=TwoWayTransformer(depth=2, embedding_dim=32, num_heads=2, mlp_dim=64),
        ),
    )
    with torch.no_grad():
        for name, tensor in sam.named_parameters():
            if "rel_pos" in name or "pos_embed" in name:
                tensor.normal_()
    return sam


def adapter_fc2(net: nn.Module, kind: str = "") -> list[nn.Linear]:
    return [m.D_fc2 for n, m in net.named_modules() if n.endswith("_Adapter") and kind in n]


def zero_adapters(net: nn.Module, kind: str = "") -> None:
    with torch.no_grad():
        for fc2 in adapter_fc2(net, kind):
            fc2.weight.zero_()
            fc2.bias.zero_()


# --- shapes and errors ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "out_channels, shape, prompt", [(1, (64, 64), "none"), (2, (48, 40), "box"), (4, (80, 72), "none")]
)
def test_logits_have_the_input_size_and_one_channel_per_class(out_channels, shape, prompt):
    net = SamAdapter(variant="tiny", prompt=prompt).build(out_channels)
    logits = net(torch.rand(2, 1, *shape))
    assert logits.shape == (2, out_channels, *shape) and torch.isfinite(logits).all()


def test_three_channel_images_and_bad_inputs():
    assert SamAdapter(variant="tiny", in_channels=3).build(1)(torch.rand(1, 3, 64, 64)).shape == (1, 1, 64, 64)
    net = SamAdapter(variant="tiny").build(1)
    with pytest.raises(DataError, match="multiples of the patch size 8"):
        net(torch.rand(1, 1, 60, 64))
    with pytest.raises(DataError, match="1-channel images"):
        net(torch.rand(1, 3, 64, 64))
    with pytest.raises(ConfigError, match="depth_adapters to true"):
        net(torch.rand(1, 1, 2, 64, 64))


def test_bad_settings_are_named():
    with pytest.raises(ConfigError) as err:
        SamAdapter(variant="vit_bb", in_channels=2, prompt="points")
    message = str(err.value)
    assert "variant='vit_bb'" in message and "did you mean 'vit_b'" in message
    assert "in_channels=2" in message and "prompt='points'" in message
    with pytest.raises(ConfigError, match="image_size=100 must be a positive multiple of the patch size 16"):
        SamAdapter(variant="vit_b", image_size=100)
    with pytest.raises(ConfigError, match="num_classes=5 .* 4 mask tokens"):
        SamAdapter(variant="tiny").build(5)


# --- the adapter block against SAM's own modules -----------------------------------------------------------------


def test_with_zeroed_adapters_the_network_is_sam_itself():
    """Zeroed ``D_fc2``: the space adapter's skip passes the attention output unchanged and the MLP adapter adds
    0, so the network equals segment_anything's ``Sam`` loaded with the same weights (strictly: the keys map 1:1)."""
    net = SamAdapter(variant="tiny").build(2)
    zero_adapters(net)
    sam = tiny_sam().eval()
    sam.load_state_dict({k: v for k, v in net.state_dict().items() if "_Adapter" not in k}, strict=True)
    images = torch.rand(1, 1, 64, 64)
    with torch.no_grad():
        embeddings = sam.image_encoder(sam.preprocess(images.expand(-1, 3, -1, -1) * 255))
        sparse, dense = sam.prompt_encoder(points=None, boxes=None, masks=None)
        masks, _ = sam.mask_decoder.predict_masks(embeddings, sam.prompt_encoder.get_dense_pe(), sparse, dense)
        expected = F.interpolate(masks[:, :2], size=(64, 64), mode="bilinear", align_corners=False)
        assert torch.allclose(net(images), expected, atol=1e-5)
        # the box prompt: SAM's own box embedding of (0, 0, 63, 63)
        net.prompt = "box"
        sparse, dense = sam.prompt_encoder(points=None, boxes=torch.tensor([[0.0, 0.0, 63.0, 63.0]]), masks=None)
        masks, _ = sam.mask_decoder.predict_masks(embeddings, sam.prompt_encoder.get_dense_pe(), sparse, dense)
        expected = F.interpolate(masks[:, :2], size=(64, 64), mode="bilinear", align_corners=False)
        assert torch.allclose(net(images), expected, atol=1e-5)


def sam_block(window_size: int) -> Block:
    block = Block(
        dim=16,
        num_heads=2,
        norm_layer=partial(nn.LayerNorm, eps=1e-6),
        use_rel_pos=True,
        window_size=window_size,
        input_size=(4, 4),
    )
    with torch.no_grad():
        block.attn.rel_pos_h.normal_()
        block.attn.rel_pos_w.normal_()
    return block


@pytest.mark.parametrize("window_size", [0, 2])
def test_adapter_block_keeps_sams_submodules_and_equals_it_with_zeroed_adapters(window_size):
    plain = sam_block(window_size)
    block = AdapterBlock(copy.deepcopy(plain))
    assert [n for n, _ in block.named_children()] == ["norm1", "attn", "norm2", "mlp", "Space_Adapter", "MLP_Adapter"]
    assert set(plain.state_dict()) < set(block.state_dict())
    zero_adapters(block)
    x = torch.randn(2, 4, 4, 16)
    assert torch.allclose(block(x), plain(x), atol=1e-6)


def test_mlp_adapter_has_no_skip_and_weight_one_half():
    plain = sam_block(0)
    block = AdapterBlock(copy.deepcopy(plain))
    zero_adapters(block)
    c = torch.linspace(-1, 1, 16)
    with torch.no_grad():
        block.MLP_Adapter.D_fc2.bias.copy_(c)  # the MLP adapter now outputs c whatever its input
    x = torch.randn(2, 4, 4, 16)
    # 0.5 * c and nothing else: a skip would add 0.5 * norm2(x) too
    assert torch.allclose(block(x) - plain(x), (0.5 * c).expand(2, 4, 4, 16), atol=1e-5)
    scaled = AdapterBlock(copy.deepcopy(plain), mlp_adapter_scale=0.1)
    scaled.load_state_dict(block.state_dict())
    assert torch.allclose(scaled(x) - plain(x), (0.1 * c).expand(2, 4, 4, 16), atol=1e-5)


def test_space_adapter_adds_its_output_to_the_attention_output():
    plain = sam_block(0)
    block = AdapterBlock(copy.deepcopy(plain))
    zero_adapters(block)
    b = torch.linspace(-1, 1, 16)
    with torch.no_grad():
        block.Space_Adapter.D_fc2.bias.copy_(b)
    x = torch.randn(2, 4, 4, 16)
    # Written with SAM's modules: x1 = x + (y + b) with y = Attn(norm1 x) (the skip keeps y), then SAM's MLP.
    x1 = x + plain.attn(plain.norm1(x)) + b
    expected = x1 + plain.mlp(plain.norm2(x1))
    assert torch.allclose(block(x), expected, atol=1e-5)


def test_depth_attention_is_sams_attention_over_a_row_of_slices():
    attn = Attention(16, num_heads=2, use_rel_pos=False)
    tokens = torch.randn(5, 3, 16)  # 5 positions, 3 slices each
    assert torch.allclose(_attend(attn, tokens), attn(tokens.unsqueeze(1)).squeeze(1), atol=1e-6)


# --- adapters: names, order, counts --------------------------------------------------------------------------------


# One adapter of width D: D x D/4 + D/4 + D/4 x D + D parameters.
def adapter_size(width: int) -> int:
    return 2 * width * (width // 4) + width // 4 + width


@pytest.mark.parametrize("variant, width, blocks", [("vit_b", 768, 12), ("vit_l", 1024, 24)])
@pytest.mark.parametrize("depth_adapters", [False, True])
def test_adapter_order_and_counts_without_allocating(variant, width, blocks, depth_adapters):
    with torch.device("meta"):
        net = SamAdapter(variant=variant, depth_adapters=depth_adapters).build(1)
    assert all(p.is_meta for p in net.parameters())
    adapters = adapter_prefixes([n for n, _ in net.named_parameters()])
    kinds = ["Depth_Adapter", "Space_Adapter", "MLP_Adapter"][0 if depth_adapters else 1 :]
    assert adapters == [f"image_encoder.blocks.{i}.{kind}" for i in range(blocks) for kind in kinds]
    assert len(adapters) == {("vit_b", False): 24, ("vit_b", True): 36}.get((variant, depth_adapters), len(adapters))
    adapter_params = sum(p.numel() for n, p in net.named_parameters() if "_Adapter." in n)
    assert adapter_params == len(adapters) * adapter_size(width)
    if (variant, depth_adapters) == ("vit_b", False):
        assert adapter_params == 24 * 295_872 == 7_100_928
    qkv = net.image_encoder.blocks[3].attn.qkv.weight
    assert qkv.shape == (3 * width, width)


# --- checkpoints ---------------------------------------------------------------------------------------------------


def test_a_sam_checkpoint_reloads_exactly_and_only_the_adapters_are_reported(tmp_path):
    state = tiny_sam().state_dict()
    path = tmp_path / "sam_tiny.pth"
    torch.save({"model": state}, path)
    with pytest.warns(UserWarning, match="16 adapter tensors kept at initialization"):
        net = SamAdapter(variant="tiny", checkpoint=str(path)).build(1)
    loaded = net.state_dict()
    assert all(torch.equal(loaded[k], v) for k, v in state.items())
    report = net.load_report
    assert report.missing == [] and report.unexpected == [] and report.resized == {}
    assert len(report.loaded) == len(state)
    assert report.missing_adapters == [
        f"image_encoder.blocks.{i}.{kind}.{fc}.{p}"
        for i in range(2)
        for kind in ("Space_Adapter", "MLP_Adapter")
        for fc in ("D_fc1", "D_fc2")
        for p in ("weight", "bias")
    ]


def test_a_renamed_key_is_refused_by_default_and_reported_on_both_sides_below_min_loaded(tmp_path):
    state = tiny_sam().state_dict()
    state["image_encoder.blocks.1.attn.relative_position_h"] = state.pop("image_encoder.blocks.1.attn.rel_pos_h")
    path = tmp_path / "renamed.pth"
    torch.save(state, path)
    with pytest.raises(CheckpointError) as err:  # min_loaded 1.0: all 37 encoder tensors (adapters left out)
        SamAdapter(variant="tiny", checkpoint=str(path)).build(1)
    message = str(err.value)
    assert message.startswith(f"{path}: only 36 of the image encoder's 37 tensors are in the file")
    assert "['image_encoder.blocks.1.attn.relative_position_h']" in message
    assert "['image_encoder.blocks.1.attn.rel_pos_h']" in message
    with pytest.warns(UserWarning) as record:
        net = SamAdapter(variant="tiny", checkpoint=str(path), min_loaded=36 / 37).build(1)
    message = str(record[0].message)
    assert "1 model tensors not in the file keep their initialization: image_encoder.blocks.1.attn.rel_pos_h" in message
    assert "not used: image_encoder.blocks.1.attn.relative_position_h" in message
    assert net.load_report.missing == ["image_encoder.blocks.1.attn.rel_pos_h"]
    assert net.load_report.unexpected == ["image_encoder.blocks.1.attn.relative_position_h"]


def test_a_wrong_shape_is_refused_with_the_key_shapes_and_variant(tmp_path):
    state = tiny_sam().state_dict()
    state["image_encoder.blocks.0.attn.qkv.weight"] = torch.zeros(10, 64)
    path = tmp_path / "wrong.pth"
    torch.save(state, path)
    with pytest.raises(CheckpointError) as err:
        SamAdapter(variant="tiny", checkpoint=str(path)).build(1)
    message = str(err.value)
    assert str(path) in message and "image_encoder.blocks.0.attn.qkv.weight: (10, 64) in the file, (192, 64)" in message
    assert "Fix: set model.init_args.network.init_args.variant to the file's SAM variant" in message


def test_a_vit_l_file_into_vit_b_names_the_variant(tmp_path):
    state = {"image_encoder.patch_embed.proj.weight": torch.zeros(1024, 3, 16, 16)}
    path = tmp_path / "sam_vit_l.pth"
    torch.save(state, path)
    with torch.device("meta"):
        net = SamAdapter(variant="vit_b").build(1)
    from fedlit.models.sam.adapter import load_sam_checkpoint

    with pytest.raises(CheckpointError, match=r"\(1024, 3, 16, 16\) in the file, \(768, 3, 16, 16\).*variant: vit_l"):
        load_sam_checkpoint(net, path)


def linear_resize_by_hand(table: np.ndarray, length: int) -> np.ndarray:
    """Linear interpolation with half-pixel centres: output row i samples input position (i + 0.5) L / n - 0.5."""
    positions = (np.arange(length) + 0.5) * len(table) / length - 0.5
    return np.stack([np.interp(positions, np.arange(len(table)), column) for column in table.T], axis=1)


def test_position_tables_are_interpolated_from_another_image_size(tmp_path):
    state = tiny_sam(image_size=96).state_dict()  # grid 12: pos_embed (1, 12, 12, 64), global tables 23 rows
    path = tmp_path / "sam_96.pth"
    torch.save(state, path)
    with pytest.warns(UserWarning):
        net = SamAdapter(variant="tiny", checkpoint=str(path)).build(1)  # built for 64: grid 8, 15 rows
    attn = net.image_encoder.blocks[1].attn
    for axis in ("h", "w"):
        table = state[f"image_encoder.blocks.1.attn.rel_pos_{axis}"]
        expected = linear_resize_by_hand(table.numpy(), 15)
        assert np.allclose(getattr(attn, f"rel_pos_{axis}").detach().numpy(), expected, atol=1e-5)
    # the windowed block's tables (2 * 4 - 1 rows) do not depend on the image size
    assert torch.equal(net.image_encoder.blocks[0].attn.rel_pos_h, state["image_encoder.blocks.0.attn.rel_pos_h"])
    expected_pos = F.interpolate(state["image_encoder.pos_embed"].permute(0, 3, 1, 2), size=(8, 8), mode="bicubic")
    assert torch.allclose(net.image_encoder.pos_embed, expected_pos.permute(0, 2, 3, 1), atol=1e-6)
    assert set(net.load_report.resized) == {
        "image_encoder.pos_embed",
        "image_encoder.blocks.1.attn.rel_pos_h",
        "image_encoder.blocks.1.attn.rel_pos_w",
    }
    assert net.load_report.resized["image_encoder.pos_embed"] == ((1, 12, 12, 64), (1, 8, 8, 64))
    assert net.load_report.missing == []


def test_a_missing_checkpoint_says_where_to_get_sam_and_loading_can_be_skipped(tmp_path):
    spec = SamAdapter(variant="tiny", checkpoint=str(tmp_path / "sam_vit_b_01ec64.pth"))
    with pytest.raises(ConfigError) as err:
        spec.build(1)
    message = str(err.value)
    for part in (
        "model.init_args.network.init_args.checkpoint",
        "https://github.com/facebookresearch/segment-anything",
        "sam_vit_b_01ec64.pth",
        "https://github.com/bowang-lab/MedSAM",
        "medsam_vit_b.pth",
    ):
        assert part in message
    with skip_weight_loading():
        assert spec.build(1).load_report is None


# --- roles ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("train_mask_decoder", [True, False])
def test_default_roles_share_the_adapters_and_the_decoder_by_the_flag(train_mask_decoder):
    module = SegmentationModule(network=SamAdapter(variant="tiny", train_mask_decoder=train_mask_decoder))
    roles = module.parameter_roles()
    adapters = {n for n in roles if "_Adapter." in n}
    decoder = {n for n in roles if n.startswith("network.mask_decoder.")}
    assert len(adapters) == 16 and decoder
    assert set(roles.names("shared")) == adapters | (decoder if train_mask_decoder else set())
    assert set(roles.names("frozen")) == set(roles) - set(roles.names("shared"))
    assert not roles.names("personal")
    assert roles["network.prompt_encoder.pe_layer.positional_encoding_gaussian_matrix"] == "frozen"
    assert roles["network.image_encoder.blocks.1.attn.rel_pos_h"] == "frozen"


def test_prompt_encoder_is_frozen_and_the_neck_norms_are_norm_layers():
    module = SegmentationModule(network=SamAdapter(variant="tiny"))
    module.set_parameter_roles(module.parameter_roles())
    module.loss(module(torch.rand(2, 1, 64, 64)), torch.ones(2, 1, 64, 64)).backward()
    prompt = list(module.network.prompt_encoder.parameters())
    assert prompt and all(not p.requires_grad and p.grad is None for p in prompt)
    assert all(p.grad is not None for n, p in module.named_parameters() if "_Adapter." in n)
    net = module.network
    assert is_norm_module(net.image_encoder.neck[1], "image_encoder.neck.1")  # SAM's LayerNorm2d
    assert is_norm_module(net.mask_decoder.output_upscaling[1], "mask_decoder.output_upscaling.1")
    assert not is_norm_module(net.image_encoder.blocks[0].Space_Adapter.D_fc1, "Space_Adapter.D_fc1")
    assert not module.parameter_roles().is_norm("network.image_encoder.blocks.0.MLP_Adapter.D_fc2.bias")


# --- volumes -------------------------------------------------------------------------------------------------------


def test_depth_adapters_mix_slices_and_vanish_when_zeroed():
    net3d = SamAdapter(variant="tiny", depth_adapters=True).build(2)
    volume = torch.rand(1, 1, 3, 64, 64)
    logits = net3d(volume)
    assert logits.shape == (1, 2, 3, 64, 64)
    logits.sum().backward()
    assert all(fc2.weight.grad is not None for fc2 in adapter_fc2(net3d, "Depth"))
    with pytest.raises(ConfigError, match="set model.init_args.network.init_args.depth_adapters to false"):
        net3d(torch.rand(1, 1, 64, 64))
    with torch.no_grad():
        other = volume.clone()
        other[:, :, 2] = torch.rand(1, 1, 64, 64)
        assert not torch.allclose(net3d(other)[:, :, 0], logits[:, :, 0])  # slice 0 sees slice 2
        zero_adapters(net3d, "Depth")
        net2d = SamAdapter(variant="tiny").build(2)
        net2d.load_state_dict({k: v for k, v in net3d.state_dict().items() if "Depth_Adapter" not in k})
        out = net3d(volume)
        for k in range(3):
            assert torch.allclose(out[:, :, k], net2d(volume[:, :, k]), atol=1e-5)


# --- FedSCA end to end ---------------------------------------------------------------------------------------------


def sam_federation(out_dir, rounds):
    torch.manual_seed(0)
    module = SegmentationModule(network=SamAdapter(variant="tiny"), loss="bce", lr=0.01)
    data = SyntheticSegmentation(
        num_clients=3, samples_per_client=4, image_size=64, split_fractions=(0.5, 0.25, 0.25), batch_size=2
    )
    return Federation(
        module,
        data,
        FedSCA(alpha=1.0, beta=0.5),
        rounds=rounds,
        out_dir=out_dir,
        progress_bar=False,
        seed=0,
        accelerator="cpu",
    )


def test_fedsca_on_sam_adapter_shares_the_lowest_adapter_and_resumes_exactly(tmp_path):
    straight = sam_federation(tmp_path / "straight", rounds=2)
    initial = {n: t.detach().clone() for n, t in straight.module.state_dict().items()}
    results = straight.fit()
    prefix = "network.image_encoder.blocks.0.Space_Adapter."
    assert set(straight.strategy.global_state) == {
        f"{prefix}{fc}.{p}" for fc in ("D_fc1", "D_fc2") for p in ("weight", "bias")
    }
    assert not torch.equal(straight.strategy.global_state[f"{prefix}D_fc1.weight"], initial[f"{prefix}D_fc1.weight"])
    client = straight.store.tensors(straight.client_ids[0])
    assert "network.mask_decoder.iou_token.weight" in client  # personal: trained, kept by the client
    assert torch.equal(
        straight.module.state_dict()["network.image_encoder.blocks.0.attn.qkv.weight"],
        initial["network.image_encoder.blocks.0.attn.qkv.weight"],
    )  # frozen

    sam_federation(tmp_path / "resumed", rounds=1).fit()
    torch.manual_seed(1234)
    second = sam_federation(tmp_path / "resumed", rounds=2)
    resumed = second.fit(ckpt_path=tmp_path / "resumed" / "checkpoints" / "last.ckpt")
    assert resumed["last"] == results["last"]
    for client_id in straight.client_ids:
        a, b = straight.store.tensors(client_id), second.store.tensors(client_id)
        assert a.keys() == b.keys() and all(torch.equal(a[n], b[n]) for n in a)
    assert _equal(straight.strategy.state_dict(), second.strategy.state_dict())
