"""FedHeartDisease against FLamby's Fed-Heart-Disease protocol, on the real UCI files."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from sklearn.model_selection import train_test_split

from fedlit.core.errors import DataError
from fedlit.data import FedHeartDisease
from fedlit.data.heart_disease import CENTERS, FILES

SHARED_DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data"
SIZES = {"cleveland": (199, 104), "hungarian": (172, 89), "switzerland": (30, 16), "va": (85, 45)}


@pytest.fixture(scope="module")
def root() -> Path:
    folder = SHARED_DATA / "heart_disease"
    if not folder.is_dir():
        pytest.skip(f"real heart disease folder {folder} is absent (shared/data beside the repository)")
    return folder


@pytest.fixture(scope="module")
def heart(root: Path) -> FedHeartDisease:
    data = FedHeartDisease(root=root)
    data.setup()
    return data


def _flamby_reference(root: Path) -> dict[str, dict[str, tuple[torch.Tensor, torch.Tensor]]]:
    """FLamby's HeartDiseaseRaw written again, row by row as FLamby does, for an independent comparison."""
    features, labels, centers, sets = pd.DataFrame(), pd.DataFrame(), [], []
    for number, center in enumerate(CENTERS):
        df = pd.read_csv(root / f"processed.{center}.data", header=None, skiprows=1)  # these copies have a header
        df = df.replace("?", np.nan).drop([10, 11, 12], axis=1).dropna(axis=0).apply(pd.to_numeric)
        center_x, center_y = df.iloc[:, :-1], df.iloc[:, -1]
        features = pd.concat((features, center_x), ignore_index=True)
        labels = pd.concat((labels, center_y), ignore_index=True)
        centers += [number] * center_x.shape[0]
        current = center_y.where(center_y == 0, 1, inplace=False)
        levels = np.unique(current)
        stratify = current if len(levels) > 1 and all((current == lev).sum() > 2 for lev in levels) else None
        _, test = train_test_split(np.arange(len(df)), test_size=1.0 - 0.66, train_size=0.66, random_state=43,
                                   shuffle=True, stratify=stratify)  # fmt: skip
        sets += ["test" if i in test else "train" for i in range(len(df))]
    x = torch.from_numpy(pd.get_dummies(features, columns=[2, 6], drop_first=True).values.astype(np.float32))
    y = torch.from_numpy(labels.where(labels == 0, 1).values.astype(np.float32))[:, 0]
    reference = {}
    for number, center in enumerate(CENTERS):
        mask = {
            s: torch.tensor([c == number and t == s for c, t in zip(centers, sets, strict=True)])
            for s in ("train", "test")
        }
        mean, std = x[mask["train"]].mean(axis=0), x[mask["train"]].std(axis=0)
        reference[center] = {s: ((x[m] - mean) / (std + 1e-9), y[m]) for s, m in mask.items()}
    return reference


def _all(loader: torch.utils.data.DataLoader) -> tuple[torch.Tensor, torch.Tensor]:
    xs, ys = zip(*loader, strict=True)
    return torch.cat(xs), torch.cat(ys)


def test_sizes_features_and_task_match_flamby(heart: FedHeartDisease) -> None:
    assert heart.client_ids == ["cleveland", "hungarian", "switzerland", "va"]
    assert heart.task == "binary" and heart.num_classes == 1
    for center, (train, test) in SIZES.items():
        assert (heart.num_examples(center, "train"), heart.num_examples(center, "test")) == (train, test)
        assert heart.num_examples(center, "val") == 0 and heart.val_dataloader(center) is None
    x, y = next(iter(heart.train_dataloader("va", torch.Generator().manual_seed(0))))
    assert x.shape == (4, 13) and x.dtype == torch.float32
    assert y.shape == (4,) and y.dtype == torch.float32


def test_tensors_equal_an_independent_flamby_reimplementation(heart: FedHeartDisease, root: Path) -> None:
    reference = _flamby_reference(root)
    for center in CENTERS:
        for split in ("train", "test"):
            indices = heart.data.splits[center][split]
            x, y = heart.data.inputs[indices], heart.data.targets[indices]
            ref_x, ref_y = reference[center][split]
            assert torch.allclose(x, ref_x, atol=1e-5), (center, split)
            assert torch.equal(y, ref_y), (center, split)
        x, y = _all(heart.test_dataloader(center))
        assert torch.allclose(x, reference[center]["test"][0], atol=1e-5) and torch.equal(
            y, reference[center]["test"][1]
        )


def test_each_center_is_standardized_on_its_train_rows(heart: FedHeartDisease) -> None:
    for center in CENTERS:
        x, y = _all(heart.train_dataloader(center, torch.Generator().manual_seed(0)))
        std = x.std(dim=0)
        varying = std > 1e-6
        assert torch.allclose(x.mean(dim=0), torch.zeros(13), atol=1e-5)
        assert torch.allclose(std[varying], torch.ones(int(varying.sum())), atol=1e-4)
        assert set(y.tolist()) <= {0.0, 1.0}
    # Switzerland's cholesterol is recorded as 0 for every patient: std 0, standardized to 0.
    chol = list(heart.manifest()["details"]["feature_names"]).index("chol")
    assert torch.all(_all(heart.test_dataloader("switzerland"))[0][:, chol] == 0)


