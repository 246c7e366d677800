"""LoRA (Hu et al., ICLR 2022) injected with peft into a built backbone, in place.

`peft.inject_adapter_in_model` replaces each targeted layer by a peft LoRA layer that keeps the original
layer as `base_layer` and adds `lora_A.default` and `lora_B.default`. The model stays a plain module (no
`PeftModel` wrapper), so parameter names are the backbone's own with peft's inserted, e.g.
`blocks.0.attn.qkv.lora_A.default.weight` and `blocks.0.attn.qkv.base_layer.weight`.

timm fuses the query, key and value projections of its attention into one Linear `qkv` (output q | k | v).
Adapting it with peft adapts the three together. `LoRA(fused_qkv="qv")` instead adapts only the q and v slices,
as the LoRA paper does for separate projections: each targeted fused `qkv` Linear becomes a
:class:`FusedQVLoRA` holding the original as `base_layer` and one adapter per slice, named
`blocks.0.attn.qkv.lora_A.q.weight`, `...lora_A.v.weight`, `...lora_B.q.weight`, `...lora_B.v.weight` (every A
name contains `lora_A`, every B name `lora_B`, as with peft, so role patterns such as `*lora_*` select them).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, cast

import torch
from torch import Tensor, nn
from typing_extensions import override

from fedlit.core.errors import ConfigError

__all__ = ["FusedQVLoRA", "LoRA"]

# Layer types peft's LoRA can wrap: listed as candidates when targets are missing or wrong.
_ADAPTABLE = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.Embedding)


@dataclass(frozen=True, kw_only=True)
class LoRA:
    """Low-rank adapters on a backbone's layers: W x + (alpha / r) B A x, with B = 0 at the start.

    Because B starts at zero, a freshly adapted model computes exactly what the original computed. Default
    targets per family: timm ViT-style attention -> `["qkv"]` (timm fuses the query, key and value
    projections into one Linear, so this adapts the fused projection, i.e. q, k and v together, not q and v
    alone as in the LoRA paper); transformers BERT family -> `["query", "value"]` (peft's defaults per
    `model_type`). Any other architecture needs `target_modules`.

    With `fused_qkv="qv"`, targeted fused `qkv` Linears (timm) get adapters on their q and v output slices only
    (:class:`FusedQVLoRA`, not peft); other targets still go through peft.

    Applying LoRA does not decide what trains: the original parameters keep the `requires_grad` they had
    (peft would freeze them); fedlit's parameter roles set it.
    """

    r: int = 8
    """Rank of the update B A."""
    alpha: float = 16
    """Scale numerator: the update is multiplied by alpha / r."""
    dropout: float = 0.0
    """Dropout on the adapter's input, in [0, 1)."""
    target_modules: list[str] | None = None
    """Module names (or name suffixes after a dot) to adapt, e.g. `["qkv"]`; None for the family default."""
    fused_qkv: Literal["all", "qv"] = "all"
    """How a targeted fused `qkv` Linear (timm attention; its last name part is `qkv`) is adapted: `all` as one
    layer (q, k and v together, peft), `qv` on its q and v output slices only (k untouched), as in the LoRA paper
    and FHBench."""

    def __post_init__(self) -> None:
        problems = []
        if isinstance(self.r, bool) or not isinstance(self.r, int) or self.r < 1:
            problems.append(f"lora.r must be an integer >= 1, got {self.r!r}")
        if isinstance(self.alpha, bool) or not isinstance(self.alpha, int | float) or self.alpha <= 0:
            problems.append(f"lora.alpha must be a number > 0, got {self.alpha!r}")
        if isinstance(self.dropout, bool) or not isinstance(self.dropout, int | float) or not 0 <= self.dropout < 1:
            problems.append(f"lora.dropout must be in [0, 1), got {self.dropout!r}")
        if self.target_modules is not None and (
            isinstance(self.target_modules, str)
            or not self.target_modules
            or not all(isinstance(t, str) and t for t in self.target_modules)
        ):
            problems.append(
                f"lora.target_modules must be a non-empty list of module names (e.g. ['qkv']) or null for "
                f"the family default, got {self.target_modules!r}"
            )
        if self.fused_qkv not in ("all", "qv"):
            problems.append(f"lora.fused_qkv must be 'all' or 'qv', got {self.fused_qkv!r}")
        if problems:
            raise ConfigError("; ".join(problems))

    @property
    def scaling(self) -> float:
        """The factor alpha / r applied to B A."""
        return self.alpha / self.r

    def apply(self, model: nn.Module, *, default_target_modules: Sequence[str] | None = None) -> nn.Module:
        """Inject LoRA layers into `model` in place.

        Args:
            model: The backbone, already holding its pretrained weights (peft renames targeted weights to
                `<layer>.base_layer.weight`, so load checkpoints before, not after).
            default_target_modules: The family default, used when `target_modules` is None.

        Returns:
            `model` itself, with adapters.

        Raises:
            ValueError: If no targets are known for this architecture, or a target matches no layer.
        """
        # Imported here: peft takes seconds to import, and runs without LoRA never need it.
        from peft import LoraConfig, inject_adapter_in_model

        targets = self.target_modules if self.target_modules is not None else default_target_modules
        candidates = _adaptable_names(model)
        if targets is None:
            raise ConfigError(
                f"lora.target_modules is required for {type(model).__name__}: fedlit knows default targets "
                "only for timm ViT-style attention (qkv) and BERT-family encoders (query, value). Layers "
                f"LoRA can adapt in this model: {candidates}"
            )
        unmatched = [t for t in targets if not any(_matches(name, t) for name, _ in model.named_modules())]
        if unmatched:
            raise ConfigError(
                f"lora.target_modules: {unmatched} match no layer of {type(model).__name__}; layers LoRA can "
                f"adapt: {candidates}"
            )
        requires_grad = {name: p.requires_grad for name, p in model.named_parameters()}
        fused = [] if self.fused_qkv == "all" else _fused_qkv_names(model, targets)
        if self.fused_qkv == "qv" and not fused:
            raise ConfigError(
                f"lora.fused_qkv='qv' adapts fused qkv Linears, but none of the targets {list(targets)} is one in "
                f"{type(model).__name__} (a Linear whose name ends in 'qkv' with 3 equal output slices). Use "
                "fused_qkv: all, or target separate projections (e.g. ['query', 'value'] for BERT)"
            )
        others = [
            name for name, _ in model.named_modules() if name not in fused and any(_matches(name, t) for t in targets)
        ]
        if others:
            config = LoraConfig(
                r=self.r,
                lora_alpha=cast(int, self.alpha),  # peft annotates int; it scales by any number
                lora_dropout=self.dropout,
                # Full names when some targets are fused qkv layers, so peft does not touch those.
                target_modules=others if fused else list(targets),
                bias="none",
            )
            inject_adapter_in_model(config, model)
        for name in fused:
            parent_name, _, child = name.rpartition(".")
            parent = model.get_submodule(parent_name)
            setattr(
                parent, child, FusedQVLoRA(getattr(parent, child), r=self.r, alpha=self.alpha, dropout=self.dropout)
            )
        for name, parameter in model.named_parameters():
            original = name.replace(".base_layer.", ".")
            if original in requires_grad:
                parameter.requires_grad_(requires_grad[original])
        return model


