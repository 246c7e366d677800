"""The RSNA screening layout: read into clients by any train.csv column; wrong layouts refused naming the file."""

import shutil

import numpy as np
import pytest

from fedlit.core.errors import ConfigError, DataError, InputFileError
from fedlit.data.mammography import Mammograms, rsna_records
from tests.data.mammography.layouts import make_rsna


@pytest.fixture(scope="module")
def rsna(tmp_path_factory):
    return make_rsna(tmp_path_factory.mktemp("rsna"))


def test_setting_1_has_the_four_machines_as_clients_split_by_patient(rsna):
    data = Mammograms(rsna_root=rsna, rsna_sites=[49, 48, 29, 21], image_size=16)
    assert data.client_ids == ["machine_id_49", "machine_id_48", "machine_id_29", "machine_id_21"]
    manifest = data.manifest()
    for splits in manifest["clients"].values():
        # 8 patients of 2 images: 85/15 by largest remainder is 7 and 1 patients; test = val (fraction 0)
        assert (len(splits["train"]), len(splits["val"])) == (14, 2)
        assert splits["test"] == splits["val"]
        patients = {s: {p.split("/")[2] for p in splits[s]} for s in ("train", "val")}
        assert len(patients["train"]) == 7 and not patients["train"] & patients["val"]
    counts = data.class_counts()["machine_id_49"]
    assert np.add(counts["train"], counts["val"]).tolist() == [8, 8]
    assert manifest["class_names"] == ["normal", "cancer"] and manifest["details"]["test"].startswith("the valid")


def test_any_column_forms_the_clients(rsna):
    records = rsna_records(rsna, "view", None)
    assert sorted({r.client for r in records}) == ["view_CC", "view_MLO"]
    assert sum(r.client == "view_CC" for r in records) == 32


def test_a_missing_table_names_the_file_and_the_download_page(tmp_path):
    (tmp_path / "train_images").mkdir()
    with pytest.raises(InputFileError, match=r"no file .*train\.csv.*kaggle\.com/competitions/rsna-breast"):
        rsna_records(tmp_path, "machine_id", None)


def test_images_outside_the_patient_folders_are_refused_naming_the_table_and_a_file(rsna, tmp_path):
    flat = tmp_path / "flat"
    shutil.copytree(rsna, flat)
    for path in (flat / "train_images").rglob("*.dcm"):
        path.rename(flat / "train_images" / path.name)
    with pytest.raises(DataError, match=r"train\.csv: 64 images it lists do not exist: .*train_images/10000/1001\.dcm"):
        rsna_records(flat, "machine_id", None)


def test_an_unknown_column_or_site_is_named(rsna):
    with pytest.raises(ConfigError, match=r"rsna_site_column='scanner' is not a column"):
        rsna_records(rsna, "scanner", None)
    with pytest.raises(ConfigError, match=r"rsna_sites: \['93'\] are not values of column 'machine_id'"):
        rsna_records(rsna, "machine_id", ["93"])
