"""PubMed 200k RCT: the role of each sentence of a randomized-controlled-trial abstract, tokenized for an encoder."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

import numpy as np
import torch
from typing_extensions import override

from fedlit.core.errors import ConfigError, DataError
from fedlit.data.common.datamodule import FederatedDataModule, is_int
from fedlit.data.common.partition import Dirichlet, Partitioner
from fedlit.data.common.pool import PartitionedData
from fedlit.data.common.splits import SPLITS, check_split_fractions, split_clients
from fedlit.data.common.text import decode_utf8
from fedlit.data.medical_abstracts import load_tokenizer, tokenizer_folder

#: The official files, in split order (train, val, test).
FILES = ("train.txt", "dev.txt", "test.txt")
#: The five sentence roles, in target order.
CLASS_NAMES = ("BACKGROUND", "OBJECTIVE", "METHODS", "RESULTS", "CONCLUSIONS")
URL = "https://github.com/Franck-Dernoncourt/pubmed-rct"


class PubMedRCT(FederatedDataModule):
    """PubMed 200k RCT's sentences, labelled with their role in the abstract, partitioned into clients.

    Source: Dernoncourt and Lee, "PubMed 200k RCT: a Dataset for Sequential Sentence Classification in Medical
    Abstracts", IJCNLP 2017 (https://github.com/Franck-Dernoncourt/pubmed-rct): about 200,000 abstracts of randomized
    controlled trials, 2.3 million sentences, each labelled BACKGROUND, OBJECTIVE, METHODS, RESULTS or
    CONCLUSIONS (targets 0..4 in that order); the text data set of FHBench (Wang et al., arXiv 2025). The
    repository's ``PubMed_20k_RCT`` folders (and the ``numbers_replaced_with_at_sign`` ones) have the same layout
    and load the same way.

    Layout: ``train.txt``, ``dev.txt`` and ``test.txt`` (the 200k ``train.txt`` ships as ``train.7z``: unpack
    it). An abstract starts with a line ``###<PubMed id>``, then one line per sentence, ``LABEL<TAB>sentence``,
    and ends with a blank line.

    Protocol: every sentence of the three files is one sample (the model sees the sentence alone), optionally cut
    to a seeded random ``max_samples`` (kept in file order). ``partitioner`` deals the sentences to clients
    (default ``Dirichlet(alpha=0.1)`` over the labels, FHBench's label skew); ``split: clients`` splits every
    client by ``split_fractions`` (FHBench: 4:3:3), stratified by label; ``split: official`` keeps each sentence's
    file within every client (train.txt -> train, dev.txt -> val, test.txt -> test). Sentences are tokenized once,
    in ``build()``, by the encoder's own tokenizer (transformers, from a local folder or a name fedlit knows:
    nothing is downloaded), truncated and padded to ``max_length``: inputs are int64 (N, 2, max_length), token ids
    then attention mask, as ``HFEncoder`` takes them. The manifest's details give every sample's abstract id,
    file and line.

    Args:
        root: folder holding ``train.txt``, ``dev.txt`` and ``test.txt``.
        tokenizer: a pretrained name fedlit knows (``minilm_l6_v2``) or a local folder holding a transformers
            tokenizer (e.g. a saved ``roberta-base``); use the tokenizer of the recipe's encoder.
        max_length: tokens per sentence, special tokens included (longer sentences are truncated).
        num_clients: number of clients; ids ``client_0``, ``client_1``, ...
        partitioner: how the sentences are dealt to clients (default ``Dirichlet(alpha=0.1)``).
        split: ``clients`` (``split_fractions`` per client) or ``official`` (the sentence's file).
        split_fractions: (train, val, test) fractions of every client, with ``split: clients``.
        max_samples: use a seeded random subset of this many sentences (quick runs); None uses all.
        batch_size: training batch size.
        eval_batch_size: val/test batch size (default ``batch_size``).
        num_workers: DataLoader worker processes.
        seed: seed of the subset, the partition and the splits.
    """

    task = "multiclass"

    def __init__(
        self,
        *,
        root: str | os.PathLike,
        tokenizer: str | os.PathLike = "minilm_l6_v2",
        max_length: int = 64,
        num_clients: int = 20,
        partitioner: Partitioner | None = None,
        split: Literal["clients", "official"] = "clients",
        split_fractions: tuple[float, float, float] = (0.4, 0.3, 0.3),
        max_samples: int | None = None,
        batch_size: int = 32,
        eval_batch_size: int | None = None,
        num_workers: int = 0,
        seed: int = 0,
    ) -> None:
        super().__init__(batch_size=batch_size, eval_batch_size=eval_batch_size, num_workers=num_workers, seed=seed)
        check_split_fractions(split_fractions)
        problems = []
        for option, value, low in (("max_length", max_length, 8), ("num_clients", num_clients, 1)):
            if not is_int(value) or value < low:
                problems.append(f"data.init_args.{option} must be an integer >= {low}, got {value!r}")
        if split not in ("clients", "official"):
            problems.append(f"data.init_args.split must be one of ['clients', 'official'], got {split!r}")
        if max_samples is not None and (not is_int(max_samples) or max_samples < 1):
            problems.append(f"data.init_args.max_samples must be null or an integer >= 1, got {max_samples!r}")
        if partitioner is not None and not isinstance(partitioner, Partitioner):
            problems.append(
                f"data.init_args.partitioner must be a Partitioner (IID, Dirichlet, Pathological, "
                f"Shards), got {partitioner!r}"
            )
        if problems:
            raise ConfigError("; ".join(problems))
        self.root = Path(root).expanduser()
        absent = [name for name in FILES if not (self.root / name).is_file()]
        if absent:
            where = f"folder {self.root} lacks {', '.join(absent)}" if self.root.is_dir() else f"no folder {self.root}"
            packed = " (the 200k train.txt ships as train.7z: unpack it)" if (self.root / "train.7z").exists() else ""
            raise DataError(
                f"data.init_args.root: {where}{packed}. It must hold {', '.join(FILES)} of PubMed 200k "
                f"RCT (abstracts as ###<id> lines, then LABEL<TAB>sentence lines; {URL})"
            )
        self.tokenizer = str(tokenizer)
        tokenizer_folder(self.tokenizer, check_package=False)  # a typo fails now, before a model is built
        self.max_length = max_length
        self.num_clients = num_clients
        self.partitioner: Partitioner = partitioner if partitioner is not None else Dirichlet(alpha=0.1)
        self.split = split
        self.split_fractions = tuple(float(f) for f in split_fractions)
        self.max_samples = max_samples

    @override
    def build(self) -> PartitionedData:
        labels, sentences, abstracts, files, lines = [], [], [], [], []
        for number, name in enumerate(FILES):
            file_labels, file_sentences, file_abstracts, file_lines = read_rct(self.root / name)
            labels += file_labels
            sentences += file_sentences
            abstracts += file_abstracts
            files += [number] * len(file_labels)
            lines += file_lines
        subset_rng, part_rng, split_rng = np.random.default_rng(self.seed).spawn(3)
        rows = np.arange(len(labels))
        if self.max_samples is not None and self.max_samples < len(rows):
            rows = np.sort(subset_rng.permutation(len(rows))[: self.max_samples])
        targets = np.asarray(labels, dtype=np.int64)[rows]
        tokens = load_tokenizer(self.tokenizer)(
            [sentences[i] for i in rows],
            max_length=self.max_length,
            truncation=True,
            padding="max_length",
            return_tensors="pt",
        )
        inputs = torch.stack([tokens["input_ids"], tokens["attention_mask"]], dim=1).long().contiguous()
        parts = self.partitioner(targets, self.num_clients, part_rng)
        client_ids = [f"client_{i}" for i in range(self.num_clients)]
        source = np.asarray(files, dtype=np.int64)[rows]
        if self.split == "official":
            splits = {
                c: {s: part[source[part] == k] for k, s in enumerate(SPLITS)}
                for c, part in zip(client_ids, parts, strict=True)
            }
        else:
            splits = split_clients(parts, targets, self.split_fractions, split_rng, client_ids)
        return PartitionedData(
            name="pubmed_rct",
            task="multiclass",
            num_classes=len(CLASS_NAMES),
            inputs=inputs,
            targets=torch.from_numpy(targets),
            splits=splits,
            partitioner=repr(self.partitioner),
            details={
                "root": str(self.root),
                "tokenizer": self.tokenizer,
                "max_length": self.max_length,
                "class_names": list(CLASS_NAMES),
                "split": self.split,
                "split_fractions": list(self.split_fractions) if self.split == "clients" else None,
                "files": list(FILES),
                "abstract_id": [abstracts[i] for i in rows],
                "file": source.tolist(),
                "line": [lines[i] for i in rows],
            },
        )


def read_rct(path: Path) -> tuple[list[int], list[str], list[str], list[int]]:
    """Labels (0..4), sentences, abstract ids and line numbers (from 1) of one PubMed RCT file.

    Raises:
        DataError: naming the file and line of a sentence outside an abstract, a line without a tab, an unknown
            label or an empty sentence.
    """
    index = {name: i for i, name in enumerate(CLASS_NAMES)}
    labels: list[int] = []
    sentences: list[str] = []
    abstracts: list[str] = []
    lines: list[int] = []
    abstract: str | None = None
    for number, line in enumerate(decode_utf8(path, path.read_bytes()).splitlines(), start=1):
        text = line.strip()
        if not text:
            abstract = None  # a blank line ends the abstract
            continue
        if text.startswith("###"):
            abstract = text[3:].strip()
            continue
        where = f"{path}, line {number}"
        if abstract is None:
            raise DataError(
                f"{where}: a sentence outside an abstract (no ###<id> line above it since the last blank "
                f"line); is this a PubMed RCT file ({URL})?"
            )
        label, tab, sentence = line.partition("\t")
        if not tab:
            raise DataError(
                f"{where}: no tab between label and sentence in {line[:60]!r}; expected LABEL<TAB>"
                f"sentence with LABEL one of {list(CLASS_NAMES)}"
            )
        if label.strip() not in index:
            raise DataError(f"{where}: label {label!r} is not one of {list(CLASS_NAMES)}; fix or drop the line")
        if not sentence.strip():
            raise DataError(f"{where}: the sentence is empty; fix or drop the line")
        labels.append(index[label.strip()])
        sentences.append(sentence.strip())
        abstracts.append(abstract)
        lines.append(number)
    if not labels:
        raise DataError(f"{path} holds no labelled sentence; download it again from {URL}")
    return labels, sentences, abstracts, lines
