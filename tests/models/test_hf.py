"""HFEncoder on tiny random BERTs: pooling, loading from a local folder, option checks."""

from __future__ import annotations

import warnings

import pytest
import torch
from transformers import AutoConfig, AutoModel

from fedlit.models import HFEncoder, tiny_bert_config


def _quiet_build(spec: HFEncoder) -> torch.nn.Module:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return spec.build()


def test_random_encoder_warns_and_pools(tokens: dict[str, torch.Tensor]) -> None:
    with pytest.warns(UserWarning, match="randomly initialized"):
        model = HFEncoder(config=tiny_bert_config()).build().eval()
    assert model.num_features == 32 and model.prefix == "bert"
    names = [name for name, _ in model.named_parameters()]
    assert names[0] == "bert.embeddings.word_embeddings.weight"
    assert not any("pooler" in name for name in names)
    hidden = model.hf_model(**tokens).last_hidden_state
    assert torch.equal(model(tokens), hidden[:, 0])


def test_mean_pooling_ignores_padding(tokens: dict[str, torch.Tensor]) -> None:
    model = _quiet_build(HFEncoder(config=tiny_bert_config(), pooling="mean")).eval()
    pooled = model(tokens)
    alone = {key: value[1:, :3] for key, value in tokens.items()}  # the second text without its padding
    assert torch.allclose(pooled[1], model(alone)[0], atol=1e-6)
    hidden = model.hf_model(**alone).last_hidden_state
    assert torch.allclose(model(alone)[0], hidden[0].mean(dim=0), atol=1e-6)


def test_loads_local_folder(tmp_path, tokens: dict[str, torch.Tensor]) -> None:
    config = dict(tiny_bert_config())
    source = AutoModel.from_config(AutoConfig.for_model(config.pop("model_type"), **config)).eval()
    source.save_pretrained(tmp_path)
    # The saved model has a pooler; fedlit pools itself and reports the pooler as unused.
    with pytest.warns(UserWarning, match=r"checkpoint tensors were not used: \['pooler.dense.bias'"):
        model = HFEncoder(path=tmp_path).build().eval()
    for name, value in model.hf_model.state_dict().items():
        assert torch.equal(value, source.state_dict()[name]), name
    assert torch.equal(model(tokens), source(**tokens).last_hidden_state[:, 0])


def test_missing_folder_names_option_and_path(tmp_path) -> None:
    spec = HFEncoder(path=tmp_path / "bert")
    with pytest.raises(FileNotFoundError, match=r"path=.*bert.*tried .*config\.json.*never downloads"):
        spec.build()


def test_batch_keys_are_checked(tokens: dict[str, torch.Tensor]) -> None:
    model = _quiet_build(HFEncoder(config=tiny_bert_config()))
    with pytest.raises(KeyError, match=r"\['attention_mask'\] missing"):
        model({"input_ids": tokens["input_ids"]})


def test_options_validated_together() -> None:
    with pytest.raises(ValueError) as error:
        HFEncoder(pooling="max")  # type: ignore[arg-type]
    assert "exactly one of path" in str(error.value) and "pooling='max'" in str(error.value)
    with pytest.raises(ValueError, match="exactly one of path"):
        HFEncoder(path="/models/bert", config=tiny_bert_config())
    with pytest.raises(ValueError, match=r"config.hidden_sise is not an option of BertConfig .*hidden_size"):
        HFEncoder(config=tiny_bert_config(hidden_sise=64))
    with pytest.raises(ValueError, match=r"model_type='bertt' is not a transformers model type .*'bert'"):
        HFEncoder(config={"model_type": "bertt"})
    with pytest.raises(ValueError, match="config must be a dict with a model_type"):
        HFEncoder(config={"hidden_size": 32})


def test_repr_shows_arguments() -> None:
    assert repr(HFEncoder(path="/models/minilm", pooling="mean")) == (
        "HFEncoder(path='/models/minilm', config=None, pooling='mean', lora=None, weights=None)"
    )


def test_packed_tensor_equals_the_dict_batch(tokens: dict[str, torch.Tensor]) -> None:
    model = _quiet_build(HFEncoder(config=tiny_bert_config(), pooling="mean")).eval()
    # Two extra padding columns, as a data set padded to a fixed max_length gives: dropped, output unchanged.
    padded = {key: torch.nn.functional.pad(value, (0, 2)) for key, value in tokens.items()}
    packed = torch.stack([padded["input_ids"], padded["attention_mask"]], dim=1)
    assert packed.shape == (2, 2, 8)
    with torch.no_grad():
        assert torch.allclose(model(packed), model(tokens), atol=1e-6)
        cls = _quiet_build(HFEncoder(config=tiny_bert_config())).eval()
        assert torch.allclose(cls(packed), cls(tokens), atol=1e-6)
    with pytest.raises(ValueError, match=r"integer tensor \(B, 2, L\).*float32 tensor of shape \(2, 2, 8\)"):
        model(packed.float())
