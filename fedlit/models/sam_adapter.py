"""Medical SAM Adapter: a Segment Anything model whose image encoder trains only small bottleneck adapters.

Papers:

- Kirillov, Mintun, Ravi, Mao, Rolland, Gustafson, Xiao, Whitehead, Berg, Lo, Dollar, Girshick, "Segment
  Anything", ICCV 2023 (the ViT image encoder, prompt encoder and mask decoder);
- Wu, Wang, Fu, Jiang, Xu, Liu, Jin, Arbel, "Medical SAM Adapter: Adapting Segment Anything Model for Medical
  Image Segmentation", Medical Image Analysis 2025 (arXiv 2304.12620) (the adapters, below);
- Ma, He, Li, Han, You, Wang, "Segment anything in medical images", Nature Communications 2024 (MedSAM, whose
  ``medsam_vit_b.pth`` has SAM's keys and loads here like SAM's own checkpoints).

Built on Meta's ``segment-anything`` package rather than transformers' ``SamModel``: the keys of the original
``.pth`` files (``image_encoder.blocks.3.attn.qkv.weight``, ``prompt_encoder.*``, ``mask_decoder.*``) map 1:1 onto
its modules, and its encoder blocks are plain modules whose submodules (``norm1``, ``attn``, ``norm2``, ``mlp``) an
adapter block keeps under their names, so a checkpoint loads by key with nothing renamed.

Adapter (MSA's ``Adapter``): ``Linear(D, D/4) -> GELU -> Linear(D/4, D)`` (``D_fc1``, ``D_fc2``). Each encoder
block, with ``A_s``, ``A_m``, ``A_d`` its ``Space_Adapter``, ``MLP_Adapter`` and ``Depth_Adapter``:

    y = Attn(norm1 x);  x = x + (y + A_s(y)) [+ A_d(Attn_depth(norm1 x))];
    x = x + MLP(norm2 x) + s A_m(norm2 x),    s = ``mlp_adapter_scale`` (0.5).

The space adapter has its own skip; the MLP and depth adapters have none. With ``depth_adapters=True`` the input
is a volume (B, C, D, H, W): its D slices go through the encoder as one batch and, in every block, the depth
branch ``Attn_depth`` attends over the D slices at each spatial position with the block's own ``qkv`` and ``proj``
projections, then ``A_d`` adds its output to the spatial branch before the residual, as MSA does. Adapters are
registered in the order they run (depth, space, MLP), so fedlit's adapter order (by block, then registration,
as FedSCA reads it) is ``blocks.0.Space_Adapter, blocks.0.MLP_Adapter, blocks.1...`` (24 adapters in ViT-B; 36
with depth adapters).

Images (B, C, H, W) of floats in [0, 1] (grey ones repeated to 3 channels) are scaled by 255 and normalized
with SAM's pixel mean and std. H and W must be multiples of the patch size (16) but need not be the built
``image_size``: the absolute position embedding is resized (bicubic) to the input's grid on the fly, SAM resizes
the relative position tables of its global-attention blocks itself, and the prompt encoder's dense positional
encoding is computed for the actual grid; so training crops of 320 and test images of 384 go through the same
model. The frozen prompt encoder gives no prompt (``prompt: none``) or a box around the whole image (``box``);
the mask decoder's first ``out_channels`` mask tokens give the low-resolution masks, upsampled (bilinear) to the
input size.

Deviations from MSA's code: the depth branch attends over the D slices as one sequence without relative
positions (MSA folds them into a small 2-D grid and reuses the windowed block's tables); every checkpoint key
is loaded or reported (MSA's loading leaves the relative position tables at zero through a name mismatch).
"""

from __future__ import annotations

import difflib
import warnings
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Literal

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from fedlit.core.errors import CheckpointError, ConfigError, DataError
from fedlit.core.roles import RoleRule
from fedlit.models.dry import weight_loading_enabled
from fedlit.models.unet import SegmentationNetwork

__all__ = ["VARIANTS", "Adapter", "AdapterBlock", "SamAdapter", "SamAdapterNet", "SamLoadReport",
           "load_sam_checkpoint", "resize_pos_embed", "resize_rel_pos"]

