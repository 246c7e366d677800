"""``SiteFolders``: image folders per site read lazily, seeded splits, manifest of files, transforms, errors, CLI."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torch import nn

from fedlit.cli import run
from fedlit.core.errors import DataError
from fedlit.data import SiteFolders

# site -> class -> number of images; site_c lists its images in a labels.csv instead of class folders.
COUNTS = {
    "site_a": {"benign": 8, "malignant": 4},
    "site_b": {"benign": 6, "malignant": 6},
    "site_c": {"benign": 4, "malignant": 4, "normal": 4},
}


def _png(path: Path, value: int, size: int, mode: str = "L") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    colour = value if mode == "L" else (value, 255 - value, 0)
    Image.new(mode, (size, size), colour).save(path)


@pytest.fixture
def sites(tmp_path: Path) -> Path:
    """3 sites: class folders (grey 20x20, RGB 12x12) and a labels CSV (grey, its images in one folder)."""
    root = tmp_path / "sites"
    for site, classes in COUNTS.items():
        rows = ["file,label"]
        for c, (name, n) in enumerate(classes.items()):
            for i in range(n):
                if site == "site_c":
                    _png(root / site / "images" / f"{name}_{i}.png", 40 * c, 16)
                    rows.append(f"images/{name}_{i}.png,{name}")
                else:
                    _png(
                        root / site / name / f"img_{i}.png",
                        40 * c,
                        20 if site == "site_a" else 12,
                        "L" if site == "site_a" else "RGB",
                    )
        if site == "site_c":
            (root / site / "labels.csv").write_text("\n".join(rows) + "\n")
    return root


def _data(root: Path, **kwargs) -> SiteFolders:
    options = {"image_size": 8, "channels": 1, "split_fractions": (0.5, 0.25, 0.25), "batch_size": 4}
    return SiteFolders(root=root, **{**options, **kwargs})


def test_sites_classes_counts_and_manifest(sites: Path) -> None:
    data = _data(sites)
    assert data.client_ids == ["site_a", "site_b", "site_c"]
    assert data.task == "multiclass" and data.num_classes == 3
    manifest = data.manifest()
    assert manifest["class_names"] == ["benign", "malignant", "normal"] and manifest["storage"] == "files"
    counts = data.class_counts()
    for site, classes in COUNTS.items():
        expected = [classes.get(name, 0) for name in ("benign", "malignant", "normal")]
        assert np.sum([counts[site][s] for s in ("train", "val", "test")], axis=0).tolist() == expected
        files = manifest["clients"][site]
        total = sum(classes.values())
        # 0.5 / 0.25 / 0.25 of 12 samples, exactly
        assert [len(files[s]) for s in ("train", "val", "test")] == [total // 2, total // 4, total // 4]
        listed = sorted(f for s in ("train", "val", "test") for f in files[s])
        on_disk = sorted(p.relative_to(sites).as_posix() for p in (sites / site).rglob("*.png"))
        assert listed == on_disk  # every file once, in exactly one split, as a path relative to root
        assert [data.num_examples(site, s) for s in ("train", "val", "test")] == [len(files[s]) for s in files]
    # stratified: site_b (6 + 6) puts 3 + 3 in train
    assert counts["site_b"]["train"] == [3, 3, 0]
    assert manifest["details"]["layouts"] == {
        "site_a": "class folders",
        "site_b": "class folders",
        "site_c": "labels.csv",
    }


def test_same_seed_same_split_other_seed_other_split(sites: Path) -> None:
    first = _data(sites, seed=3).manifest()["clients"]
    assert _data(sites, seed=3).manifest()["clients"] == first
    assert _data(sites, seed=4).manifest()["clients"] != first


def test_images_are_read_resized_grey_or_rgb_and_labelled(sites: Path) -> None:
    data = _data(sites)
    x, y = next(iter(data.test_dataloader("site_a")))
    assert x.shape == (3, 1, 8, 8) and x.dtype == torch.float32
    # the labels follow the files: class c was drawn with grey value 40 c
    files = data.manifest()["clients"]["site_a"]["test"]
    assert y.tolist() == [0 if "/benign/" in f else 1 for f in files]
    assert torch.allclose(x.mean(dim=(1, 2, 3)), y.float() * 40 / 255, atol=1e-6)
    rgb = _data(sites, channels=3)
    x, _ = next(iter(rgb.test_dataloader("site_b")))
    assert x.shape[1:] == (3, 8, 8)
    # an RGB image (v, 255 - v, 0) keeps its channels
    assert torch.allclose(x[0, 1], 1 - x[0, 0]) and x[0, 2].abs().max() == 0


class AddTen(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + 10


def test_train_transform_applies_to_train_only_and_normalization_after(sites: Path) -> None:
    data = _data(sites, train_transform=[AddTen()], mean=[0.5], std=[0.5])
    x_train, _ = next(iter(data.train_dataloader("site_c", torch.Generator().manual_seed(0))))
    x_test, _ = next(iter(data.test_dataloader("site_c")))
    assert x_train.min() >= (10 - 0.5) / 0.5  # pixels in [0, 1], + 10, then normalized
    assert x_test.min() >= -1 and x_test.max() <= 1
    swapped = _data(sites, eval_transform=AddTen())
    assert next(iter(swapped.val_dataloader("site_a")))[0].min() >= 10
    assert next(iter(swapped.train_dataloader("site_a", torch.Generator())))[0].max() <= 1


def test_class_counts_and_manifest_read_no_image(sites: Path) -> None:
    for path in sites.rglob("*.png"):
        path.write_bytes(b"not a png")  # any read would fail
    data = _data(sites)
    assert sum(sum(v) for c in data.class_counts().values() for v in c.values()) == 36
    assert len(data.manifest()["clients"]) == 3
    bad = sites / data.manifest()["clients"]["site_b"]["test"][0]
    with pytest.raises(DataError, match=re.escape(f"{bad}: cannot be read as an image")):
        next(iter(data.test_dataloader("site_b")))


def test_own_train_and_test_folders_are_kept(tmp_path: Path) -> None:
    root = tmp_path / "own"
    for split, n in (("train", 3), ("test", 2)):
        for name in ("a", "b"):
            for i in range(n):
                _png(root / "s1" / split / name / f"{i}.png", 0, 8)
    for name in ("a", "b"):
        for i in range(2):
            _png(root / "s2" / name / f"{i}.png", 0, 8)
    data = _data(root)
    files = data.manifest()["clients"]["s1"]
    assert sorted(files["train"]) == sorted(f"s1/train/{c}/{i}.png" for c in "ab" for i in range(3))
    assert sorted(files["test"]) == sorted(f"s1/test/{c}/{i}.png" for c in "ab" for i in range(2))
    assert files["val"] == [] and data.val_dataloader("s1") is None
    assert data.manifest()["details"]["layouts"]["s1"] == "own splits: train, test"
    assert [data.num_examples("s2", s) for s in ("train", "val", "test")] == [2, 1, 1]
    (root / "s1" / "test").rename(root / "s1" / "val")
    with pytest.raises(DataError, match=re.escape(f"{root / 's1'} has ['train', 'val'] sub-folders but not both")):
        _data(root).setup()


def test_binary_task_and_site_selection(sites: Path) -> None:
    data = _data(sites, task="binary", sites=["site_b", "site_a"])
    assert data.client_ids == ["site_b", "site_a"] and data.num_classes == 1
    assert data.class_counts()["site_a"]["train"] == [4, 2]
    _, y = next(iter(data.test_dataloader("site_a")))
    assert y.dtype == torch.float32
    with pytest.raises(DataError, match=r"task='binary' needs exactly 2 classes; .* have 3: \['benign', 'malig"):
        _data(sites, task="binary").setup()
    with pytest.raises(ValueError, match=r"data.init_args.sites: \['site_d'\] are not folders .* did you mean"):
        _data(sites, sites=["site_d"]).setup()


def test_bad_folders_are_refused_naming_the_file(sites: Path, tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="data.init_args.root: no folder"):
        _data(tmp_path / "nowhere")
    table = sites / "site_c" / "labels.csv"
    lines = table.read_text().splitlines()
    table.write_text("\n".join([*lines, "images/gone.png,benign", "images/benign_0.png,"]) + "\n")
    with pytest.raises(DataError) as info:
        _data(sites).setup()
    assert f"{table}: line 14: file {sites / 'site_c' / 'images' / 'gone.png'} does not exist" in str(info.value)
    assert "line 15: column 'label' is empty" in str(info.value)
    table.write_text("path,diagnosis\nimages/benign_0.png,benign\n")
    with pytest.raises(DataError, match=r"has no column 'file', 'label' .* data.init_args.file_column, data.in"):
        _data(sites).setup()
    (sites / "site_d").mkdir()
    with pytest.raises(DataError, match=re.escape(f"{sites / 'site_d'} holds no image")):
        _data(sites, sites=["site_d"]).setup()
    with pytest.raises(ValueError, match=r"mean and std need one value per channel \(1\)"):
        _data(sites, mean=[0.5, 0.5, 0.5], std=[0.2, 0.2, 0.2])


def test_a_site_folder_named_like_an_option_is_refused_naming_the_root(sites: Path) -> None:
    (sites / "site_b").rename(sites / "--site_b")
    with pytest.raises(
        DataError,
        match=re.escape(
            f"the site folders of {sites} (data.init_args.root, data.init_args.sites): client ids that are not "
            "safe as file names: '--site_b' starts with '-' (it would read as an option)."
        ),
    ):
        _data(sites).setup()


def test_empty_test_split_names_the_client(tmp_path: Path) -> None:
    root = tmp_path / "tiny"
    _png(root / "s1" / "a" / "0.png", 0, 8)
    _png(root / "s1" / "b" / "0.png", 0, 8)
    with pytest.raises(DataError, match=r"client 's1' has 2 samples, fewer than the 3 non-empty splits"):
        _data(root).setup()


def test_workers_read_the_images_and_augment_reproducibly(sites: Path) -> None:
    from torchvision.transforms import v2

    data = _data(sites, num_workers=1, train_transform=v2.ColorJitter(brightness=0.8))
    x, y = next(iter(data.test_dataloader("site_c")))
    assert x.shape == (3, 1, 8, 8) and len(y) == 3

    def first_batch(seed: int) -> torch.Tensor:
        return next(iter(data.train_dataloader("site_c", torch.Generator().manual_seed(seed))))[0]

    # the worker's random state comes from the loader's generator (which the loop seeds per client and round)
    assert torch.equal(first_batch(1), first_batch(1)) and not torch.equal(first_batch(1), first_batch(2))


RECIPE = """
model:
  class_path: fedlit.tasks.ClassificationModule
  init_args:
    backbone: {class_path: fedlit.models.SmallCNN, init_args: {in_channels: 3, width: 4, depth: 2}}
    num_classes: 3
    roles: [{pattern: "backbone.*", role: shared}]
    lr: 0.05
