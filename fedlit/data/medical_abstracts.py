"""Medical Abstracts: disease-class prediction from the text of medical abstracts, tokenized for an encoder."""

from __future__ import annotations

import csv
import io
import os
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
from typing_extensions import override

from fedlit.core.errors import ConfigError, DataError
from fedlit.data.common.datamodule import FederatedDataModule, is_int
from fedlit.data.common.partition import Dirichlet, Partitioner
from fedlit.data.common.pool import PartitionedData
from fedlit.data.common.splits import check_split_fractions, split_clients
from fedlit.data.common.text import decode_utf8, not_utf8

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

TEXT_FILE = "medical_tc_test.csv"
LABELS_FILE = "medical_tc_labels.csv"
COLUMNS = ("condition_label", "medical_abstract")
# The corpus's five classes, in label order 1..5 (medical_tc_labels.csv); targets are label - 1.
CLASS_NAMES = (
    "neoplasms",
    "digestive system diseases",
    "nervous system diseases",
    "cardiovascular diseases",
    "general pathological conditions",
)
_URL = "https://github.com/sebischair/Medical-Abstracts-TC-Corpus"


class MedicalAbstracts(FederatedDataModule):
    """The Medical Abstracts corpus split into ``num_clients`` clients, tokenized with a text encoder's tokenizer.

    Source: Schopf, Braun and Matthes, "Evaluating Unsupervised Text Classification: Zero-shot and
    Similarity-based Approaches", NLPIR 2022 (https://github.com/sebischair/Medical-Abstracts-TC-Corpus), the
    text data set of FHBench. License: CC BY-SA 3.0. Five classes: neoplasms, digestive system, nervous system,
    cardiovascular diseases, general pathological conditions (``condition_label`` 1..5, targets 0..4).

    Protocol: the rows of ``medical_tc_test.csv`` (2,888 abstracts; the corpus's train file is another
    download) form the pool, optionally cut to a seeded random ``max_samples`` rows (kept in file order); the
    pool is partitioned into clients by ``partitioner`` (default Dir(0.5) over the labels) and each client is
    split into train/val/test by ``split_fractions``, stratified by label. Every abstract is tokenized once,
    in ``build()``, by the encoder's own tokenizer (transformers' ``AutoTokenizer`` from a local folder:
    nothing is downloaded), truncated and padded to ``max_length`` tokens. Inputs are int64 tensors (N, 2,
    max_length): token ids, then attention mask; ``HFEncoder`` takes that form and drops the padding columns a
    batch does not need.

    A missing or unreadable file, a missing column, a label outside 1..5 or an empty abstract is refused naming
    the file and line.

    Args:
        root: folder holding ``medical_tc_test.csv`` (and optionally ``medical_tc_labels.csv``, whose names
            are checked against the five classes).
        tokenizer: a pretrained name fedlit knows (``minilm_l6_v2``, see ``fedlit.models.PRETRAINED``) or a
            local folder holding a transformers tokenizer; use the tokenizer of the recipe's encoder.
        max_length: tokens per abstract, [CLS] and [SEP] included (longer abstracts are truncated).
        num_clients: number of clients; ids ``client_0``, ``client_1``, ...
        partitioner: how the pool is split into clients (default ``Dirichlet(alpha=0.5)``).
        split_fractions: (train, val, test) fractions of every client; val may be 0.
        max_samples: use a seeded random subset of this many abstracts (quick runs); None uses all.
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
        max_length: int = 128,
        num_clients: int = 5,
        partitioner: Partitioner | None = None,
        split_fractions: tuple[float, float, float] = (0.4, 0.3, 0.3),
        max_samples: int | None = None,
        batch_size: int = 16,
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
        if max_samples is not None and (not is_int(max_samples) or max_samples < 1):
            problems.append(f"data.init_args.max_samples must be null or an integer >= 1, got {max_samples!r}")
        if partitioner is not None and not isinstance(partitioner, Partitioner):
            problems.append(
                f"data.init_args.partitioner must be a Partitioner (IID, Dirichlet, Pathological, Shards), "
                f"got {partitioner!r}"
            )
        if problems:
            raise ConfigError("; ".join(problems))
        self.root = Path(root).expanduser()
        if not (self.root / TEXT_FILE).is_file():
            where = f"folder {self.root} lacks {TEXT_FILE}" if self.root.is_dir() else f"no folder {self.root}"
            raise DataError(
                f"data.init_args.root: {where}. It must hold {TEXT_FILE} of the Medical Abstracts corpus "
                f"(columns {','.join(COLUMNS)}; {_URL})"
            )
        self.tokenizer = str(tokenizer)
        tokenizer_folder(self.tokenizer, check_package=False)  # a typo fails now, before a model is built
        self.max_length = max_length
        self.num_clients = num_clients
        self.partitioner: Partitioner = partitioner if partitioner is not None else Dirichlet(alpha=0.5)
        self.split_fractions = tuple(float(f) for f in split_fractions)
        self.max_samples = max_samples

    @override
    def build(self) -> PartitionedData:
        path = self.root / TEXT_FILE
        labels, texts, lines = read_abstracts(path)
        _check_label_names(self.root / LABELS_FILE)
        subset_rng, part_rng, split_rng = np.random.default_rng(self.seed).spawn(3)
        rows = np.arange(len(labels))
        if self.max_samples is not None and self.max_samples < len(rows):
            rows = np.sort(subset_rng.permutation(len(rows))[: self.max_samples])
        targets = labels[rows] - 1
        tokens = load_tokenizer(self.tokenizer)(
            [texts[i] for i in rows],
            max_length=self.max_length,
            truncation=True,
            padding="max_length",
            return_tensors="pt",
        )
        inputs = torch.stack([tokens["input_ids"], tokens["attention_mask"]], dim=1).long().contiguous()
        parts = self.partitioner(targets, self.num_clients, part_rng)
        client_ids = [f"client_{i}" for i in range(self.num_clients)]
        return PartitionedData(
            name="medical_abstracts",
            task="multiclass",
            num_classes=len(CLASS_NAMES),
            inputs=inputs,
            targets=torch.from_numpy(targets),
            splits=split_clients(parts, targets, self.split_fractions, split_rng, client_ids),
            partitioner=repr(self.partitioner),
            details={
                "path": str(path),
                "tokenizer": self.tokenizer,
                "max_length": self.max_length,
                "class_names": list(CLASS_NAMES),
                "lines": [int(lines[i]) for i in rows],
                "split_fractions": list(self.split_fractions),
            },
        )


def read_abstracts(path: Path) -> tuple[np.ndarray, list[str], list[int]]:
    """Labels (1..5, int64), abstracts and their line numbers in the file (the header is line 1).

    Raises:
        DataError: naming the file and line of a missing column, a label outside 1..5 or an empty abstract.
    """
    try:
        with path.open(newline="", encoding="utf-8") as handle:
            reader = csv.reader(handle)
            header = next(reader, None)
            if header is None or [h.strip() for h in header[:2]] != list(COLUMNS):
                raise DataError(
                    f"{path}: the header line must be {','.join(COLUMNS)}, got {header!r}; this is not the "
                    f"Medical Abstracts file ({_URL})"
                )
            labels, texts, lines = [], [], []
            for row in reader:
                line = reader.line_num
                if not row:
                    continue
                if len(row) < 2:
                    raise DataError(f"{path}, line {line}: {len(row)} field(s), expected {','.join(COLUMNS)}")
                label, text = row[0].strip(), row[1].strip()
                if label not in {"1", "2", "3", "4", "5"}:
                    raise DataError(
                        f"{path}, line {line}: condition_label is {label!r}, not one of 1..5 (the five classes "
                        f"of {LABELS_FILE}); fix or drop the row"
                    )
                if not text:
                    raise DataError(f"{path}, line {line}: medical_abstract is empty; fix or drop the row")
                labels.append(int(label))
                texts.append(text)
                lines.append(line)
    except UnicodeDecodeError:  # the error's position is within a chunk: not_utf8 finds the file's byte
        raise DataError(f"{not_utf8(path)}; or download it again from {_URL}") from None
    except csv.Error as err:
        raise DataError(f"{path} is not a readable CSV file ({err}); download it again from {_URL}") from None
    if not labels:
        raise DataError(f"{path} holds no abstract (only a header line); download it again from {_URL}")
    return np.asarray(labels, dtype=np.int64), texts, lines


def _check_label_names(path: Path) -> None:
    """Refuse a labels file whose names differ from the corpus's five classes (another label order)."""
    if not path.is_file():
        return
    rows = list(csv.reader(io.StringIO(decode_utf8(path, path.read_bytes()), newline="")))
    names = {row[0].strip(): row[1].strip() for row in rows[1:] if len(row) >= 2}
    expected = {str(i + 1): name for i, name in enumerate(CLASS_NAMES)}
    if names != expected:
        raise DataError(f"{path}: label names {names} differ from the corpus's {expected}; is this another corpus?")