def test_class_counts_and_manifest(heart: FedHeartDisease) -> None:
    counts = heart.class_counts()
    assert counts["switzerland"] == {"train": [0, 30], "val": [0, 0], "test": [1, 15]}
    assert counts["cleveland"]["train"] == [108, 91]
    manifest = json.loads(json.dumps(heart.manifest()))
    assert manifest["dataset"] == "fed_heart_disease" and manifest["partitioner"] == "Natural()"
    assert manifest["details"]["pool"]["va"] == [303 + 261 + 46, 740]
    assert len(manifest["details"]["rows"]["hungarian"]) == 261
    everything = sorted(i for client in manifest["clients"].values() for ids in client.values() for i in ids)
    assert everything == list(range(740))


def test_unnormalized_features_are_the_raw_values(root: Path) -> None:
    raw = FedHeartDisease(root=root, normalize=False)
    x, _ = _all(raw.test_dataloader("cleveland"))
    ages = x[:, 0]
    assert 29 <= ages.min() and ages.max() <= 77
    assert set(x[:, 8:].unique().tolist()) == {0.0, 1.0}  # one-hot columns


def test_val_fraction_carves_a_stratified_val_split_from_train(heart: FedHeartDisease, root: Path) -> None:
    data = FedHeartDisease(root=root, val_fraction=0.2, seed=3)
    for center, (train, _) in SIZES.items():
        val = data.num_examples(center, "val")
        assert data.num_examples(center, "train") + val == train
        assert abs(val - 0.2 * train) <= 1
        assert np.array_equal(data.data.splits[center]["test"], heart.data.splits[center]["test"])
    counts = data.class_counts()["cleveland"]
    assert abs(counts["val"][1] - 0.2 * 91) <= 1
    other = FedHeartDisease(root=root, val_fraction=0.2, seed=4)
    assert not np.array_equal(other.data.splits["va"]["val"], data.data.splits["va"]["val"])


def test_missing_folder_or_file_is_explained(tmp_path: Path) -> None:
    with pytest.raises(
        FileNotFoundError, match=r"data\.init_args\.root: no folder .*archive\.ics\.uci\.edu/dataset/45"
    ):
        FedHeartDisease(root=tmp_path / "nowhere")
    for name in FILES[:3]:
        (tmp_path / name).write_text("")
    with pytest.raises(FileNotFoundError, match=r"lacks \['processed\.va\.data'\]"):
        FedHeartDisease(root=tmp_path).setup()


@pytest.mark.parametrize("val_fraction", [0.0, 0.2])
def test_one_hospital_alone_builds_its_client_as_among_all_four(root: Path, tmp_path: Path, val_fraction) -> None:
    """A node of Hungary holds processed.hungarian.data only: its client equals, tensor for tensor, Hungary's client
    built from all four files (encoding, split, validation hold-out and standardization)."""
    shutil.copy(root / "processed.hungarian.data", tmp_path)
    alone = FedHeartDisease(root=tmp_path, val_fraction=val_fraction, seed=1)
    alone.only_site("hungarian")
    alone.setup()
    full = FedHeartDisease(root=root, val_fraction=val_fraction, seed=1)
    assert alone.client_ids == ["hungarian"]
    for split in ("train", "val", "test"):
        assert alone.num_examples("hungarian", split) == full.num_examples("hungarian", split)
        if not alone.num_examples("hungarian", split):
            continue
        loader = {
            "train": lambda d: d.train_dataloader("hungarian", torch.Generator().manual_seed(0)),
            "val": lambda d: d.val_dataloader("hungarian"),
            "test": lambda d: d.test_dataloader("hungarian"),
        }[split]
        (xa, ya), (xf, yf) = _all(loader(alone)), _all(loader(full))
        assert torch.equal(xa, xf) and torch.equal(ya, yf), split
    assert alone.data.details["rows"]["hungarian"] == full.data.details["rows"]["hungarian"]
    assert alone.class_counts()["hungarian"] == full.class_counts()["hungarian"]


def test_a_node_of_a_center_outside_sites_is_refused(root: Path) -> None:
    data = FedHeartDisease(root=root, sites=["cleveland", "va"])
    assert data.expected_num_clients() == 2 and FedHeartDisease.clients_in_options({"sites": None}) == 4
    data.only_site("hungarian")
    with pytest.raises(DataError, match=r"client-id='hungarian' is not a site of FedHeartDisease .*'cleveland', 'va'"):
        data.setup()


def test_a_category_outside_its_documented_values_is_refused(root: Path, tmp_path: Path) -> None:
    lines = (root / "processed.switzerland.data").read_text().splitlines()
    fields = lines[4].split(",")
    fields[2] = "5"  # chest pain type is 1-4
    lines[4] = ",".join(fields)
    (tmp_path / "processed.switzerland.data").write_text("\n".join(lines) + "\n")
    data = FedHeartDisease(root=tmp_path, sites=["switzerland"])
    with pytest.raises(DataError, match=r"line 5, column 'cp': '5' is not one of its documented values \[1, 2, 3, 4\]"):
        data.setup()


@pytest.mark.parametrize("fraction", [-0.1, 1.0])
def test_bad_val_fraction(root: Path, fraction: float) -> None:
    with pytest.raises(ValueError, match=rf"data\.init_args\.val_fraction must be in \[0, 1\), got {fraction}"):
        FedHeartDisease(root=root, val_fraction=fraction)