data:
  class_path: fedlit.data.SiteFolders
  init_args:
    root: ROOT
    channels: 3
    image_size: 8
    split_fractions: [0.5, 0.25, 0.25]
    batch_size: 4
    train_transform:
      - class_path: torchvision.transforms.v2.RandomHorizontalFlip
        init_args: {p: 0.5}
    mean: [0.5, 0.5, 0.5]
    std: [0.5, 0.5, 0.5]
strategy: {class_path: FedAvg}
federation: {rounds: 2, local_epochs: 1, seed: 0, progress_bar: false}
"""


def test_recipe_trains_two_rounds_through_the_cli(sites: Path, tmp_path: Path) -> None:
    recipe = tmp_path / "folders.yaml"
    recipe.write_text(RECIPE.replace("ROOT", str(sites)))
    out = tmp_path / "run"
    results = run(["fit", "--config", str(recipe), "--out_dir", str(out)])
    saved = json.loads((out / "results.json").read_text())
    assert saved["last"]["round"] == 2 and list(saved["last"]["clients"]) == ["site_a", "site_b", "site_c"]
    assert results["last"]["clients"].keys() == saved["last"]["clients"].keys()
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["class_names"] == ["benign", "malignant", "normal"]
    assert len(manifest["clients"]["site_c"]["test"]) == 3
    counts = json.loads((out / "class_counts.json").read_text())
    assert counts["site_a"]["train"] == [4, 2, 0]
    # the file manifest is rebuilt identically, so the run resumes; the test subcommand reads the checkpoint
    resumed = run(
        ["fit", "--config", str(recipe), "--out_dir", str(out), "--federation.rounds", "3", "--ckpt_path", "last"]
    )
    assert resumed["last"]["round"] == 3
    tested = run(["test", "--config", str(recipe), "--out_dir", str(out), "--federation.rounds", "3"])
    assert tested["summary"]["accuracy_mean"] == pytest.approx(resumed["last"]["summary"]["accuracy_mean"])


def _labels_error(sites: Path, content: bytes) -> tuple[Path, str]:
    table = sites / "site_c" / "labels.csv"
    table.write_bytes(content)
    with pytest.raises(DataError) as info:
        _data(sites).setup()
    assert info.value.__cause__ is None
    return table, str(info.value)


def test_labels_csv_parse_errors_name_the_file_and_line(sites: Path) -> None:
    good = "images/benign_0.png,benign\n"
    table, message = _labels_error(sites, f"file,label\n{good}\nimages/benign_1.png,benign,extra\n{good}".encode())
    assert f"{table}: line 4: 3 fields, but the header has 2" in message  # the blank line 3 still counts
    table, message = _labels_error(sites, f'file,label\n{good}images/benign_1.png,"benign\n{good}'.encode())
    assert f"{table}: line 4: not valid CSV (unexpected end of data); close the quoted field" in message
    table, message = _labels_error(sites, f"\npath,label\n{good}".encode())
    assert f"{table}: line 2 (the header) has no column 'file' (its columns: ['path', 'label'])" in message
    table, message = _labels_error(sites, b"")
    assert f"{table} is empty; give it a header line file,label" in message


def test_labels_csv_not_utf8_names_byte_offset_and_line(sites: Path) -> None:
    table, message = _labels_error(sites, b"file,label\nimages/benign_0.png,b\xe9nign\n")
    assert f"{table}: not UTF-8 text: byte 32 (line 2) is 0xe9; save the file as UTF-8" in message
    rows = "".join(f"images/{c}_{i}.png,{c}\n" for c in ("benign", "normal") for i in range(3))
    table.write_bytes(b"\xef\xbb\xbffile,label\n" + rows.encode())
    assert _data(sites).num_examples("site_c", "train") >= 1  # a byte-order mark (Excel's CSV UTF-8) is fine


def test_binary_task_with_a_third_label_names_where_each_class_is_first_seen(sites: Path) -> None:
    with pytest.raises(DataError) as info:
        _data(sites, task="binary").setup()
    assert f"'normal' first at {sites / 'site_c' / 'labels.csv'}, line 10" in str(info.value)
    assert f"'benign' first at {sites / 'site_a' / 'benign'}" in str(info.value)


def test_a_node_holding_only_its_site_builds_it_as_among_all_with_the_recipe_label_map(
    sites: Path, tmp_path: Path
) -> None:
    """site_a has benign and malignant only: with class_names it keeps 'malignant' = 1 of [benign, malignant,
    normal], and a node whose root holds only site_a (the recipe listing all three sites) builds the same files,
    splits and targets as the pooled folders."""
    import shutil

    names = ["benign", "malignant", "normal"]
    alone_root = tmp_path / "node"
    shutil.copytree(sites / "site_a", alone_root / "site_a")
    alone = _data(alone_root, sites=["site_a", "site_b", "site_c"], class_names=names)
    alone.only_site("site_a")
    pooled = _data(sites, class_names=names)
    assert alone.client_ids == ["site_a"] and alone.num_classes == 3 and alone.client_position("site_a") == 0
    assert alone.manifest()["clients"]["site_a"] == pooled.manifest()["clients"]["site_a"]
    assert alone.class_counts()["site_a"] == pooled.class_counts()["site_a"]
    assert alone.manifest()["class_names"] == names
    # without the label map the node numbers its own labels, with a warning
    own = _data(alone_root)
    own.only_site("site_a")
    with pytest.warns(UserWarning, match=r"numbered by the labels this node reads \(\['benign', 'malignant'\]\)"):
        own.setup()


def test_a_label_outside_the_recipe_label_map_is_refused(sites: Path) -> None:
    data = _data(sites, class_names=["benign", "malignant"])
    with pytest.raises(
        DataError,
        match=r"class_names \['benign', 'malignant'\] lacks labels of .*: 'normal' first "
        r"at .*site_c/labels\.csv, line 10",
    ):
        data.setup()
