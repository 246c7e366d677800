"""The images' channels against the model's input channels: refused when the run is set up, naming both options
and the fix, not inside the first convolution of the first training step."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from fedlit import FedAvg, Federation
from fedlit.core.errors import ConfigError
from fedlit.data import SiteFolders, SyntheticImages
from fedlit.engine.loop.channels import model_in_channels
from fedlit.models import SmallCNN
from fedlit.tasks import ClassificationModule


def _federation(tmp_path: Path, data, in_channels: int, config: dict | None = None) -> Federation:
    torch.manual_seed(0)
    module = ClassificationModule(backbone=SmallCNN(in_channels=in_channels, width=4, depth=1), num_classes=2)
    return Federation(
        module, data, FedAvg(), rounds=1, out_dir=tmp_path / "run", progress_bar=False, accelerator="cpu", config=config
    )


def _grey_sites(root: Path) -> Path:
    rng = np.random.default_rng(0)
    for site in ("north", "south"):
        for label in ("a", "b"):
            folder = root / site / label
            folder.mkdir(parents=True)
            for i in range(3):
                Image.fromarray(rng.integers(0, 255, (8, 8), dtype=np.uint8), mode="L").save(folder / f"{i}.png")
    return root


def test_grey_folders_and_an_rgb_model_are_refused_naming_both_options_and_the_fix(tmp_path: Path) -> None:
    config = {
        "model": {
            "class_path": "fedlit.tasks.ClassificationModule",
            "init_args": {"backbone": {"class_path": "fedlit.models.SmallCNN", "init_args": {"in_channels": 3}}},
        }
    }
    data = SiteFolders(
        root=str(_grey_sites(tmp_path / "sites")),
        image_size=8,
        channels=1,
        split_fractions=(0.5, 0.0, 0.5),
        batch_size=2,
    )
    with pytest.raises(ConfigError) as err:
        _federation(tmp_path, data, 3, config).fit()
    assert (
        "the data gives 1-channel images (SiteFolders, data.init_args.channels) but the model expects 3 input "
        "channels (model.init_args.backbone.init_args.in_channels); set data.init_args.channels: 3 (grey is "
        "repeated to RGB, RGB made grey) or model.init_args.backbone.init_args.in_channels: 1"
    ) in str(err.value)
    assert not (tmp_path / "run" / "metrics.csv").exists()  # refused at setup, before any round
    rgb = SiteFolders(
        root=str(tmp_path / "sites"), image_size=8, channels=3, split_fractions=(0.5, 0.0, 0.5), batch_size=2
    )
    assert _federation(tmp_path / "rgb", rgb, 3).fit()["last"]["round"] == 1  # the fix the message gives works


def test_a_model_for_grey_images_refuses_rgb_ones_without_a_recipe(tmp_path: Path) -> None:
    data = SyntheticImages(num_clients=2, samples_per_client=10, num_classes=2, image_size=8)
    with pytest.raises(
        ConfigError,
        match=r"the data gives 1-channel images \(SyntheticImages\) but the model "
        r"expects 3 input channels \(the model's in_channels\); set the model's "
        r"in_channels: 1",
    ):
        _federation(tmp_path, data, 3).fit()


def test_the_models_input_channels_come_from_its_first_convolution_or_a_declared_in_channels() -> None:
    assert model_in_channels(torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.Conv2d(4, 1, 3))) == (3, 3)
    assert model_in_channels(torch.nn.Sequential(torch.nn.Conv3d(2, 4, 3))) == (2, 4)
    assert model_in_channels(torch.nn.Sequential(torch.nn.Linear(3, 4))) is None
    assert model_in_channels(torch.nn.Sequential(torch.nn.LazyConv2d(4, 3))) is None

    class Repeats(torch.nn.Module):  # takes grey images and repeats them to RGB for its convolution
        def __init__(self) -> None:
            super().__init__()
            self.in_channels, self.conv = 1, torch.nn.Conv2d(3, 4, 3)

    assert model_in_channels(torch.nn.Sequential(Repeats())) == (1, 3)
