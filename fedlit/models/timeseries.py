"""A MOMENT-style time-series encoder: signals cut into patches, a T5 encoder over the patches, mean pooling.

MOMENT (Goswami et al., "MOMENT: A Family of Open Time-series Foundation Models", ICML 2024) is the backbone
FHBench (Wang et al., arXiv 2025) fine-tunes on ECG and EEG. Its reference package, `momentfm` (0.1.4), pins
`transformers==4.33.3` and `numpy==1.25.2`, which fedlit's transformers 5 and numpy 2 rule out, so fedlit does not
use it: `MomentEncoder` rebuilds MOMENT's embedding path on transformers' own `T5Stack`, with MOMENT's module and
parameter names, so a MOMENT checkpoint folder (`config.json` with `t5_config`, and `model.safetensors` or
`pytorch_model.bin`, as `AutonLab/MOMENT-1-large` on Hugging Face) loads into it by name. What it computes is
MOMENT's `embed` (reduction `mean`) for fully observed series:

1. RevIN without affine parameters (Kim et al., ICLR 2022): each channel minus its mean, over its population
   standard deviation plus 1e-5;
2. non-overlapping patches of `patch_len` (8) samples, each mapped by `patch_embedding.value_embedding` (a
   Linear, no bias) to `d_model`, plus MOMENT's sinusoidal position embedding (recomputed, not stored);
3. every channel encoded on its own (channel independence: (B, C, N, D) -> (B * C, N, D)) by the T5 encoder
   `encoder.*` (`encoder.block.<i>.layer.0.SelfAttention.q` ...), all patches attended;
4. the mean over channels and patches: (B, d_model).

Deviations from `momentfm`: a series whose length differs from `seq_len` is linearly resampled to it (what
`momentfm`'s PTB-XL loader does to 1000-sample ECGs, `seq_len` 512), not left-padded with a masked prefix; no
gradient checkpointing; no dropout on the patch embeddings (MOMENT's `patch_dropout`, 0.1; the T5 layers keep
their `dropout_rate`); the T5 token embedding (`encoder.embed_tokens`, which MOMENT never uses), the
reconstruction head (`head.*`) and the stored position table are not kept.
"""

from __future__ import annotations

import difflib
import json
import math
import os
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn import functional as F
from typing_extensions import override

from fedlit.core.errors import CheckpointError, ConfigError, InputFileError, broken
from fedlit.models.backbones import Backbone, _raise_if
from fedlit.models.lora import LoRA
from fedlit.models.pretrained import read_state_dict

__all__ = ["MomentEncoder", "TimeSeriesEncoder", "tiny_moment_config"]

#: Weight files a MOMENT folder may hold, tried in this order.
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
# Checkpoint tensors MomentEncoder leaves out on purpose (see the module docstring).
_NOT_KEPT = ("head.", "encoder.embed_tokens.", "patch_embedding.position_embedding.")


def tiny_moment_config(**overrides: Any) -> dict[str, Any]:
    """A 2-layer T5 encoder with d_model 16, for tests and quick runs: `MomentEncoder(config=tiny_moment_config())`.

    MOMENT-1-large's own is flan-t5-large's encoder: d_model 1024, 24 layers, 16 heads, d_ff 2816, gated GELU.

    Args:
        **overrides: T5 config entries to change, e.g. `num_layers=4`.

    Returns:
        The T5 config as a dict, usable as `MomentEncoder`'s `config` option (and in YAML).
    """
    config: dict[str, Any] = {
        "d_model": 16,
        "d_kv": 8,
        "d_ff": 32,
        "num_layers": 2,
        "num_heads": 2,
        "feed_forward_proj": "gated-gelu",
        "dropout_rate": 0.0,
    }
    config.update(overrides)
    return config