_OPTION = "model.init_args.network.init_args"
# SAM's pixel statistics, on the 0-255 scale (segment_anything.modeling.Sam).
PIXEL_MEAN = (123.675, 116.28, 103.53)
PIXEL_STD = (58.395, 57.12, 57.375)
_GET_WEIGHTS = (
    "SAM: https://github.com/facebookresearch/segment-anything (e.g. sam_vit_b_01ec64.pth for variant vit_b); "
    "MedSAM: https://github.com/bowang-lab/MedSAM (medsam_vit_b.pth, variant vit_b). Download the file on a "
    "machine with internet access, put it on this machine (e.g. under checkpoints/) and give its path"
)


@dataclass(frozen=True)
class _Variant:
    width: int
    depth: int
    heads: int
    global_attention: tuple[int, ...]
    patch: int = 16
    window: int = 14
    image_size: int = 1024
    prompt_dim: int = 256
    decoder_depth: int = 2
    decoder_mlp: int = 2048
    decoder_heads: int = 8
    iou_hidden: int = 256
    mask_in_chans: int = 16


VARIANTS: dict[str, _Variant] = {
    "vit_b": _Variant(width=768, depth=12, heads=12, global_attention=(2, 5, 8, 11)),
    "vit_l": _Variant(width=1024, depth=24, heads=16, global_attention=(5, 11, 17, 23)),
    "vit_h": _Variant(width=1280, depth=32, heads=16, global_attention=(7, 15, 23, 31)),
    # For tests and quick runs: block 0 windowed, block 1 global, 64-pixel images on an 8 x 8 grid.
    "tiny": _Variant(width=64, depth=2, heads=2, global_attention=(1,), patch=8, window=4, image_size=64,
                     prompt_dim=32, decoder_mlp=64, decoder_heads=2, iou_hidden=32, mask_in_chans=8),
}
"""SAM's encoder and decoder sizes per ``variant`` (segment_anything.build_sam), plus a tiny one."""

_NUM_MASK_TOKENS = 4  # SAM's decoder: 1 single-mask token + 3 multimask tokens


class Adapter(nn.Module):
    """MSA's bottleneck: ``D_fc2(GELU(D_fc1 x))``, plus ``x`` when ``skip`` (the space adapter's own skip)."""

    def __init__(self, dim: int, *, ratio: float = 0.25, skip: bool = True) -> None:
        super().__init__()
        hidden = int(dim * ratio)
        self.D_fc1 = nn.Linear(dim, hidden)
        self.act = nn.GELU()
        self.D_fc2 = nn.Linear(hidden, dim)
        self.skip = skip

    def forward(self, x: Tensor) -> Tensor:
        out = self.D_fc2(self.act(self.D_fc1(x)))
        return x + out if self.skip else out


