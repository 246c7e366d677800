"""wav2vec 2.0 (Baevski et al., NeurIPS 2020) as an audio backbone, loaded from a local folder only.

FHBench (Wang et al., "FHBench: Towards Efficient and Personalized Federated Learning for Multimodal Healthcare",
arXiv 2025) fine-tunes wav2vec2-base-960h with rank-8 LoRA on the attention's ``q_proj`` and ``v_proj`` for its
respiratory-sound tasks (ICBHI 2017, SPRSound); :class:`Wav2Vec2Encoder` is that backbone in fedlit's form.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import Tensor, nn
from typing_extensions import override

from fedlit.core.errors import ConfigError, InputFileError
from fedlit.models.backbones import Backbone, _raise_if
from fedlit.models.hf import _config_problems, _report_loading
from fedlit.models.lora import LoRA

if TYPE_CHECKING:
    from transformers import Wav2Vec2Model

__all__ = ["Wav2Vec2Encoder", "Wav2Vec2Features", "tiny_wav2vec2_config"]

# peft's module names for wav2vec 2.0's attention; FHBench's LoRA targets.
DEFAULT_LORA_TARGETS = ["q_proj", "v_proj"]


def tiny_wav2vec2_config(**overrides: Any) -> dict[str, Any]:
    """A 2-layer wav2vec 2.0 with hidden size 32 and a 2-layer feature encoder (stride 10), for tests and quick
    runs: `Wav2Vec2Encoder(config=tiny_wav2vec2_config())`.

    Time masking (SpecAugment, `mask_time_prob`) and layer drop are off, so a training step draws nothing from
    numpy's global generator (transformers draws the masks there) and runs are reproducible from fedlit's seeds.

    Args:
        **overrides: Config entries to change, e.g. `num_hidden_layers=4`.

    Returns:
        The config as a dict, usable as `Wav2Vec2Encoder`'s `config` option (and in YAML).
    """
    config: dict[str, Any] = {
        "model_type": "wav2vec2",
        "hidden_size": 32,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "intermediate_size": 64,
        "conv_dim": [16, 16],
        "conv_kernel": [10, 3],
        "conv_stride": [5, 2],
        "num_conv_pos_embeddings": 16,
        "num_conv_pos_embedding_groups": 2,
        "mask_time_prob": 0.0,
        "layerdrop": 0.0,
    }
    config.update(overrides)
    return config


class Wav2Vec2Encoder(Backbone):
    """transformers' `Wav2Vec2Model`, mean-pooled over time: a waveform batch (B, samples) -> (B, hidden_size).

    The input is a float waveform at the model's sampling rate (16 kHz for wav2vec2-base and every published
    wav2vec 2.0 checkpoint); (B, 1, samples) is accepted too. With `normalize` each waveform is first scaled to zero
    mean and unit variance, (x - mean) / sqrt(var + 1e-7), as transformers' `Wav2Vec2FeatureExtractor` does with
    `do_normalize=True` (the setting of wav2vec2-base-960h, the checkpoint FHBench uses). The hidden states of the
    last layer are averaged over time (every frame: fedlit's audio data sets pad or crop to a fixed length). The
    pooled vector goes straight to the task's head; transformers' `Wav2Vec2ForSequenceClassification` would first
    project it to 256 features.

    Parameters are named as in transformers' task models, under `wav2vec2.` (e.g.
    `wav2vec2.encoder.layers.0.attention.q_proj.weight`; the convolutional feature encoder is
    `wav2vec2.feature_extractor.*`). LoRA's default targets are `q_proj` and `v_proj` of every attention layer
    (FHBench's), named `...attention.q_proj.lora_A.default.weight` and so on, so EPFL, FedSA and the role pattern
    `backbone.*lora_*` find them. What trains is set by the recipe's roles (FHBench: everything frozen, the feature
    encoder included, but LoRA and the head).

    A checkpoint's own config keeps its SpecAugment time masking (`mask_time_prob`, 0.05 for wav2vec2-base) and
    layer drop during training; transformers draws the time masks from numpy's global generator.

    Args:
        path: A local folder holding a transformers wav2vec 2.0 model (`config.json` and weights, e.g. a download
            of facebook/wav2vec2-base-960h), loaded with `Wav2Vec2Model.from_pretrained(path,
            local_files_only=True)`: nothing is downloaded. A CTC checkpoint's `lm_head` is reported as unused.
        config: A transformers config as a dict with `model_type: wav2vec2` (e.g. `tiny_wav2vec2_config()`), for a
            randomly initialized model (a warning says so). Exactly one of `path` and `config`.
        normalize: Scale each waveform to zero mean and unit variance first.
        lora: LoRA adapters; default targets `["q_proj", "v_proj"]`.
    """

    def __init__(
        self,
        *,
        path: str | os.PathLike | None = None,
        config: dict[str, Any] | None = None,
        normalize: bool = True,
        lora: LoRA | None = None,
    ) -> None:
        problems = []
        if (path is None) == (config is None):
            problems.append(
                "give exactly one of path (a local wav2vec 2.0 model folder) and config (a dict for a random "
                f"model), got path={path!r}, config={config!r}"
            )
        if path is not None:
            path = Path(path).expanduser()
        if config is not None:
            problems += _config_problems(config)
            if isinstance(config, dict) and config.get("model_type") not in (None, "wav2vec2"):
                problems.append(f"config.model_type must be 'wav2vec2', got {config.get('model_type')!r}")
        if not isinstance(normalize, bool):
            problems.append(f"normalize must be true or false, got {normalize!r}")
        if lora is not None and not isinstance(lora, LoRA):
            problems.append(f"lora must be a fedlit.models.LoRA or null, got {type(lora).__name__}")
        _raise_if(problems, "Wav2Vec2Encoder")
        self.path = path
        self.config = dict(config) if config is not None else None
        self.normalize = normalize
        self.lora = lora

    @override
    def build(self) -> nn.Module:
        """Load (or randomly create) the model, then inject LoRA.

        Raises:
            InputFileError: If `path` is not a folder with a `config.json` (the message shows the path tried).
        """
        # Imported here: transformers takes seconds to import, and runs without audio never need it.
        from transformers import Wav2Vec2Config, Wav2Vec2Model

        if self.path is not None:
            if not (self.path / "config.json").is_file():
                raise InputFileError(
                    f"Wav2Vec2Encoder: path={str(self.path)!r} is not a transformers model folder (tried "
                    f"{self.path.resolve() / 'config.json'}). fedlit never downloads: fetch the model once on a "
                    "connected machine (e.g. `huggingface-cli download facebook/wav2vec2-base-960h --local-dir "
                    "<folder>`) and give that folder"
                )
            # transformers types from_pretrained as returning the model alone, also with output_loading_info.
            model, info = cast(
                "tuple[Wav2Vec2Model, dict[str, Any]]",
                Wav2Vec2Model.from_pretrained(self.path, local_files_only=True, output_loading_info=True),
            )
            _report_loading(self.path, info)
        else:
            config = dict(self.config or {})  # the constructor guarantees exactly one of path, config
            config.pop("model_type")
            model = Wav2Vec2Model(Wav2Vec2Config(**config))
            warnings.warn(
                "Wav2Vec2Encoder: built from config, so the encoder is randomly initialized (fedlit never downloads "
                "weights; set path to a local wav2vec 2.0 folder, e.g. one holding facebook/wav2vec2-base-960h)",
                UserWarning,
                stacklevel=2,
            )
        if self.lora is not None:
            self.lora.apply(model, default_target_modules=DEFAULT_LORA_TARGETS)
        return Wav2Vec2Features(model, normalize=self.normalize)


class Wav2Vec2Features(nn.Module):
    """The module `Wav2Vec2Encoder.build()` returns: optional per-waveform normalization, the model, mean pooling.

    Args:
        model: A transformers `Wav2Vec2Model`, registered as `wav2vec2`.
        normalize: Scale each waveform to zero mean and unit variance first.
    """

    def __init__(self, model: Wav2Vec2Model, *, normalize: bool = True) -> None:
        super().__init__()
        self.wav2vec2 = model
        self.normalize = normalize
        self.num_features: int = model.config.hidden_size

    @override
    def forward(self, waveforms: Tensor) -> Tensor:
        """Encode a batch of waveforms.

        Args:
            waveforms: Float tensor (B, samples) or (B, 1, samples), at the model's sampling rate.

        Returns:
            Time-averaged last hidden states (B, hidden_size).
        """
        if waveforms.ndim == 3 and waveforms.shape[1] == 1:
            waveforms = waveforms[:, 0]
        if waveforms.ndim != 2 or not waveforms.is_floating_point():
            raise ConfigError(
                "Wav2Vec2Encoder expects float waveforms (B, samples) or (B, 1, samples), got a "
                f"{waveforms.dtype} tensor of shape {tuple(waveforms.shape)}; use an audio data set such as "
                "fedlit.data.ICBHI"
            )
        if self.normalize:
            mean = waveforms.mean(dim=1, keepdim=True)
            var = waveforms.var(dim=1, keepdim=True, unbiased=False)
            waveforms = (waveforms - mean) / torch.sqrt(var + 1e-7)
        hidden = self.wav2vec2(waveforms).last_hidden_state
        return hidden.mean(dim=1)
