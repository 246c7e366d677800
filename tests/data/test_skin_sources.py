"""``SkinSources``: the FedPxN paper's five skin cancer sources, read from tiny copies of each publisher's layout
and of FLamby's Fed-ISIC2019, classes mapped to ISIC 2019's 8, left-out rows counted, wrong layouts named."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch

from fedlit.core.errors import ConfigError, DataError, InputFileError
from fedlit.data import SkinSources
from fedlit.data.common.samples import ImageFile
from tests.data.skin_layouts import (
    EXPECTED,
    left_out,
    write_derm7pt,
    write_flamby,
    write_ham,
    write_pad,
    write_sources,
)

SITES = ["barcelona", "rosendahl", "vienna", "pad_ufes_20", "derm7pt"]


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    return write_sources(tmp_path_factory.mktemp("skin"))


def totals(data: SkinSources) -> dict[str, list[int]]:
    return {site: np.sum(list(splits.values()), axis=0).tolist() for site, splits in data.class_counts().items()}


def test_reads_every_publishers_layout_with_the_classes_mapped_and_left_out_rows_counted(sources):
    data = SkinSources(root=sources, image_size=16)
    assert data.client_ids == SITES and data.num_classes == 8 and data.task == "multiclass"
    assert totals(data) == EXPECTED
    manifest = data.manifest()
    assert manifest["class_names"] == ["MEL", "NV", "BCC", "AK", "BKL", "DF", "VASC", "SCC"]
    assert manifest["details"]["layout"] == "sources"
    assert manifest["details"]["left_out"] == left_out()
    # where each site's images come from: the publishers' folders
    files = {site: manifest["clients"][site]["train"][0].split("/")[0] for site in SITES}
    assert files == {
        "barcelona": "ISIC_2019",
        "rosendahl": "HAM10000",
        "vienna": "HAM10000",
        "pad_ufes_20": "PAD-UFES-20",
        "derm7pt": "Derm7pt",
    }
    x, y = next(iter(data.test_dataloader("pad_ufes_20")))
    assert x.shape == (1, 3, 16, 16) and x.dtype == torch.float32 and y.dtype == torch.int64


def test_flamby_layout_gives_the_three_isic_sites_and_leaves_msk_out(tmp_path):
    write_flamby(tmp_path)
    write_pad(tmp_path)
    write_derm7pt(tmp_path)
    data = SkinSources(root=tmp_path, image_size=8)  # auto: no ISIC_2019/ or HAM10000/ CSV, so FLamby's
    assert totals(data) == EXPECTED
    details = data.manifest()["details"]
    assert details["layout"] == "flamby"
    assert details["left_out"]["fed_isic2019/train_test_split"] == {"center '4' (MSK, no site)": 2}
    assert data.manifest()["clients"]["vienna"]["test"][0].startswith("fed_isic2019/ISIC_2019_Training_Input_")


def test_splits_are_7_to_1_5_to_1_5_stratified_seeded_and_per_site(sources):
    data = SkinSources(root=sources, image_size=8, seed=3)
    for site in SITES:  # 10 images: 7, then the two remainders of 1.5 (largest remainder: val first), 2 and 1
        assert [data.num_examples(site, s) for s in ("train", "val", "test")] == [7, 2, 1]
    # Barcelona's MEL 4, NV 3, BCC 3 in train: 2.8, 2.1, 2.1 expected, each within one image
    train = data.class_counts()["barcelona"]["train"][:3]
    assert sum(train) == 7 and all(abs(n - 0.7 * total) < 1 for n, total in zip(train, [4, 3, 3], strict=True))
    again = SkinSources(root=sources, image_size=8, seed=3)
    other = SkinSources(root=sources, image_size=8, seed=4)
    alone = SkinSources(root=sources, image_size=8, seed=3, sites=["derm7pt"])
    manifest = data.manifest()["clients"]
    assert again.manifest()["clients"] == manifest
    assert other.manifest()["clients"] != manifest
    assert alone.manifest()["clients"]["derm7pt"] == manifest["derm7pt"]


def test_a_node_reads_its_own_source_folder_only(tmp_path):
    write_derm7pt(tmp_path)
    data = SkinSources(root=tmp_path, image_size=8)  # every site listed, but only Derm7pt's folder is there
    data.only_site("derm7pt")
    assert data.client_ids == ["derm7pt"] and totals(data) == {"derm7pt": EXPECTED["derm7pt"]}
    # a Flower server, which holds no data, counts the nodes to wait for from the options alone
    assert SkinSources.clients_in_options({}) == 5 and SkinSources.clients_in_options({"sites": ["derm7pt"]}) == 1


def test_train_images_are_augmented_and_normalized_eval_images_only_normalized(sources):
    data = SkinSources(root=sources, image_size=8, mean=[0.5, 0.5, 0.5], std=[0.25, 0.25, 0.25])
    identity = data.manifest()["clients"]["rosendahl"]["test"][0]
    raw = ImageFile(root=str(sources), channels=3, image_size=8)(identity)
    x, _ = next(iter(data.test_dataloader("rosendahl")))
    assert torch.allclose(x[0], (raw - 0.5) / 0.25)
    assert [type(t).__name__ for t in data.data.train_transform.transforms] == [
        "RandomHorizontalFlip",
        "RandomVerticalFlip",
        "RandomRotation",
        "ColorJitter",
        "Normalize",
    ]
    assert SkinSources(root=sources, augment=False).data.train_transform is None


def test_without_the_root_one_error_names_the_layout_and_the_download_pages(tmp_path):
    with pytest.raises(InputFileError) as err:
        SkinSources(root=tmp_path / "absent", sites=["pad_ufes_20", "derm7pt"])
    assert str(err.value) == (
        f"data.init_args.root: no folder {tmp_path / 'absent'}. It must hold PAD-UFES-20/ (metadata.csv, images/; "
        "https://data.mendeley.com/datasets/zr7vgbcyr2/1); Derm7pt/ (the release_v0 folder: meta/meta.csv, images/; "
        "https://derm.cs.sfu.ca/); put each source's folder there as its publisher ships it"
    )


def test_a_missing_file_is_named_with_its_download_page(tmp_path):
    write_pad(tmp_path)
    with pytest.raises(InputFileError, match="derm7pt|Derm7pt") as err:
        SkinSources(root=tmp_path, sites=["pad_ufes_20", "derm7pt"]).setup()
    assert str(err.value) == (
        f"{tmp_path / 'Derm7pt' / 'meta' / 'meta.csv'}: no such file (Derm7pt's meta.csv); download it from "
        "https://derm.cs.sfu.ca/"
    )
    with pytest.raises(InputFileError) as err:  # neither ISIC 2019 nor FLamby's Fed-ISIC2019 for barcelona
        SkinSources(root=tmp_path, sites=["barcelona", "pad_ufes_20"]).setup()
    assert f"neither {tmp_path / 'ISIC_2019' / 'ISIC_2019_Training_GroundTruth.csv'}" in str(err.value)
    assert "https://challenge.isic-archive.com/data/#2019" in str(err.value) and "owkin/FLamby" in str(err.value)


def test_a_wrong_layout_is_refused_naming_the_file_and_the_column(tmp_path):
    write_ham(tmp_path)
    table = tmp_path / "HAM10000" / "HAM10000_metadata.csv"
    lines = table.read_text().splitlines()
    table.write_text("\n".join([lines[0].replace(",dataset", ",source")] + lines[1:]) + "\n")  # an old release
    with pytest.raises(DataError) as err:
        SkinSources(root=tmp_path, sites=["rosendahl"]).setup()
    assert str(err.value).startswith(f"{table}: no column 'dataset' (its columns: ['lesion_id', 'image_id', ")
    assert str(err.value).endswith(
        "it is not HAM10000's metadata: download it again from https://doi.org/10.7910/DVN/DBW86T"
    )


def test_a_listed_image_that_is_absent_is_named(sources, tmp_path):
    root = tmp_path / "copy"
    shutil.copytree(sources / "PAD-UFES-20", root / "PAD-UFES-20")
    shutil.rmtree(root / "PAD-UFES-20" / "images" / "imgs_part_2")  # the odd rows' images
    with pytest.raises(DataError) as err:
        SkinSources(root=root, sites=["pad_ufes_20"]).setup()
    assert str(err.value).startswith(
        f"{root / 'PAD-UFES-20' / 'metadata.csv'}: 5 listed images are not in {root / 'PAD-UFES-20' / 'images'} "
        "(PAT_1_101_201.png, PAT_3_103_203.png, PAT_5_105_205.png, ...)"
    )


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            {"sites": ["vienna", "derm7p"]},
            "'derm7p' is not one of ['barcelona', 'rosendahl', 'vienna', 'pad_ufes_20', "
            "'derm7pt']; did you mean 'derm7pt'?",
        ),
        ({"sites": ["vienna", "vienna"]}, "data.init_args.sites lists a site twice"),
        ({"layout": "flambi"}, "data.init_args.layout must be one of ['auto', 'sources', 'flamby'], got 'flambi'"),
        ({"mean": [0.5, 0.5, 0.5]}, "data.init_args.mean and data.init_args.std go together"),
        ({"image_size": 0}, "data.init_args.image_size must be an integer >= 1, got 0"),
    ],
)
def test_bad_options_are_refused_by_name(options, message, sources):
    with pytest.raises(ConfigError) as err:
        SkinSources(root=sources, **options)
    assert message in str(err.value)