class AdapterBlock(nn.Module):
    """A ``segment_anything`` encoder ``Block`` with MSA's adapters; its ``norm1``, ``attn``, ``norm2`` and
    ``mlp`` are the original block's modules, so SAM's checkpoint keys stay the same.

    Args:
        block: The SAM block whose submodules are kept.
        depth_adapter: Add the ``Depth_Adapter`` (3-D inputs).
        mlp_adapter_scale: ``s``, the weight of the MLP adapter's output.
    """

    def __init__(self, block: nn.Module, *, depth_adapter: bool = False, mlp_adapter_scale: float = 0.5) -> None:
        super().__init__()
        dim = block.norm1.normalized_shape[0]
        self.norm1, self.attn, self.norm2, self.mlp = block.norm1, block.attn, block.norm2, block.mlp
        self.window_size = block.window_size
        # Registered in the order they run (depth, space, MLP): FedSCA ranks adapters of a block by this order.
        if depth_adapter:
            self.Depth_Adapter = Adapter(dim, skip=False)
        self.Space_Adapter = Adapter(dim)
        self.MLP_Adapter = Adapter(dim, skip=False)
        self.mlp_adapter_scale = mlp_adapter_scale

    def forward(self, x: Tensor, depth: int | None = None) -> Tensor:
        """(N, h, w, C) tokens -> the same shape; ``depth`` = slices per volume (N = volumes * depth) or None."""
        from segment_anything.modeling.image_encoder import window_partition, window_unpartition

        shortcut = x
        across_slices = None
        if depth is not None:
            n, h, w, c = x.shape
            columns = x.reshape(n // depth, depth, h, w, c).permute(0, 2, 3, 1, 4).reshape(-1, depth, c)
            columns = self.Depth_Adapter(_attend(self.attn, self.norm1(columns)))
            across_slices = columns.reshape(n // depth, h, w, depth, c).permute(0, 3, 1, 2, 4).reshape(n, h, w, c)
        x = self.norm1(x)
        if self.window_size > 0:
            size = x.shape[1:3]
            x, padded = window_partition(x, self.window_size)
        x = self.Space_Adapter(self.attn(x))
        if self.window_size > 0:
            x = window_unpartition(x, self.window_size, padded, size)
        if across_slices is not None:
            x = x + across_slices
        x = shortcut + x
        normed = self.norm2(x)
        return x + self.mlp(normed) + self.mlp_adapter_scale * self.MLP_Adapter(normed)


def _attend(attn: nn.Module, tokens: Tensor) -> Tensor:
    """SAM ``Attention``'s projections over (N, L, C) token sequences, without relative positions."""
    n, length, c = tokens.shape
    q, k, v = attn.qkv(tokens).reshape(n, length, 3, attn.num_heads, -1).permute(2, 0, 3, 1, 4).unbind(0)
    out = F.scaled_dot_product_attention(q, k, v)  # softmax(q k^T / sqrt(head_dim)) v, SAM's attn.scale
    return attn.proj(out.transpose(1, 2).reshape(n, length, c))


def resize_pos_embed(pos_embed: Tensor, grid: tuple[int, int]) -> Tensor:
    """SAM's (1, h, w, C) absolute position embedding resized (bicubic) to ``grid``."""
    if tuple(pos_embed.shape[1:3]) == tuple(grid):
        return pos_embed
    resized = F.interpolate(pos_embed.permute(0, 3, 1, 2), size=tuple(grid), mode="bicubic", align_corners=False)
    return resized.permute(0, 2, 3, 1)


def resize_rel_pos(table: Tensor, length: int) -> Tensor:
    """A (L, head_dim) relative position table resized (linear, as SAM's ``get_rel_pos``) to ``length`` rows."""
    return F.interpolate(table.T.unsqueeze(0), size=length, mode="linear", align_corners=False)[0].T


@dataclass
class SamLoadReport:
    """What loading a SAM checkpoint did with each tensor.

    Attributes:
        path: The file read.
        loaded: Model keys that received the file's tensor.
        resized: Model key -> (file shape, model shape) for the tensors interpolated on the way (``pos_embed``,
            relative position tables of global-attention blocks).
        missing_adapters: Adapter tensors the file lacks: they keep their initialization (expected with SAM).
        missing: Other model keys not in the file: they keep their initialization.
        unexpected: File keys that were not used.
    """

    path: Path
    loaded: list[str] = field(default_factory=list)
    resized: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] = field(default_factory=dict)
    missing_adapters: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        """True when every model tensor was loaded and every file tensor used."""
        return not (self.missing_adapters or self.missing or self.unexpected)

    def summary(self) -> str:
        """One line per kind of tensor; every non-adapter key not loaded is named."""
        lines = [f"loaded {len(self.loaded)} tensors from {self.path}"]
        if self.resized:
            lines.append(f"interpolated {len(self.resized)} to the built image size: " + ", ".join(
                f"{k} {old} -> {new}" for k, (old, new) in self.resized.items()))
        if self.missing_adapters:
            lines.append(f"{len(self.missing_adapters)} adapter tensors kept at initialization (not in the file)")
        if self.missing:
            lines.append(f"{len(self.missing)} model tensors not in the file keep their initialization: "
                         + ", ".join(self.missing))
        if self.unexpected:
            lines.append(f"{len(self.unexpected)} tensors of the file were not used: " + ", ".join(self.unexpected))
        return "\n".join(lines)


class SamAdapter(SegmentationNetwork):
    """SAM with Medical-SAM-Adapter's adapters in every image-encoder block (see the module docstring).

    Default roles (:meth:`SamAdapterNet.default_role_rules`): everything frozen, the adapters shared, and the
    mask decoder shared when ``train_mask_decoder`` (as in MSA), else frozen.

    Args:
        variant: ``vit_b``, ``vit_l``, ``vit_h`` (SAM's encoders) or ``tiny`` (2 blocks of width 64, patch 8,
            64-pixel images: tests and quick runs). Must match the checkpoint's.
        checkpoint: Path of an original SAM or MedSAM ``.pth`` (keys ``image_encoder.*``, ``prompt_encoder.*``,
            ``mask_decoder.*``, possibly under ``model`` or ``state_dict``), or None (random initialization).
            Nothing downloads.
        image_size: Side of the square images the model is built for (``pos_embed`` and the relative position
            tables are interpolated to it when loading); default 1024 (64 for ``tiny``). Other sizes that are
            multiples of the patch size also run.
        in_channels: Channels of the input images: 1 (repeated to RGB) or 3.
        prompt: ``none`` (no sparse prompt) or ``box`` (a box around the whole image).
        train_mask_decoder: Whether the default roles train (share) the mask decoder.
        depth_adapters: Add MSA's depth adapters; inputs must then be volumes (B, C, D, H, W).
        mlp_adapter_scale: Weight of the MLP adapter's output (0.5 in MSA).
    """

    def __init__(self, *, variant: Literal["vit_b", "vit_l", "vit_h", "tiny"] = "vit_b",
                 checkpoint: str | None = None, image_size: int | None = None, in_channels: int = 1,
                 prompt: Literal["none", "box"] = "none", train_mask_decoder: bool = True,
                 depth_adapters: bool = False, mlp_adapter_scale: float = 0.5) -> None:
        if isinstance(checkpoint, str) and checkpoint.strip() in ("", "None", "null", "none", "~"):
            # jsonargparse turns `--model.init_args.network.init_args.checkpoint null` (an option of a class nested
            # in a class) into the string 'None': read it, and an empty string, as no checkpoint
            checkpoint = None
        problems = []
        if variant not in VARIANTS:
            close = difflib.get_close_matches(str(variant), VARIANTS, n=1)
            problems.append(f"{_OPTION}.variant={variant!r} is not one of {list(VARIANTS)}"
                            + (f" (did you mean {close[0]!r}?)" if close else ""))
        else:
            patch = VARIANTS[variant].patch
            size = VARIANTS[variant].image_size if image_size is None else image_size
            if isinstance(size, bool) or not isinstance(size, int) or size < patch or size % patch:
                problems.append(f"{_OPTION}.image_size={image_size!r} must be a positive multiple of the patch "
                                f"size {patch} of variant {variant!r}")
        if in_channels not in (1, 3) or isinstance(in_channels, bool):
            problems.append(f"{_OPTION}.in_channels={in_channels!r} must be 1 (grey, repeated to RGB) or 3")
        if prompt not in ("none", "box"):
            problems.append(f"{_OPTION}.prompt={prompt!r} is not one of ['none', 'box']")
        if not isinstance(mlp_adapter_scale, int | float) or isinstance(mlp_adapter_scale, bool):
            problems.append(f"{_OPTION}.mlp_adapter_scale={mlp_adapter_scale!r} must be a number")
        if problems:
            raise ConfigError("SamAdapter: " + "; ".join(problems) + ".")
        self.variant, self.checkpoint = variant, checkpoint
        self.image_size = VARIANTS[variant].image_size if image_size is None else image_size
        self.in_channels, self.prompt = in_channels, prompt
        self.train_mask_decoder, self.depth_adapters = bool(train_mask_decoder), bool(depth_adapters)
        self.mlp_adapter_scale = float(mlp_adapter_scale)

    def build(self, out_channels: int) -> SamAdapterNet:
        if out_channels > _NUM_MASK_TOKENS:
            raise ConfigError(f"SamAdapter: model.init_args.num_classes={out_channels} but SAM's mask decoder has "
                              f"{_NUM_MASK_TOKENS} mask tokens (one output channel each); give at most "
                              f"{_NUM_MASK_TOKENS}.")
        net = SamAdapterNet(self, out_channels)
        if self.checkpoint is not None and weight_loading_enabled():
            net.load_report = load_sam_checkpoint(net, self.checkpoint)
        return net


class SamAdapterNet(nn.Module):
    """The built network: ``image_encoder``, ``prompt_encoder`` and ``mask_decoder`` as in SAM's ``Sam``.

    ``forward`` maps (B, C, H, W) images in [0, 1] (or (B, C, D, H, W) volumes with depth adapters) to
    (B, out_channels, H, W) (or (B, out_channels, D, H, W)) logits. ``load_report`` tells what loading the
    checkpoint did (None without a checkpoint).
    """

    def __init__(self, spec: SamAdapter, out_channels: int) -> None:
        from segment_anything.modeling import ImageEncoderViT, MaskDecoder, PromptEncoder, TwoWayTransformer

        super().__init__()
        v = VARIANTS[spec.variant]
        grid = spec.image_size // v.patch
        self.image_encoder = ImageEncoderViT(
            img_size=spec.image_size, patch_size=v.patch, embed_dim=v.width, depth=v.depth, num_heads=v.heads,
            mlp_ratio=4, out_chans=v.prompt_dim, qkv_bias=True, norm_layer=partial(nn.LayerNorm, eps=1e-6),
            use_rel_pos=True, global_attn_indexes=v.global_attention, window_size=v.window)
        for i, block in enumerate(self.image_encoder.blocks):
            self.image_encoder.blocks[i] = AdapterBlock(block, depth_adapter=spec.depth_adapters,
                                                        mlp_adapter_scale=spec.mlp_adapter_scale)
        self.prompt_encoder = PromptEncoder(embed_dim=v.prompt_dim, image_embedding_size=(grid, grid),
                                            input_image_size=(spec.image_size, spec.image_size),
                                            mask_in_chans=v.mask_in_chans)
        self.prompt_encoder.requires_grad_(False)
        self.mask_decoder = MaskDecoder(
            transformer_dim=v.prompt_dim, num_multimask_outputs=_NUM_MASK_TOKENS - 1, iou_head_depth=3,
            iou_head_hidden_dim=v.iou_hidden,
            transformer=TwoWayTransformer(depth=v.decoder_depth, embedding_dim=v.prompt_dim,
                                          num_heads=v.decoder_heads, mlp_dim=v.decoder_mlp))
        self.out_channels, self.patch_size, self.in_channels = out_channels, v.patch, spec.in_channels
        self.prompt, self.depth_adapters = spec.prompt, spec.depth_adapters
        self.train_mask_decoder = spec.train_mask_decoder
        self.load_report: SamLoadReport | None = None

    def default_role_rules(self, prefix: str = "") -> list[RoleRule]:
        """Everything frozen, the adapters shared, the mask decoder shared when ``train_mask_decoder``.

        Args:
            prefix: This network's name in the model, with its dot (``network.``).
        """
        rules = [RoleRule(f"{prefix}*", "frozen"), RoleRule(f"{prefix}image_encoder.blocks.*_Adapter.*", "shared")]
        if self.train_mask_decoder:
            rules.append(RoleRule(f"{prefix}mask_decoder.*", "shared"))
        return rules

    def forward(self, images: Tensor) -> Tensor:
        """(B, C, H, W) -> (B, out_channels, H, W) logits; (B, C, D, H, W) -> (B, out_channels, D, H, W)."""
        if images.ndim == 5:
            if not self.depth_adapters:
                raise ConfigError(f"SamAdapter got volumes of shape {tuple(images.shape)} but has no depth "
                                  f"adapters: set {_OPTION}.depth_adapters to true, or give 2-D images.")
            b, c, d, h, w = images.shape
            logits = self._segment(images.transpose(1, 2).reshape(b * d, c, h, w), depth=d)
            return logits.reshape(b, d, -1, h, w).transpose(1, 2)
        if images.ndim != 4:
            raise DataError(f"SamAdapter expects images (B, C, H, W), got shape {tuple(images.shape)}.")
        if self.depth_adapters:
            raise ConfigError(f"SamAdapter has depth adapters but got 2-D images of shape {tuple(images.shape)}: "
                              f"the depth adapters would never train; set {_OPTION}.depth_adapters to false (or "
                              "give volumes (B, C, D, H, W)).")
        return self._segment(images, depth=None)

    def _segment(self, images: Tensor, depth: int | None) -> Tensor:
        n, c, h, w = images.shape
        if c != self.in_channels or h % self.patch_size or w % self.patch_size:
            raise DataError(f"SamAdapter expects {self.in_channels}-channel images ({_OPTION}.in_channels) whose "
                            f"sides are multiples of the patch size {self.patch_size}, got {tuple(images.shape)}; "
                            "resize or crop the images, or set in_channels.")
        if c == 1:
            images = images.expand(-1, 3, -1, -1)
        mean = images.new_tensor(PIXEL_MEAN).view(1, 3, 1, 1)
        std = images.new_tensor(PIXEL_STD).view(1, 3, 1, 1)
        embeddings = self._encode((images * 255 - mean) / std, depth)
        grid = embeddings.shape[-2:]
        prompts = self.prompt_encoder
        image_pe = prompts.pe_layer(tuple(grid)).unsqueeze(0).to(embeddings.dtype)
        dense = prompts.no_mask_embed.weight.reshape(1, -1, 1, 1).expand(n, -1, *grid)
        masks = self._decode(embeddings, image_pe, self._sparse_prompt(n, h, w), dense)
        return F.interpolate(masks, size=(h, w), mode="bilinear", align_corners=False)

    def _encode(self, x: Tensor, depth: int | None) -> Tensor:
        encoder = self.image_encoder
        x = encoder.patch_embed(x)
        x = x + resize_pos_embed(encoder.pos_embed, tuple(x.shape[1:3]))
        for block in encoder.blocks:
            x = block(x, depth)
        return encoder.neck(x.permute(0, 3, 1, 2))

    def _sparse_prompt(self, n: int, h: int, w: int) -> Tensor:
        prompts = self.prompt_encoder
        weight = prompts.not_a_point_embed.weight
        if self.prompt == "none":
            return weight.new_zeros(n, 0, prompts.embed_dim)
        # SAM's box embedding (PromptEncoder._embed_boxes) of the box (0, 0, W - 1, H - 1), normalized by the
        # actual image size rather than the built one.
        corners = weight.new_tensor([[[0.5, 0.5], [w - 0.5, h - 0.5]]])
        embedding = prompts.pe_layer.forward_with_coords(corners, (h, w))
        embedding = embedding + torch.cat([prompts.point_embeddings[2].weight, prompts.point_embeddings[3].weight])
        return embedding.expand(n, -1, -1)

    def _decode(self, embeddings: Tensor, image_pe: Tensor, sparse: Tensor, dense: Tensor) -> Tensor:
        """SAM's ``MaskDecoder.predict_masks`` for one prompt per image (SAM's repeats every image once per
        prompt of the batch), keeping the first ``out_channels`` mask tokens."""
        decoder = self.mask_decoder
        n, channels, gh, gw = embeddings.shape
        tokens = torch.cat([decoder.iou_token.weight, decoder.mask_tokens.weight]).unsqueeze(0).expand(n, -1, -1)
        tokens = torch.cat([tokens, sparse.to(tokens.dtype)], dim=1)
        hs, src = decoder.transformer(embeddings + dense, image_pe, tokens)
        upscaled = decoder.output_upscaling(src.transpose(1, 2).reshape(n, channels, gh, gw))
        hyper = torch.stack([decoder.output_hypernetworks_mlps[i](hs[:, 1 + i]) for i in range(self.out_channels)],
                            dim=1)
        return (hyper @ upscaled.flatten(2)).view(n, self.out_channels, *upscaled.shape[-2:])


def load_sam_checkpoint(net: SamAdapterNet, path: str | Path) -> SamLoadReport:
    """Copy an original SAM/MedSAM state dict into ``net`` by key and shape, interpolating ``pos_embed`` and the
    global-attention relative position tables to the built size, and warn about every key not loaded.

    Raises:
        ConfigError: The file does not exist.
        CheckpointError: It cannot be read, or a shape differs in a way interpolation cannot explain.
    """
    from fedlit.models.pretrained import read_state_dict

    path = Path(path).expanduser()
    if not path.is_file():
        raise ConfigError(f"{_OPTION}.checkpoint={str(path)!r}: no such file ({path.resolve()}). Get SAM or MedSAM "
                          f"weights: {_GET_WEIGHTS} as {_OPTION}.checkpoint; or set it to null (random weights).")
    try:
        state = read_state_dict(path)
    except ValueError as error:
        raise CheckpointError(f"{_OPTION}.checkpoint: {error}") from error
    target = net.state_dict()
    global_blocks = {f"image_encoder.blocks.{i}.attn." for i, b in enumerate(net.image_encoder.blocks)
                     if b.window_size == 0}
    report = SamLoadReport(path=path)
    chosen: dict[str, Tensor] = {}
    mismatches = []
    for key, tensor in state.items():
        if key not in target:
            report.unexpected.append(key)
            continue
        want = target[key].shape
        if tensor.shape != want:
            resizable_grid = (key == "image_encoder.pos_embed" and tensor.ndim == 4 and tensor.shape[-1] == want[-1]
                              and tensor.shape[0] == 1)
            resizable_table = (key.endswith(("rel_pos_h", "rel_pos_w")) and key.removesuffix(key.split(".")[-1])
                               in global_blocks and tensor.ndim == 2 and tensor.shape[1] == want[1])
            if resizable_grid:
                tensor = resize_pos_embed(tensor.float(), tuple(want[1:3])).to(tensor.dtype)
            elif resizable_table:
                tensor = resize_rel_pos(tensor.float(), want[0]).to(tensor.dtype)
            else:
                mismatches.append(f"{key}: {tuple(tensor.shape)} in the file, {tuple(want)} in the model")
                continue
            report.resized[key] = (tuple(state[key].shape), tuple(want))
        chosen[key] = tensor
    if mismatches:
        variant = _variant_of(net)
        width = state.get("image_encoder.patch_embed.proj.weight")
        guess = next((name for name, v in VARIANTS.items() if width is not None and v.width == width.shape[0]), None)
        fix = (f"the file looks like variant {guess!r}: set {_OPTION}.variant: {guess}" if guess not in (None, variant)
               else f"set {_OPTION}.variant to the file's SAM variant (vit_b, vit_l or vit_h), or give a checkpoint "
                    "saved from SAM's own layout")
        raise CheckpointError(f"{path}: {len(mismatches)} tensors have a shape that interpolation cannot explain "
                              f"(model variant {variant!r}): " + "; ".join(mismatches[:10])
                              + ("; ..." if len(mismatches) > 10 else "") + f". Fix: {fix}.")
    net.load_state_dict(chosen, strict=False)
    report.loaded = list(chosen)
    for key in target:
        if key not in chosen:
            (report.missing_adapters if "_Adapter." in key else report.missing).append(key)
    if not report.complete:
        warnings.warn(f"SamAdapter checkpoint: {report.summary()}", stacklevel=2)
    return report


def _variant_of(net: SamAdapterNet) -> str:
    """The variant whose encoder width and depth ``net`` has (``?`` for none)."""
    width, depth = net.image_encoder.pos_embed.shape[-1], len(net.image_encoder.blocks)
    return next((name for name, v in VARIANTS.items() if (v.width, v.depth) == (width, depth)), "?")
