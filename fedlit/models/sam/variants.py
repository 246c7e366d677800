"""The sizes of SAM's image encoders, prompt encoder and mask decoder per variant (``segment_anything.build_sam``:
Kirillov et al., "Segment Anything", ICCV 2023), plus a tiny one for tests and CPU runs."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["VARIANTS"]


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
    "tiny": _Variant(
        width=64,
        depth=2,
        heads=2,
        global_attention=(1,),
        patch=8,
        window=4,
        image_size=64,
        prompt_dim=32,
        decoder_mlp=64,
        decoder_heads=2,
        iou_hidden=32,
        mask_in_chans=8,
    ),
}
"""SAM's encoder and decoder sizes per ``variant`` (segment_anything.build_sam), plus a tiny one."""
