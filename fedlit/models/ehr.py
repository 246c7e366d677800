"""Encoders of an ICU stay's hourly series plus its static data: a Transformer and a GRU, with the normalization
layers as a choice (the FedPxN paper's LayerNorm / GroupNorm comparison).

The FedPxN authors' eICU model (Yang et al., "Towards the Practical Utility of Federated Learning in the Medical
Domain", CHIL 2023; adapted from McDermott et al., "A Comprehensive EHR Timeseries Pre-training Benchmark", CHIL
2021): the series (S features per hour) and the statics (D) are each projected to ``d_model`` and added at every
hour, sinusoidal position encodings added, a 2-layer post-norm Transformer encoder (8 heads, feed-forward 256,
dropout 0.5), a mean over the hours, then Linear -> norm -> ReLU layers (256, 384) and a last Linear to 256
features; the task head sits on top. Its ``transformer_ln`` normalizes with LayerNorm, ``transformer_gn`` with
GroupNorm (2 groups in the fully connected layers).

Deviation: the authors' encoder receives (batch, hours, d_model) tensors in a layer that expects (hours, batch,
d_model), so its attention mixes the stays of a batch and its GroupNorm(5, 25) normalizes over the 25 hours; here
attention runs over each stay's hours (padding masked), every norm layer normalizes over features, and the mean
is over the stay's hours only.

Input: float (B, T, 1 + S + D) as :class:`fedlit.data.EICU` packs it: column 0 is 1 on a stay's hours and 0 on
padding, then the S series features, then the D statics (read from the first row).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Literal

import torch
from torch import Tensor, nn
from typing_extensions import override

from fedlit.core.errors import ConfigError
from fedlit.models.backbones import Backbone
from fedlit.models.norms import check_norm, norm_layer

EHRNorm = Literal["layer", "group", "batch", "none"]


def split_stay(inputs: Tensor, series_features: int) -> tuple[Tensor, Tensor, Tensor]:
    """(mask (B, T) bool, series (B, T, S), statics (B, D)) of packed ``inputs``; a stay without any hour gets its
    first (zero) hour marked, so attention and means stay defined."""
    mask = inputs[..., 0] > 0.5
    mask[:, 0] |= ~mask.any(dim=1)
    return mask, inputs[..., 1 : 1 + series_features], inputs[:, 0, 1 + series_features :]


class MaskedNorm(nn.Module):
    """A normalization layer over the features of (B, T, C) sequences, applied to the real hours only (BatchNorm's
    statistics never see padding; LayerNorm and GroupNorm act per hour anyway). Padding hours are left as they
    are."""

    def __init__(self, norm: EHRNorm, channels: int, groups: int) -> None:
        super().__init__()
        self.norm = norm_layer(norm, channels, dims=0, groups=groups)

    @override
    def forward(self, x: Tensor, mask: Tensor) -> Tensor:
        out = x.clone()
        out[mask] = self.norm(x[mask])
        return out


class _EncoderLayer(nn.Module):
    """Post-norm Transformer encoder layer (PyTorch's ``TransformerEncoderLayer`` with ``norm_first=False``), its
    two norms chosen by kind."""

    def __init__(self, d_model: int, heads: int, ff: int, dropout: float, norm: EHRNorm, groups: int) -> None:
        super().__init__()
        self.self_attn = nn.MultiheadAttention(d_model, heads, dropout=dropout, batch_first=True)
        self.linear1, self.linear2 = nn.Linear(d_model, ff), nn.Linear(ff, d_model)
        self.dropout, self.dropout1, self.dropout2 = nn.Dropout(dropout), nn.Dropout(dropout), nn.Dropout(dropout)
        self.norm1, self.norm2 = MaskedNorm(norm, d_model, groups), MaskedNorm(norm, d_model, groups)

    @override
    def forward(self, x: Tensor, mask: Tensor) -> Tensor:
        attended = self.self_attn(x, x, x, key_padding_mask=~mask, need_weights=False)[0]
        x = self.norm1(x + self.dropout1(attended), mask)
        fed = self.linear2(self.dropout(torch.relu(self.linear1(x))))
        return self.norm2(x + self.dropout2(fed), mask)


def _head_stack(width: int, sizes: list[int], out: int, norm: EHRNorm, groups: int) -> nn.Sequential:
    """Linear -> norm -> ReLU per size, then Linear to ``out`` (the authors' ``fc_stack``)."""
    layers: list[nn.Module] = []
    for size in sizes:
        layers += [nn.Linear(width, size), norm_layer(norm, size, dims=0, groups=groups), nn.ReLU()]
        width = size
    return nn.Sequential(*layers, nn.Linear(width, out))


def _check(owner: str, values: Mapping[str, object], norm: object, groups: object, channels: list[int]) -> None:
    problems = [
        f"{name} must be an integer >= 1, got {value!r}"
        for name, value in values.items()
        if isinstance(value, bool) or not isinstance(value, int) or value < 1
    ]
    problems += check_norm(norm, groups, channels if not problems else [])
    if problems:
        raise ConfigError(f"{owner}: " + "; ".join(problems))


class EHRTransformer(Backbone):
    """The FedPxN authors' eICU Transformer (module docstring), ``num_features`` = ``out_features``.

    Parameter names: ``series_proj.*``, ``statics_proj.*``, ``layers.<i>.*`` (norms ``layers.<i>.norm1.norm.*``),
    ``fc.*``.

    Args:
        series_features: S, hourly features per stay (165 in the authors' cache).
        static_features: D, static features per stay (15).
        d_model: Width of the encoder.
        heads: Attention heads (must divide ``d_model``).
        layers: Encoder layers.
        feedforward: Width of each layer's feed-forward block.
        fc: Widths of the Linear -> norm -> ReLU layers after the mean over hours.
        out_features: Width of the last Linear (the features the task head reads).
        dropout: Dropout of the position encoding and the encoder layers.
        norm: ``layer`` (``transformer_ln``), ``group`` (``transformer_gn``), ``batch`` or ``none``.
        groups: Groups of ``group`` (must divide ``d_model`` and every ``fc`` width; the authors' 2).
    """

    def __init__(
        self,
        *,
        series_features: int,
        static_features: int,
        d_model: int = 256,
        heads: int = 8,
        layers: int = 2,
        feedforward: int = 256,
        fc: list[int] | None = None,
        out_features: int = 256,
        dropout: float = 0.5,
        norm: EHRNorm = "layer",
        groups: int = 2,
    ) -> None:
        fc = [256, 384] if fc is None else list(fc)
        ints = {"series_features": series_features, "static_features": static_features, "d_model": d_model,
                "heads": heads, "layers": layers, "feedforward": feedforward, "out_features": out_features}  # fmt: skip
        ints.update({f"fc[{i}]": w for i, w in enumerate(fc)})
        _check("EHRTransformer", ints, norm, groups, [d_model, *fc])
        if d_model % heads or not 0 <= dropout < 1:
            raise ConfigError(f"EHRTransformer: heads={heads} must divide d_model={d_model} and dropout={dropout} "
                              "be in [0, 1)")  # fmt: skip
        self.series_features, self.static_features = series_features, static_features
        self.d_model, self.heads, self.layers, self.feedforward = d_model, heads, layers, feedforward
        self.fc, self.out_features, self.dropout, self.norm, self.groups = fc, out_features, dropout, norm, groups

    @override
    def build(self) -> nn.Module:
        """Build the encoder (random initialization)."""
        return _Transformer(self)


class _Transformer(nn.Module):
    def __init__(self, spec: EHRTransformer) -> None:
        super().__init__()
        self.series_features = spec.series_features
        self.series_proj = nn.Linear(spec.series_features, spec.d_model)
        self.statics_proj = nn.Linear(spec.static_features, spec.d_model)
        self.position_dropout = nn.Dropout(spec.dropout)
        self.layers = nn.ModuleList(
            _EncoderLayer(spec.d_model, spec.heads, spec.feedforward, spec.dropout, spec.norm, spec.groups)
            for _ in range(spec.layers)
        )
        self.fc = _head_stack(spec.d_model, spec.fc, spec.out_features, spec.norm, spec.groups)
        self.num_features = spec.out_features

    @override
    def forward(self, inputs: Tensor) -> Tensor:
        mask, series, statics = split_stay(inputs, self.series_features)
        x = self.series_proj(series) + self.statics_proj(statics).unsqueeze(1)
        x = self.position_dropout(x + positions(x.shape[1], x.shape[2]).to(x))
        for layer in self.layers:
            x = layer(x, mask)
        return self.fc(masked_mean(x, mask))


def positions(length: int, width: int) -> Tensor:
    """(length, width) sinusoidal position encodings (Vaswani et al., NeurIPS 2017): sin on even, cos on odd
    features."""
    position = torch.arange(length, dtype=torch.float32).unsqueeze(1)
    frequency = torch.exp(torch.arange(0, width, 2, dtype=torch.float32) * (-math.log(10000.0) / width))
    out = torch.zeros(length, width)
    out[:, 0::2] = torch.sin(position * frequency)
    out[:, 1::2] = torch.cos(position * frequency[: width // 2])
    return out


def masked_mean(x: Tensor, mask: Tensor) -> Tensor:
    """Mean of (B, T, C) over the hours where ``mask`` (B, T) is true."""
    weights = mask.to(x.dtype).unsqueeze(-1)
    return (x * weights).sum(1) / weights.sum(1).clamp(min=1.0)


class EHRGRU(Backbone):
    """A GRU over a stay's hours: series and statics projected to ``hidden`` and added (as the Transformer does),
    a norm over the projected features, a ``layers``-layer GRU, its state at the stay's last hour, then the
    Linear -> norm -> ReLU stack of the Transformer. The authors publish no GRU; this one keeps their choices.

    Args:
        series_features: S, hourly features per stay.
        static_features: D, static features per stay.
        hidden: Width of the projection and of the GRU state.
        layers: GRU layers.
        fc: Widths of the Linear -> norm -> ReLU layers after the GRU.
        out_features: Width of the last Linear.
        dropout: Dropout between GRU layers and after the projection.
        norm: ``layer``, ``group``, ``batch`` or ``none``.
        groups: Groups of ``group`` (must divide ``hidden`` and every ``fc`` width).
    """

    def __init__(
        self,
        *,
        series_features: int,
        static_features: int,
        hidden: int = 256,
        layers: int = 1,
        fc: list[int] | None = None,
        out_features: int = 256,
        dropout: float = 0.3,
        norm: EHRNorm = "layer",
        groups: int = 2,
    ) -> None:
        fc = [256] if fc is None else list(fc)
        ints = {"series_features": series_features, "static_features": static_features, "hidden": hidden,
                "layers": layers, "out_features": out_features}  # fmt: skip
        ints.update({f"fc[{i}]": w for i, w in enumerate(fc)})
        _check("EHRGRU", ints, norm, groups, [hidden, *fc])
        if not 0 <= dropout < 1:
            raise ConfigError(f"EHRGRU: dropout={dropout} must be in [0, 1)")
        self.series_features, self.static_features, self.hidden, self.layers = (
            series_features, static_features, hidden, layers)  # fmt: skip
        self.fc, self.out_features, self.dropout, self.norm, self.groups = fc, out_features, dropout, norm, groups

    @override
    def build(self) -> nn.Module:
        """Build the encoder (random initialization)."""
        return _GRU(self)


class _GRU(nn.Module):
    def __init__(self, spec: EHRGRU) -> None:
        super().__init__()
        self.series_features = spec.series_features
        self.series_proj = nn.Linear(spec.series_features, spec.hidden)
        self.statics_proj = nn.Linear(spec.static_features, spec.hidden)
        self.input_norm = MaskedNorm(spec.norm, spec.hidden, spec.groups)
        self.input_dropout = nn.Dropout(spec.dropout)
        between = spec.dropout if spec.layers > 1 else 0.0
        self.gru = nn.GRU(spec.hidden, spec.hidden, num_layers=spec.layers, batch_first=True, dropout=between)
        self.fc = _head_stack(spec.hidden, spec.fc, spec.out_features, spec.norm, spec.groups)
        self.num_features = spec.out_features

    @override
    def forward(self, inputs: Tensor) -> Tensor:
        mask, series, statics = split_stay(inputs, self.series_features)
        x = self.series_proj(series) + self.statics_proj(statics).unsqueeze(1)
        x = self.input_dropout(torch.relu(self.input_norm(x, mask)))
        lengths = mask.sum(1).cpu()
        packed = nn.utils.rnn.pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
        _, state = self.gru(packed)
        return self.fc(state[-1])