class FusedQVLoRA(nn.Module):
    """LoRA on the q and v output slices of a fused qkv Linear (output q | k | v, each a third):

        y = W x + b + (alpha / r) [B_q A_q x, 0, B_v A_v x]

    A_q, A_v (r x in) start Kaiming-uniform (a = sqrt 5, as `nn.Linear` and peft), B_q, B_v (out / 3 x r) at
    zero, so the output is the original's until B moves. The original layer is kept as `base_layer` (its
    `requires_grad` unchanged); adapters are `lora_A.q`, `lora_A.v`, `lora_B.q`, `lora_B.v` (bias-free Linears).

    Args:
        base_layer: The fused projection (`out_features` divisible by 3).
        r: Rank.
        alpha: Scale numerator (scale alpha / r).
        dropout: Dropout on the adapters' input.
    """

    def __init__(self, base_layer: nn.Linear, *, r: int, alpha: float, dropout: float = 0.0) -> None:
        super().__init__()
        if base_layer.out_features % 3:
            raise ConfigError(f"FusedQVLoRA: out_features={base_layer.out_features} is not 3 equal q, k, v slices")
        self.base_layer = base_layer
        self.width = base_layer.out_features // 3
        kw: dict[str, Any] = {"bias": False, "device": base_layer.weight.device, "dtype": base_layer.weight.dtype}
        lora_a = {s: nn.Linear(base_layer.in_features, r, **kw) for s in ("q", "v")}
        lora_b = {s: nn.Linear(r, self.width, **kw) for s in ("q", "v")}
        self.lora_A = nn.ModuleDict(lora_a)
        self.lora_B = nn.ModuleDict(lora_b)
        self.lora_dropout = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
        self.scaling = alpha / r
        for s in ("q", "v"):
            nn.init.kaiming_uniform_(lora_a[s].weight, a=math.sqrt(5))
            nn.init.zeros_(lora_b[s].weight)

    @override
    def forward(self, x: Tensor) -> Tensor:
        """The fused projection of `x` with the q and v slices adapted."""
        out = self.base_layer(x)
        h = self.lora_dropout(x)
        dq = self.lora_B["q"](self.lora_A["q"](h)) * self.scaling
        dv = self.lora_B["v"](self.lora_A["v"](h)) * self.scaling
        return out + torch.cat([dq, torch.zeros_like(dq), dv], dim=-1).to(out.dtype)


def _fused_qkv_names(model: nn.Module, targets: Sequence[str]) -> list[str]:
    """The targeted fused qkv layers: Linears whose last name part is `qkv`, with 3 equal output slices."""
    return [
        name
        for name, m in model.named_modules()
        if isinstance(m, nn.Linear)
        and name.rsplit(".", 1)[-1] == "qkv"
        and m.out_features % 3 == 0
        and any(_matches(name, t) for t in targets)
    ]


def _matches(module_name: str, target: str) -> bool:
    # peft's rule for a list of targets: the full name, or its suffix after a dot.
    return module_name == target or module_name.endswith("." + target)


def _adaptable_names(model: nn.Module) -> list[str]:
    """The distinct last name components of the layers LoRA can wrap, as hints for `target_modules`."""
    return sorted({name.rsplit(".", 1)[-1] for name, m in model.named_modules() if isinstance(m, _ADAPTABLE)})
