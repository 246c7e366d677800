"""Medical-SAM-Adapter's adapter and the SAM encoder block that carries the adapters (see
:mod:`fedlit.models.sam.adapter` for the equations and the order in which FedSCA numbers the adapters).

Wu, Wang, Fu, Jiang, Xu, Liu, Jin, Arbel, "Medical SAM Adapter: Adapting Segment Anything Model for Medical Image
Segmentation", Medical Image Analysis 2025.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from torch import Tensor, nn
from torch.nn import functional as F
from typing_extensions import override

if TYPE_CHECKING:
    from segment_anything.modeling.image_encoder import Attention, Block

__all__ = ["Adapter", "AdapterBlock"]


class Adapter(nn.Module):
    """MSA's bottleneck: ``D_fc2(GELU(D_fc1 x))``, plus ``x`` when ``skip`` (the space adapter's own skip)."""

    def __init__(self, dim: int, *, ratio: float = 0.25, skip: bool = True) -> None:
        super().__init__()
        hidden = int(dim * ratio)
        self.D_fc1 = nn.Linear(dim, hidden)
        self.act = nn.GELU()
        self.D_fc2 = nn.Linear(hidden, dim)
        self.skip = skip

    @override
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
        layout: ``fedlit`` or ``reference`` (see :class:`SamAdapter`'s ``adapter_layout``).
    """

    def __init__(
        self,
        block: Block,
        *,
        depth_adapter: bool = False,
        mlp_adapter_scale: float = 0.5,
        layout: Literal["fedlit", "reference"] = "fedlit",
    ) -> None:
        super().__init__()
        dim = block.norm1.normalized_shape[0]
        self.norm1, self.attn, self.norm2, self.mlp = block.norm1, block.attn, block.norm2, block.mlp
        self.window_size = block.window_size
        # FedSCA ranks the adapters of a block by registration order. fedlit: the order they run (depth, space,
        # MLP), a depth adapter only for volumes; reference (MSA's AdapterBlock): MLP, space, depth, all three
        # even for 2-D images, where the depth adapter never runs.
        if layout == "reference":
            self.MLP_Adapter = Adapter(dim, skip=False)
            self.Space_Adapter = Adapter(dim)
            self.Depth_Adapter = Adapter(dim, skip=False)
        else:
            if depth_adapter:
                self.Depth_Adapter = Adapter(dim, skip=False)
            self.Space_Adapter = Adapter(dim)
            self.MLP_Adapter = Adapter(dim, skip=False)
        self.mlp_adapter_scale = mlp_adapter_scale

    @override
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


def _attend(attn: Attention, tokens: Tensor) -> Tensor:
    """SAM ``Attention``'s projections over (N, L, C) token sequences, without relative positions."""
    n, length, c = tokens.shape
    q, k, v = attn.qkv(tokens).reshape(n, length, 3, attn.num_heads, -1).permute(2, 0, 3, 1, 4).unbind(0)
    out = F.scaled_dot_product_attention(q, k, v)  # softmax(q k^T / sqrt(head_dim)) v, SAM's attn.scale
    return attn.proj(out.transpose(1, 2).reshape(n, length, c))
