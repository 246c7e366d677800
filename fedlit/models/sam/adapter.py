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
projections, then ``A_d`` adds its output to the spatial branch before the residual, as MSA does. FedSCA numbers
the adapters by block, then registration (:meth:`SamAdapterNet.adapter_names`): ``adapter_layout: fedlit``
registers them in the order they run (``blocks.0.Space_Adapter, blocks.0.MLP_Adapter, blocks.1...``: 24 in ViT-B;
36 with depth adapters, depth first); ``reference`` as MSA's code, MLP, space and depth in every block even for
2-D images, where the depth adapters never run (36 in ViT-B, FedSCA's K = 36, A^1 = ``blocks.0.MLP_Adapter``).

Images (B, C, H, W) of floats in [0, 1] (grey ones repeated to 3 channels) are scaled by 255 and normalized
with SAM's pixel mean and std (``normalize_input``). H and W must be multiples of the patch size but need not be
the built ``image_size``: the absolute position embedding is resized (bicubic) to the input's grid on the fly,
SAM resizes the relative position tables of its global-attention blocks itself, and the dense positional
encoding is computed for the actual grid. The frozen prompt encoder gives no prompt, a box around the whole
image, or a click drawn from the mask (:mod:`fedlit.models.sam.prompts`); the decoder's first ``out_channels``
mask tokens give low-resolution masks, upsampled (``upsample``) to the input size.

Deviations from MSA's code (``normalize_input: false``, ``upsample: nearest``, ``prompt: click`` give its input
handling): the defaults normalize, upsample bilinearly and give no prompt, and evaluation never draws clicks from
the ground truth unless asked; clicks are (x, y) (MSA passes (row, column)); the depth branch attends over the
D slices as one sequence without relative positions (MSA folds them into a 2-D grid and reuses the windowed
block's tables); every checkpoint key is loaded or reported (:mod:`fedlit.models.sam.checkpoint`).
"""

from __future__ import annotations

import difflib
import warnings
from functools import partial
from typing import Literal

import torch
from torch import Tensor, nn
from torch.nn import functional as F
from typing_extensions import override

from fedlit.core.errors import ConfigError, DataError
from fedlit.core.roles import RoleRule
from fedlit.models.dry import weight_loading_enabled
from fedlit.models.sam.blocks import Adapter, AdapterBlock
from fedlit.models.sam.checkpoint import OPTION, SamLoadReport, load_sam_checkpoint, resize_pos_embed, resize_rel_pos
from fedlit.models.sam.prompts import PROMPTS, Prompt, sparse_prompt
from fedlit.models.sam.variants import VARIANTS
from fedlit.models.unet import SegmentationNetwork

__all__ = [
    "VARIANTS",
    "Adapter",
    "AdapterBlock",
    "SamAdapter",
    "SamAdapterNet",
    "SamLoadReport",
    "load_sam_checkpoint",
    "resize_pos_embed",
    "resize_rel_pos",
]  # the last four from sam_checkpoint

# SAM's pixel statistics, on the 0-255 scale (segment_anything.modeling.Sam).
PIXEL_MEAN = (123.675, 116.28, 103.53)
PIXEL_STD = (58.395, 57.12, 57.375)


_NUM_MASK_TOKENS = 4  # SAM's decoder: 1 single-mask token + 3 multimask tokens


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
        min_loaded: Share of the image encoder's tensors (adapters left out) that the checkpoint must give; a file
            with fewer is refused (1.0: all of them).
        checkpoint_key_prefix: Removed from the start of the checkpoint's keys before matching (e.g. ``sam.`` for
            a file saved from a module that holds SAM as ``self.sam``).
        image_size: Side of the square images the model is built for (``pos_embed`` and the relative position
            tables are interpolated to it when loading); default 1024 (64 for ``tiny``). Other sizes that are
            multiples of the patch size also run.
        in_channels: Channels of the input images: 1 (repeated to RGB) or 3.
        prompt: The prompt in training: ``none``, ``box`` (a box around the whole image) or ``click`` (one click
            drawn from each image's ground-truth mask, as MSA trains; the network must then get the masks).
        eval_prompt: The prompt in evaluation (validation and test); None: ``prompt``, except ``none`` after
            training with clicks (clicks drawn from the ground truth would leak the labels into the prediction).
        normalize_input: Scale by 255 and normalize with SAM's pixel mean and std (SAM's own preprocessing);
            false feeds the [0, 1] images as they are, as MSA's code does.
        upsample: How the low-resolution masks are resized to the input: ``bilinear`` or ``nearest`` (MSA).
        adapter_layout: ``fedlit``: a space and an MLP adapter per block (and a depth adapter first with
            ``depth_adapters``), 24 in ViT-B; ``reference``: MSA's MLP, space and depth adapters in every block
            in that order, 36 in ViT-B (FedSCA's K = 36), the depth adapters unused for 2-D images.
        train_mask_decoder: Whether the default roles train (share) the mask decoder.
        depth_adapters: Use MSA's depth adapters; inputs must then be volumes (B, C, D, H, W).
        mlp_adapter_scale: Weight of the MLP adapter's output (0.5 in MSA).
    """

    def __init__(
        self,
        *,
        variant: Literal["vit_b", "vit_l", "vit_h", "tiny"] = "vit_b",
        checkpoint: str | None = None,
        min_loaded: float = 1.0,
        checkpoint_key_prefix: str = "",
        image_size: int | None = None,
        in_channels: int = 1,
        prompt: Prompt = "none",
        eval_prompt: Prompt | None = None,
        normalize_input: bool = True,
        upsample: Literal["bilinear", "nearest"] = "bilinear",
        adapter_layout: Literal["fedlit", "reference"] = "fedlit",
        train_mask_decoder: bool = True,
        depth_adapters: bool = False,
        mlp_adapter_scale: float = 0.5,
    ) -> None:
        if isinstance(checkpoint, str) and checkpoint.strip() in ("", "None", "null", "none", "~"):
            # jsonargparse turns `--model.init_args.network.init_args.checkpoint null` (an option of a class nested
            # in a class) into the string 'None': read it, and an empty string, as no checkpoint
            checkpoint = None
        if eval_prompt in ("None", "null", "~"):
            eval_prompt = None
        problems = []
        if variant not in VARIANTS:
            close = difflib.get_close_matches(str(variant), VARIANTS, n=1)
            problems.append(
                f"{OPTION}.variant={variant!r} is not one of {list(VARIANTS)}"
                + (f" (did you mean {close[0]!r}?)" if close else "")
            )
        else:
            patch = VARIANTS[variant].patch
            size = VARIANTS[variant].image_size if image_size is None else image_size
            if isinstance(size, bool) or not isinstance(size, int) or size < patch or size % patch:
                problems.append(
                    f"{OPTION}.image_size={image_size!r} must be a positive multiple of the patch "
                    f"size {patch} of variant {variant!r}"
                )
        if in_channels not in (1, 3) or isinstance(in_channels, bool):
            problems.append(f"{OPTION}.in_channels={in_channels!r} must be 1 (grey, repeated to RGB) or 3")
        for name, value, allowed in (
            ("prompt", prompt, PROMPTS),
            ("eval_prompt", eval_prompt, (*PROMPTS, None)),
            ("upsample", upsample, ("bilinear", "nearest")),
            ("adapter_layout", adapter_layout, ("fedlit", "reference")),
        ):
            if value not in allowed:
                problems.append(f"{OPTION}.{name}={value!r} is not one of {list(allowed)}")
        if not isinstance(min_loaded, int | float) or isinstance(min_loaded, bool) or not 0 <= min_loaded <= 1:
            problems.append(f"{OPTION}.min_loaded={min_loaded!r} must be a share between 0 and 1")
        if not isinstance(mlp_adapter_scale, int | float) or isinstance(mlp_adapter_scale, bool):
            problems.append(f"{OPTION}.mlp_adapter_scale={mlp_adapter_scale!r} must be a number")
        if problems:
            raise ConfigError("SamAdapter: " + "; ".join(problems) + ".")
        if eval_prompt == "click":
            warnings.warn(
                f"{OPTION}.eval_prompt=click draws each evaluation click from the ground-truth mask, as "
                "MSA's code does: the labels leak into the predictions, so the scores are not those of "
                "an unprompted model. Use none or box for honest scores.",
                stacklevel=2,
            )
        self.variant, self.checkpoint = variant, checkpoint
        self.min_loaded, self.checkpoint_key_prefix = float(min_loaded), str(checkpoint_key_prefix)
        self.image_size = VARIANTS[variant].image_size if image_size is None else image_size
        self.in_channels, self.prompt = in_channels, prompt
        self.eval_prompt = eval_prompt if eval_prompt is not None else "none" if prompt == "click" else prompt
        self.normalize_input, self.upsample, self.adapter_layout = bool(normalize_input), upsample, adapter_layout
        self.train_mask_decoder, self.depth_adapters = bool(train_mask_decoder), bool(depth_adapters)
        self.mlp_adapter_scale = float(mlp_adapter_scale)

    @override
    def build(self, out_channels: int) -> SamAdapterNet:
        if out_channels > _NUM_MASK_TOKENS:
            raise ConfigError(
                f"SamAdapter: model.init_args.num_classes={out_channels} but SAM's mask decoder has "
                f"{_NUM_MASK_TOKENS} mask tokens (one output channel each); give at most "
                f"{_NUM_MASK_TOKENS}."
            )
        net = SamAdapterNet(self, out_channels)
        if self.checkpoint is not None and weight_loading_enabled():
            net.load_report = load_sam_checkpoint(
                net, self.checkpoint, min_loaded=self.min_loaded, key_prefix=self.checkpoint_key_prefix
            )
        return net


class SamAdapterNet(nn.Module):
    """The built network: ``image_encoder``, ``prompt_encoder`` and ``mask_decoder`` as in SAM's ``Sam``.

    ``forward`` maps (B, C, H, W) images in [0, 1] (or (B, C, D, H, W) volumes with depth adapters) to
    (B, out_channels, H, W) (or (B, out_channels, D, H, W)) logits; with click prompts it also takes the masks
    (:attr:`needs_masks`). ``load_report`` tells what loading the checkpoint did (None without a checkpoint).
    """

    def __init__(self, spec: SamAdapter, out_channels: int) -> None:
        from segment_anything.modeling import ImageEncoderViT, MaskDecoder, PromptEncoder, TwoWayTransformer

        super().__init__()
        v = VARIANTS[spec.variant]
        grid = spec.image_size // v.patch
        self.image_encoder = ImageEncoderViT(
            img_size=spec.image_size,
            patch_size=v.patch,
            embed_dim=v.width,
            depth=v.depth,
            num_heads=v.heads,
            mlp_ratio=4,
            out_chans=v.prompt_dim,
            qkv_bias=True,
            norm_layer=partial(nn.LayerNorm, eps=1e-6),
            use_rel_pos=True,
            global_attn_indexes=v.global_attention,
            window_size=v.window,
        )
        for i, block in enumerate(self.image_encoder.blocks):
            self.image_encoder.blocks[i] = AdapterBlock(
                block,
                depth_adapter=spec.depth_adapters,
                mlp_adapter_scale=spec.mlp_adapter_scale,
                layout=spec.adapter_layout,
            )
        self.prompt_encoder = PromptEncoder(
            embed_dim=v.prompt_dim,
            image_embedding_size=(grid, grid),
            input_image_size=(spec.image_size, spec.image_size),
            mask_in_chans=v.mask_in_chans,
        )
        self.prompt_encoder.requires_grad_(False)
        self.mask_decoder = MaskDecoder(
            transformer_dim=v.prompt_dim,
            num_multimask_outputs=_NUM_MASK_TOKENS - 1,
            iou_head_depth=3,
            iou_head_hidden_dim=v.iou_hidden,
            transformer=TwoWayTransformer(
                depth=v.decoder_depth, embedding_dim=v.prompt_dim, num_heads=v.decoder_heads, mlp_dim=v.decoder_mlp
            ),
        )
        self.out_channels, self.patch_size, self.in_channels = out_channels, v.patch, spec.in_channels
        self.prompt, self.eval_prompt, self.depth_adapters = spec.prompt, spec.eval_prompt, spec.depth_adapters
        self.normalize_input, self.upsample = spec.normalize_input, spec.upsample
        self.train_mask_decoder = spec.train_mask_decoder
        self.load_report: SamLoadReport | None = None

    @property
    def needs_masks(self) -> bool:
        """Whether ``forward`` needs the ground-truth masks now: clicks are drawn from them in this mode."""
        return (self.prompt if self.training else self.eval_prompt) == "click"

    def adapter_names(self, prefix: str = "") -> list[str]:
        """The adapters' module paths in FedSCA's order (block by block, each block's in registration order):
        ``A^1, A^2, ...``; with ``adapter_layout: reference`` A^1 is ``image_encoder.blocks.0.MLP_Adapter``."""
        return [
            f"{prefix}image_encoder.blocks.{i}.{name}"
            for i, block in enumerate(self.image_encoder.blocks)
            for name, _ in block.named_children()
            if name.endswith("_Adapter")
        ]

    def default_role_rules(self, prefix: str = "") -> list[RoleRule]:
        """Everything frozen, the adapters shared, the mask decoder shared when ``train_mask_decoder``.

        Args:
            prefix: This network's name in the model, with its dot (``network.``).
        """
        rules = [RoleRule(f"{prefix}*", "frozen"), RoleRule(f"{prefix}image_encoder.blocks.*_Adapter.*", "shared")]
        if self.train_mask_decoder:
            rules.append(RoleRule(f"{prefix}mask_decoder.*", "shared"))
        return rules

    @override
    def forward(self, images: Tensor, masks: Tensor | None = None) -> Tensor:
        """(B, C, H, W) -> (B, out_channels, H, W) logits; (B, C, D, H, W) -> (B, out_channels, D, H, W).
        ``masks`` (B, out_channels, H, W) (or (B, out_channels, D, H, W)) are read only by click prompts."""
        if self.needs_masks and masks is None:
            raise ConfigError(
                f"SamAdapter draws click prompts from the masks ({OPTION}.prompt or eval_prompt = "
                "click) but got none: call network(images, masks), or set the prompt to none or box."
            )
        if images.ndim == 5:
            if not self.depth_adapters:
                raise ConfigError(
                    f"SamAdapter got volumes of shape {tuple(images.shape)} but has no depth "
                    f"adapters: set {OPTION}.depth_adapters to true, or give 2-D images."
                )
            b, c, d, h, w = images.shape
            if masks is not None and masks.ndim == 5:
                masks = masks.transpose(1, 2).reshape(b * d, -1, h, w)
            logits = self._segment(images.transpose(1, 2).reshape(b * d, c, h, w), masks, depth=d)
            return logits.reshape(b, d, -1, h, w).transpose(1, 2)
        if images.ndim != 4:
            raise DataError(f"SamAdapter expects images (B, C, H, W), got shape {tuple(images.shape)}.")
        if self.depth_adapters:
            raise ConfigError(
                f"SamAdapter has depth adapters but got 2-D images of shape {tuple(images.shape)}: "
                f"the depth adapters would never train; set {OPTION}.depth_adapters to false (or "
                "give volumes (B, C, D, H, W))."
            )
        return self._segment(images, masks, depth=None)

    def _segment(self, images: Tensor, masks: Tensor | None, depth: int | None) -> Tensor:
        n, c, h, w = images.shape
        if c != self.in_channels or h % self.patch_size or w % self.patch_size:
            raise DataError(
                f"SamAdapter expects {self.in_channels}-channel images ({OPTION}.in_channels) whose "
                f"sides are multiples of the patch size {self.patch_size}, got {tuple(images.shape)}; "
                "resize or crop the images, or set in_channels."
            )
        if c == 1:
            images = images.expand(-1, 3, -1, -1)
        if self.normalize_input:
            mean = images.new_tensor(PIXEL_MEAN).view(1, 3, 1, 1)
            std = images.new_tensor(PIXEL_STD).view(1, 3, 1, 1)
            images = (images * 255 - mean) / std
        embeddings = self._encode(images, depth)
        grid = embeddings.shape[-2:]
        prompts = self.prompt_encoder
        image_pe = prompts.pe_layer(tuple(grid)).unsqueeze(0).to(embeddings.dtype)
        dense = prompts.no_mask_embed.weight.reshape(1, -1, 1, 1).expand(n, -1, *grid)
        kind = self.prompt if self.training else self.eval_prompt
        sparse = sparse_prompt(prompts, kind, n, (h, w), masks if kind == "click" else None)
        masks_low = self._decode(embeddings, image_pe, sparse, dense)
        if self.upsample == "nearest":  # MSA: F.interpolate's default mode
            return F.interpolate(masks_low, size=(h, w), mode="nearest")
        return F.interpolate(masks_low, size=(h, w), mode="bilinear", align_corners=False)

    def _encode(self, x: Tensor, depth: int | None) -> Tensor:
        encoder = self.image_encoder
        x = encoder.patch_embed(x)
        x = x + resize_pos_embed(encoder.pos_embed, (x.shape[1], x.shape[2]))
        for block in encoder.blocks:
            x = block(x, depth)
        return encoder.neck(x.permute(0, 3, 1, 2))

    def _decode(self, embeddings: Tensor, image_pe: Tensor, sparse: Tensor, dense: Tensor) -> Tensor:
        """SAM's ``MaskDecoder.predict_masks`` for one prompt per image (SAM's repeats every image once per
        prompt of the batch), keeping the first ``out_channels`` mask tokens."""
        decoder = self.mask_decoder
        n, channels, gh, gw = embeddings.shape
        tokens = torch.cat([decoder.iou_token.weight, decoder.mask_tokens.weight]).unsqueeze(0).expand(n, -1, -1)
        tokens = torch.cat([tokens, sparse.to(tokens.dtype)], dim=1)
        hs, src = decoder.transformer(embeddings + dense, image_pe, tokens)
        upscaled = decoder.output_upscaling(src.transpose(1, 2).reshape(n, channels, gh, gw))
        hyper = torch.stack(
            [decoder.output_hypernetworks_mlps[i](hs[:, 1 + i]) for i in range(self.out_channels)], dim=1
        )
        return (hyper @ upscaled.flatten(2)).view(n, self.out_channels, *upscaled.shape[-2:])
