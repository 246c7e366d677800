"""The sparse prompts :class:`fedlit.models.SamAdapter` gives SAM's frozen prompt encoder: none, a box around the
whole image, or one click drawn from the image's ground-truth mask (as Medical-SAM-Adapter trains).

The embeddings are those of SAM's ``PromptEncoder`` (``_embed_points`` with its padding point, ``_embed_boxes``),
with coordinates normalized by the actual image size rather than the built one, so that images of another size
than ``image_size`` are prompted at the same relative place.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

import torch
from torch import Tensor

if TYPE_CHECKING:
    from segment_anything.modeling import PromptEncoder

from fedlit.core.errors import DataError

__all__ = ["PROMPTS", "Prompt", "click_embedding", "draw_clicks", "sparse_prompt"]

Prompt = Literal["none", "box", "click"]
PROMPTS: tuple[str, ...] = ("none", "box", "click")


def draw_clicks(masks: Tensor) -> tuple[Tensor, Tensor]:
    """One click per image, drawn uniformly among its foreground pixels (any channel of the (N, C, H, W) 0/1
    ``masks``), label 1; an image without foreground gets a click drawn among all its pixels, label 0 (a
    background click), as Medical-SAM-Adapter's ``random_click``. Uses torch's global random generator.

    Returns:
        ``(N, 2)`` (x, y) pixel coordinates (column, row) and ``(N,)`` labels.
    """
    n, _, h, w = masks.shape
    foreground = (masks > 0.5).any(dim=1).reshape(n, h * w)
    has_foreground = foreground.any(dim=1)
    weights = torch.where(has_foreground[:, None], foreground, torch.ones_like(foreground)).float()
    index = torch.multinomial(weights, 1)[:, 0]
    points = torch.stack([index % w, torch.div(index, w, rounding_mode="floor")], dim=1)
    return points, has_foreground.long()


def click_embedding(prompts: PromptEncoder, points: Tensor, labels: Tensor, size: tuple[int, int]) -> Tensor:
    """SAM's ``PromptEncoder._embed_points(points, labels, pad=True)`` for one (x, y) click per image in an image of
    ``size`` (H, W): the click's embedding and SAM's padding point, (N, 2, embed_dim)."""
    weight = prompts.not_a_point_embed.weight
    coords = points.to(weight.dtype)[:, None, :] + 0.5  # the centre of the pixel
    embedding = prompts.pe_layer.forward_with_coords(coords, size)
    positive = labels.to(torch.bool)[:, None, None]
    embedding = embedding + torch.where(
        positive, prompts.point_embeddings[1].weight, prompts.point_embeddings[0].weight
    )
    padding = weight.expand(len(points), 1, -1)  # SAM zeroes the padding point's position, then adds this
    return torch.cat([embedding, padding], dim=1)


def sparse_prompt(
    prompts: PromptEncoder, kind: str, n: int, size: tuple[int, int], masks: Tensor | None = None
) -> Tensor:
    """The (N, tokens, embed_dim) sparse embeddings of ``kind`` for ``n`` images of ``size`` (H, W): no token
    (``none``), the two corners of the box (0, 0, W - 1, H - 1) (``box``) or a click from ``masks`` (``click``)."""
    weight = prompts.not_a_point_embed.weight
    h, w = size
    if kind == "none":
        return weight.new_zeros(n, 0, prompts.embed_dim)
    if kind == "box":
        # SAM's box embedding (PromptEncoder._embed_boxes), corners shifted to the pixel centres.
        corners = weight.new_tensor([[[0.5, 0.5], [w - 0.5, h - 0.5]]])
        embedding = prompts.pe_layer.forward_with_coords(corners, (h, w))
        embedding = embedding + torch.cat([prompts.point_embeddings[2].weight, prompts.point_embeddings[3].weight])
        return embedding.expand(n, -1, -1)
    if masks is None or masks.ndim != 4 or masks.shape[0] != n or tuple(masks.shape[-2:]) != (h, w):
        got = None if masks is None else tuple(masks.shape)
        raise DataError(f"SamAdapter's click prompt needs one mask per image, ({n}, C, {h}, {w}), got {got}.")
    points, labels = draw_clicks(masks.detach())
    return click_embedding(prompts, points, labels, (h, w))