class MomentEncoder(Backbone):
    """MOMENT's encoder (see the module docstring): float signals (B, C, L) or (B, L) -> features (B, d_model).

    Parameter names are MOMENT's: `patch_embedding.value_embedding.weight`, `patch_embedding.mask_embedding`,
    `encoder.block.0.layer.0.SelfAttention.q.weight`, ... LoRA's default targets are the attention's `q` and `v`
    (peft's for T5), so EPFL's A/B split and role patterns such as `backbone.*lora_*` work as for BERT.

    Args:
        path: A local MOMENT folder: `config.json` (MOMENT's, with `t5_config`, `patch_len`, `seq_len`) and
            `model.safetensors` or `pytorch_model.bin`. Nothing is downloaded. Every tensor of the encoder must be
            in the checkpoint with its shape (else `CheckpointError`); `head.*`, `encoder.embed_tokens.*` and the
            stored position table are left out, any other extra tensor is reported in a warning.
        config: T5 config entries as a dict (e.g. `tiny_moment_config()`), for a randomly initialized encoder (a
            warning says so). Exactly one of `path` and `config`.
        patch_len: Samples per patch (MOMENT: 8); with `path`, taken from its `config.json`.
        seq_len: Length every series is linearly resampled to (MOMENT was pre-trained on 512); None keeps the
            input's length (a multiple of `patch_len`).
        lora: LoRA adapters; default targets `["q", "v"]`.
    """

    def __init__(
        self,
        *,
        path: str | os.PathLike | None = None,
        config: dict[str, Any] | None = None,
        patch_len: int = 8,
        seq_len: int | None = 512,
        lora: LoRA | None = None,
    ) -> None:
        problems = []
        if (path is None) == (config is None):
            problems.append(
                f"give exactly one of path (a local MOMENT folder) and config (a dict of T5 config "
                f"entries for a random encoder), got path={path!r}, config={config!r}"
            )
        if config is not None:
            problems += _t5_problems(config, "config")
        if isinstance(patch_len, bool) or not isinstance(patch_len, int) or patch_len < 1:
            problems.append(f"patch_len must be an integer >= 1, got {patch_len!r}")
        elif seq_len is not None and (
            isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < patch_len or seq_len % patch_len
        ):
            problems.append(f"seq_len must be null or a multiple of patch_len={patch_len}, got {seq_len!r}")
        if lora is not None and not isinstance(lora, LoRA):
            problems.append(f"lora must be a fedlit.models.LoRA or null, got {type(lora).__name__}")
        _raise_if(problems, "MomentEncoder")
        self.path = Path(path).expanduser() if path is not None else None
        self.config = dict(config) if config is not None else None
        self.patch_len = patch_len
        self.seq_len = seq_len
        self.lora = lora

    @override
    def build(self) -> nn.Module:
        """Build the encoder (from the folder's weights, or random), then inject LoRA.

        Raises:
            InputFileError: If `path` lacks `config.json` or a weight file (the message names the folder).
            CheckpointError: If the checkpoint lacks a tensor of the encoder or has one of another shape.
        """
        if self.path is None:
            module = TimeSeriesEncoder(dict(self.config or {}), patch_len=self.patch_len, seq_len=self.seq_len)
            warnings.warn(
                "MomentEncoder: built from config, so the encoder is randomly initialized (fedlit never "
                "downloads weights; set path to a local MOMENT folder)",
                UserWarning,
                stacklevel=2,
            )
        else:
            module = self._load(self.path)
        if self.lora is not None:
            from peft.utils.constants import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING as DEFAULTS

            self.lora.apply(module, default_target_modules=DEFAULTS.get("t5"))
        return module

    def _load(self, folder: Path) -> TimeSeriesEncoder:
        config_file = folder / "config.json"
        weights = next((folder / name for name in WEIGHT_FILES if (folder / name).is_file()), None)
        if not config_file.is_file() or weights is None:
            raise InputFileError(
                f"MomentEncoder: path={str(folder)!r} is not a MOMENT folder (it needs config.json and one of "
                f"{', '.join(WEIGHT_FILES)}). fedlit never downloads: fetch it once on a connected machine "
                "(`huggingface-cli download AutonLab/MOMENT-1-large --local-dir <folder>`) and give that folder"
            )
        try:
            moment = json.loads(config_file.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as err:
            raise CheckpointError(f"{config_file}: not a JSON file ({err}); download the MOMENT folder again") from None
        t5 = moment.get("t5_config") if isinstance(moment, dict) else None
        problems = ["no t5_config"] if not isinstance(t5, dict) else _t5_problems(t5, "t5_config", known_only=False)
        if problems:
            raise CheckpointError(f"{config_file}: {'; '.join(problems)}; this is not a MOMENT config.json")
        if not (isinstance(t5, dict)):  # no problems means a t5_config dict
            raise broken("no problems means a t5_config dict")
        module = TimeSeriesEncoder(
            t5,
            patch_len=int(moment.get("patch_len", self.patch_len)),
            seq_len=self.seq_len,
            value_embedding_bias=bool(moment.get("value_embedding_bias", False)),
            positional_embedding=bool(moment.get("add_positional_embedding", True)),
        )
        state = read_state_dict(weights)
        target = module.state_dict()
        missing = [k for k in target if k not in state]
        shapes = [
            f"{k} {tuple(state[k].shape)} (model {tuple(target[k].shape)})"
            for k in target
            if k in state and state[k].shape != target[k].shape
        ]
        if missing or shapes:
            raise CheckpointError(
                f"{weights}: does not match MOMENT's encoder described by {config_file}: "
                + "; ".join(
                    part
                    for part in (
                        f"missing {missing[:5]}{' ...' if len(missing) > 5 else ''}" if missing else "",
                        f"other shapes {shapes[:5]}" if shapes else "",
                    )
                    if part
                )
            )
        extra = [k for k in state if k not in target and not k.startswith(_NOT_KEPT)]
        if extra:
            warnings.warn(
                f"MomentEncoder(path={str(folder)!r}): {len(extra)} checkpoint tensors were not used: {extra[:10]}",
                UserWarning,
                stacklevel=3,
            )
        module.load_state_dict({k: state[k] for k in target})
        return module


def _t5_problems(config: object, option: str, *, known_only: bool = True) -> list[str]:
    """Check T5 config entries now, because transformers would silently keep a misspelled key."""
    if not isinstance(config, dict):
        return [f"{option} must be a dict of T5 config entries (e.g. {{'d_model': 16, ...}}), got {config!r}"]
    from transformers import T5Config

    known = set(T5Config().to_dict()) | set(T5Config.attribute_map)
    problems = [] if "d_model" in config or not known_only else ["config needs d_model"]
    if known_only:
        problems += [
            f"{option}.{key} is not an option of T5Config (closest: "
            f"{difflib.get_close_matches(str(key), sorted(known), n=3)})"
            for key in config
            if key not in known
        ]
    return problems


class TimeSeriesEncoder(nn.Module):
    """The module `MomentEncoder.build()` returns (see the module docstring for the four steps).

    Args:
        t5_config: T5 config entries (`d_model`, `num_layers`, `num_heads`, ...).
        patch_len: Samples per patch.
        seq_len: Length series are resampled to; None keeps theirs.
        value_embedding_bias: Whether the patch projection has a bias (MOMENT: no).
        positional_embedding: Whether the sinusoidal position embedding is added (MOMENT: yes).
    """

    def __init__(
        self,
        t5_config: dict[str, Any],
        *,
        patch_len: int = 8,
        seq_len: int | None = 512,
        value_embedding_bias: bool = False,
        positional_embedding: bool = True,
    ) -> None:
        super().__init__()
        from transformers import T5Config
        from transformers.models.t5.modeling_t5 import T5Stack

        # vocab_size 1: the token embedding is never used (MOMENT feeds patch embeddings) and is dropped below.
        entries = {
            **t5_config,
            "vocab_size": 1,
            "pad_token_id": 0,
            "eos_token_id": None,
            "decoder_start_token_id": 0,
            "is_decoder": False,
            "use_cache": False,
            "is_encoder_decoder": False,
        }
        entries.pop("architectures", None)
        config = T5Config(**entries)
        self.patch_len, self.seq_len = patch_len, seq_len
        self.num_features: int = config.d_model
        self.patch_embedding = PatchEmbedding(
            config.d_model, patch_len, bias=value_embedding_bias, positional=positional_embedding
        )
        self.encoder = T5Stack(config)
        self.encoder.embed_tokens = None  # type: ignore[assignment]  # transformers types it non-optional

    @override
    def forward(self, x: Tensor) -> Tensor:
        """Encode signals (B, C, L) (or (B, L), one channel) to (B, d_model)."""
        if x.ndim == 2:
            x = x.unsqueeze(1)
        if x.ndim != 3 or not x.is_floating_point():
            raise ConfigError(
                f"MomentEncoder expects float signals (batch, channels, samples), got a {x.dtype} "
                f"tensor of shape {tuple(x.shape)}"
            )
        batch, channels, length = x.shape
        if self.seq_len is not None and length != self.seq_len:
            x = F.interpolate(x, size=self.seq_len, mode="linear", align_corners=True)
        elif length % self.patch_len:
            raise ConfigError(
                f"MomentEncoder: {length} samples are not a multiple of patch_len={self.patch_len}; "
                "set seq_len to resample every series"
            )
        mean = x.mean(dim=-1, keepdim=True)
        std = (x - mean).square().mean(dim=-1, keepdim=True).sqrt() + 1e-5
        x = torch.nan_to_num((x - mean) / std, nan=0.0, posinf=0.0, neginf=0.0)
        patches = x.unfold(-1, self.patch_len, self.patch_len)  # (B, C, N, patch_len)
        embedded = self.patch_embedding(patches)
        count = embedded.shape[2]
        hidden = self.encoder(inputs_embeds=embedded.reshape(batch * channels, count, -1)).last_hidden_state
        return hidden.reshape(batch, channels, count, -1).mean(dim=(1, 2))


class PatchEmbedding(nn.Module):
    """Patches (B, C, N, patch_len) -> (B, C, N, d_model): MOMENT's `value_embedding` plus its sinusoidal position
    embedding (Vaswani et al., NeurIPS 2017). `mask_embedding` replaces masked patches in MOMENT's pre-training;
    kept for the checkpoint, unused here as every patch is observed."""

    def __init__(self, d_model: int, patch_len: int, *, bias: bool = False, positional: bool = True) -> None:
        super().__init__()
        self.value_embedding = nn.Linear(patch_len, d_model, bias=bias)
        self.mask_embedding = nn.Parameter(torch.zeros(d_model))
        self.positional = positional
        self.d_model = d_model

    @override
    def forward(self, patches: Tensor) -> Tensor:
        """Embed the patches; position n gets sin(n w_i) at even, cos(n w_i) at odd features, w_i = 1e4^(-2i/D)."""
        x = self.value_embedding(patches)
        if not self.positional:
            return x
        position = torch.arange(x.shape[2], device=x.device, dtype=torch.float32).unsqueeze(1)
        frequency = torch.exp(
            torch.arange(0, self.d_model, 2, device=x.device, dtype=torch.float32) * (-math.log(10000.0) / self.d_model)
        )
        table = torch.zeros(x.shape[2], self.d_model, device=x.device)
        table[:, 0::2] = torch.sin(position * frequency)
        table[:, 1::2] = torch.cos(position * frequency)[:, : self.d_model // 2]
        return x + table.to(x.dtype)
