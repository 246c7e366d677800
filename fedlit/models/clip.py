"""CLIP (Radford et al., "Learning Transferable Visual Models From Natural Language Supervision", ICML 2021) from
transformers, frozen, for prompt learning: loaded from a local folder only, or built tiny and random for tests.

:class:`CLIP` is a :class:`~fedlit.models.Backbone` spec: its built module maps images to CLIP's projected image
features (B, projection_dim), so it also serves as a frozen feature extractor under a linear head. Prompt learning
(CoOp, pFedMoAP: :class:`fedlit.tasks.CLIPPromptModule`) uses the text side through
:meth:`CLIPEncoders.prompt_tokens`, :meth:`CLIPEncoders.token_embedding` and :meth:`CLIPEncoders.encode_prompts`,
which run CLIP's text transformer on token embeddings, learned context vectors among them.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import Tensor, nn
from torch.nn import functional as F
from typing_extensions import override

from fedlit.core.errors import ConfigError, InputFileError
from fedlit.models.backbones import Backbone, _raise_if

if TYPE_CHECKING:
    from transformers import CLIPModel, CLIPTextConfig, CLIPVisionConfig

__all__ = ["CLIP", "CLIPEncoders", "tiny_clip_config"]

#: CLIP's input normalization (OpenAI's preprocessing), for images in [0, 1].
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


def tiny_clip_config(**overrides: Any) -> dict[str, Any]:
    """A 1-layer CLIP of width 32 (text) and 32 (vision, 16 x 16 images, 8 x 8 patches), projection 32, for tests
    and CPU runs: ``CLIP(config=tiny_clip_config())``. Its text side takes 48 tokens and a byte-level vocabulary
    (ids 1-256 are UTF-8 bytes + 1, 318 is the start and 319 the end of a text), so it needs no tokenizer files.

    Args:
        **overrides: Top-level config entries to change (``projection_dim``; ``text_config`` and ``vision_config``
            dicts are merged into the defaults).

    Returns:
        The config as a dict with ``model_type: clip``, usable as :class:`CLIP`'s ``config`` (and in YAML).
    """
    config: dict[str, Any] = {
        "model_type": "clip",
        "projection_dim": 32,
        "text_config": {
            "vocab_size": 320,
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "max_position_embeddings": 48,
            "pad_token_id": 0,
            "bos_token_id": 318,
            "eos_token_id": 319,
        },
        "vision_config": {
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "image_size": 16,
            "patch_size": 8,
        },
    }
    for key in ("text_config", "vision_config"):
        config[key].update(overrides.pop(key, {}))
    config.update(overrides)
    return config


class CLIP(Backbone):
    """A frozen transformers ``CLIPModel``: image features for a head, text features of learned prompts.

    Args:
        path: A local folder holding a transformers CLIP model (``config.json``, the weights, and the tokenizer's
            ``vocab.json`` + ``merges.txt`` or ``tokenizer.json``), e.g. ``openai/clip-vit-base-patch16`` fetched
            once with ``huggingface-cli download openai/clip-vit-base-patch16 --local-dir <folder>``; loaded with
            ``from_pretrained(path, local_files_only=True)``: nothing is downloaded.
        config: A CLIP config as a dict with ``model_type: clip`` (e.g. :func:`tiny_clip_config`), for a randomly
            initialized model with the byte-level tokenizer (a warning says so). Exactly one of ``path`` and
            ``config``.
    """

    def __init__(self, *, path: str | os.PathLike | None = None, config: dict[str, Any] | None = None) -> None:
        problems = []
        if (path is None) == (config is None):
            problems.append(
                f"give exactly one of path (a local CLIP folder) and config (a dict for a random model), "
                f"got path={path!r}, config={config!r}"
            )
        if config is not None and (not isinstance(config, dict) or config.get("model_type") != "clip"):
            problems.append(f"config must be a dict with model_type 'clip' (e.g. tiny_clip_config()), got {config!r}")
        _raise_if(problems, "CLIP")
        self.path = Path(path).expanduser() if path is not None else None
        self.config = dict(config) if config is not None else None

    @override
    def build(self) -> CLIPEncoders:
        """Load (or randomly create) the CLIP model and its tokenizer.

        Raises:
            InputFileError: If ``path`` lacks ``config.json`` or the tokenizer files.
        """
        # Imported here: transformers takes seconds to import, and most runs never need it.
        from transformers import CLIPConfig, CLIPModel

        if self.path is not None:
            path = self.path
            has_tokenizer = (path / "tokenizer.json").is_file() or (
                (path / "vocab.json").is_file() and (path / "merges.txt").is_file()
            )
            if not (path / "config.json").is_file() or not has_tokenizer:
                raise InputFileError(
                    f"CLIP: path={str(path)!r} is not a transformers CLIP folder (it must hold config.json, the "
                    "weights (model.safetensors) and the tokenizer (vocab.json + merges.txt or tokenizer.json)). "
                    "fedlit never downloads: fetch it once on a connected machine (`huggingface-cli download "
                    "openai/clip-vit-base-patch16 --local-dir <folder>`) and give that folder"
                )
            from transformers import AutoTokenizer

            model = CLIPModel.from_pretrained(path, local_files_only=True)
            tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
            encode = _hf_encoder(tokenizer)
        else:
            config = dict(self.config or {})
            config.pop("model_type")
            try:
                model = CLIPModel(CLIPConfig(**config))
            except (TypeError, ValueError) as err:
                raise ConfigError(f"CLIP: config={self.config!r} is not a valid CLIP config: {err}") from err
            vocab_size = cast("CLIPTextConfig", model.config.text_config).vocab_size
            if vocab_size < 259:
                raise ConfigError(
                    "CLIP: config.text_config.vocab_size must be >= 259 for the byte-level tokenizer "
                    f"of a random CLIP, got {vocab_size}"
                )
            encode = _byte_encode
            warnings.warn(
                "CLIP: built from config, so the model is randomly initialized and tokenizes bytes "
                "(fedlit never downloads weights; set path to a local CLIP folder)",
                UserWarning,
                stacklevel=2,
            )
        model.requires_grad_(False)
        return CLIPEncoders(model, encode)


def _byte_encode(text: str) -> list[int]:
    return [b + 1 for b in text.encode("utf-8")]


def _hf_encoder(tokenizer: Any) -> Any:
    def encode(text: str) -> list[int]:
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])

    return encode


class CLIPEncoders(nn.Module):
    """The module :meth:`CLIP.build` returns: the transformers ``CLIPModel`` (under ``model``) and a tokenizer.

    ``forward(images)`` gives the projected image features (B, ``num_features``); images (B, C, H, W) with 1 channel
    are repeated to 3, and resized (bilinear) to CLIP's input size when they differ from it. Normalization is the
    data's or the task module's business (``CLIP_MEAN``, ``CLIP_STD`` for images in [0, 1]).

    Args:
        model: A transformers ``CLIPModel``.
        encode: Text -> token ids, without start and end tokens.
    """

    def __init__(self, model: CLIPModel, encode: Any) -> None:
        super().__init__()
        self.model = model
        self.encode = encode
        # CLIPConfig's __post_init__ turns the text and vision configs given as dicts into config objects, and
        # sets projection_dim and image_size, which transformers types as optional.
        text_config = cast("CLIPTextConfig", model.config.text_config)
        self.num_features: int = int(cast(int, model.config.projection_dim))
        self.width: int = int(text_config.hidden_size)
        self.context_length: int = int(text_config.max_position_embeddings)
        size = cast("CLIPVisionConfig", model.config.vision_config).image_size
        pair = tuple(size) if isinstance(size, (list, tuple)) else (size, size)
        self.image_size: tuple[int, int] = cast("tuple[int, int]", pair)

    @property
    def logit_scale(self) -> Tensor:
        """CLIP's learned temperature ``s = exp(logit_scale)`` (a scalar tensor)."""
        return self.model.logit_scale.exp()

    @override
    def forward(self, images: Tensor) -> Tensor:
        """Projected image features (B, num_features), not normalized."""
        if images.shape[1] == 1:
            images = images.expand(-1, 3, -1, -1)
        if tuple(images.shape[-2:]) != self.image_size:
            images = F.interpolate(images, size=self.image_size, mode="bilinear", align_corners=False)
        pooled = self.model.vision_model(pixel_values=images).pooler_output
        return self.model.visual_projection(pooled)

    def prompt_tokens(self, names: list[str], num_context: int) -> tuple[Tensor, Tensor]:
        """The token ids of CoOp's prompts ``[SOS] X ... X <name>. [EOS]`` (``num_context`` placeholders X, which
        the learned context replaces) and the position of each end token, cut to the longest prompt.

        Returns:
            ids (C, L) int64 (padding 0, after the end token, which causal attention never lets the end token see)
            and the end positions (C,) int64.

        Raises:
            ConfigError: If a prompt does not fit CLIP's context length.
        """
        config = cast("CLIPTextConfig", self.model.config.text_config)
        placeholder = self.encode("X")[:1]
        rows = [
            [config.bos_token_id] + placeholder * num_context + self.encode(f"{name}.") + [config.eos_token_id]
            for name in names
        ]
        longest = max(len(r) for r in rows)
        if longest > self.context_length:
            raise ConfigError(
                f"The prompt of class {names[[len(r) for r in rows].index(longest)]!r} takes {longest} "
                f"tokens with {num_context} context tokens; CLIP takes {self.context_length}: lower "
                "model.init_args.num_context or shorten the class name."
            )
        ids = torch.tensor([r + [0] * (longest - len(r)) for r in rows], dtype=torch.int64)
        eos = torch.tensor([len(r) - 1 for r in rows], dtype=torch.int64)
        return ids, eos

    def token_embedding(self, ids: Tensor) -> Tensor:
        """CLIP's token embeddings of ``ids`` (..., L) -> (..., L, width)."""
        return self.model.text_model.embeddings.token_embedding(ids)

    def encode_prompts(self, embeddings: Tensor, eos: Tensor) -> Tensor:
        """Text features (C, num_features), not normalized, of prompts given as token embeddings (C, L, width):
        position embeddings added, the causal text transformer, the final layer norm, the end token's state
        (position ``eos``), CLIP's text projection (CoOp's ``TextEncoder``)."""
        from transformers.masking_utils import create_causal_mask

        text = self.model.text_model
        hidden = text.embeddings(inputs_embeds=embeddings)
        mask = create_causal_mask(config=text.config, inputs_embeds=hidden, attention_mask=None, cache=None)
        hidden = text.encoder(inputs_embeds=hidden, attention_mask=mask, is_causal=True).last_hidden_state
        hidden = text.final_layer_norm(hidden)
        pooled = hidden[torch.arange(len(hidden), device=hidden.device), eos.to(hidden.device)]
        return self.model.text_projection(pooled)