def load_tokenizer(tokenizer: str) -> PreTrainedTokenizerBase:
    """A transformers tokenizer from a pretrained name fedlit knows or a local folder, never downloaded.

    Raises:
        ConfigError: naming ``data.init_args.tokenizer`` when the name is unknown, its package is not
            installed, or the folder holds no tokenizer.
    """
    folder = tokenizer_folder(tokenizer)
    # Imported here: transformers takes seconds to import, and image or tabular runs never need it.
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(folder, local_files_only=True)
    except (OSError, ValueError) as err:
        raise ConfigError(
            f"data.init_args.tokenizer={tokenizer!r}: no transformers tokenizer could be loaded from {folder} "
            f"({err}); give the folder of a model saved with its tokenizer"
        ) from None


def tokenizer_folder(tokenizer: str, *, check_package: bool = True) -> Path | None:
    """The folder of a known pretrained name (None if not checking its package) or of a local tokenizer."""
    from fedlit.models.weights import PRETRAINED, check_weights_name, resolve_weights

    option = "data.init_args.tokenizer"
    if tokenizer in PRETRAINED:
        if not check_package:
            check_weights_name(tokenizer, option, kind="transformers")
            return None
        return resolve_weights(tokenizer, option, kind="transformers")
    folder = Path(tokenizer).expanduser()
    if not folder.is_dir():
        names = [n for n, entry in PRETRAINED.items() if entry.kind == "transformers"]
        raise ConfigError(
            f"{option}={tokenizer!r} is neither a known pretrained name ({', '.join(names)}) nor a folder "
            "holding a transformers tokenizer; give the name or folder of the recipe's encoder"
        )
    return folder
