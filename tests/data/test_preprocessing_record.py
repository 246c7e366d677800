"""``preprocessing(client_id)`` of the image data sets says what their loaders do, so plain PyTorch can redo it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from fedlit.data import MedMNIST, SiteFolders


def _first_test_input(data) -> torch.Tensor:
    client = data.client_ids[0]
    return next(iter(data.test_dataloader(client)))[0][0]


def test_site_folders_record_redoes_the_loader(tmp_path: Path) -> None:
    for site in ("a", "b"):
        for label in ("x", "y"):
            for i in range(4):
                (tmp_path / site / label).mkdir(parents=True, exist_ok=True)
                Image.new("L", (6, 6), 102).save(tmp_path / site / label / f"{i}.png")
    data = SiteFolders(
        root=str(tmp_path),
        image_size=4,
        channels=1,
        mean=[0.2],
        std=[0.5],
        split_fractions=(0.5, 0.0, 0.5),
        batch_size=2,
    )
    data.setup()
    record = data.preprocessing("a")["normalization"]
    assert record == {
        "kind": "image",
        "channels": 1,
        "size": 4,
        "scale": "8-bit / 255, 16-bit / 65535",
        "mean": [0.2],
        "std": [0.5],
        "eval_transform": None,
    }
    # a uniform 8-bit grey 102 stays 102 when resized: (102 / 255 - 0.2) / 0.5 = (0.4 - 0.2) / 0.5 = 0.4
    assert torch.allclose(_first_test_input(data), torch.full((1, 4, 4), 0.4), atol=1e-6)


@pytest.mark.parametrize(("normalize", "expected"), [(True, -0.6), (False, 0.2)])
def test_medmnist_record_redoes_the_loader(tmp_path: Path, normalize: bool, expected: float) -> None:
    arrays = {}
    for split, n in (("train", 40), ("val", 12), ("test", 12)):
        arrays[f"{split}_images"] = np.full((n, 28, 28), 51, dtype=np.uint8)
        arrays[f"{split}_labels"] = (np.arange(n) % 2).reshape(-1, 1).astype(np.uint8)
    np.savez(tmp_path / "pneumoniamnist.npz", **arrays)
    data = MedMNIST(path=tmp_path / "pneumoniamnist.npz", num_clients=2, channels=3, normalize=normalize)
    data.setup()
    record = data.preprocessing(data.client_ids[0])["normalization"]
    half = [0.5, 0.5, 0.5] if normalize else None
    assert record == {"kind": "image", "channels": 3, "size": None, "scale": "uint8 / 255", "mean": half, "std": half}
    # 51 / 255 = 0.2; normalized: (0.2 - 0.5) / 0.5 = -0.6; grey repeated to 3 channels
    assert torch.allclose(_first_test_input(data), torch.full((3, 28, 28), expected), atol=1e-6)
