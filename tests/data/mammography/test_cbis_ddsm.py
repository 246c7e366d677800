"""The CBIS-DDSM layout: its CSVs and the case folders as the NBIA Data Retriever writes them."""

import csv
import shutil

import pytest

from fedlit.core.errors import DataError, InputFileError
from fedlit.data.mammography import Mammograms, cbis_ddsm_records
from tests.data.mammography.layouts import image, make_cbis_ddsm, write_dicom


@pytest.fixture(scope="module")
def cbis(tmp_path_factory):
    return make_cbis_ddsm(tmp_path_factory.mktemp("cbis"))


def test_full_mammograms_are_found_in_their_case_folders_and_labelled_by_pathology(cbis):
    records = cbis_ddsm_records(cbis)
    # 8 patients x 2 views; the ROI masks' "_1" case folders are not read; odd patients are MALIGNANT
    assert len(records) == 16 and all("full mammogram images" in r.identity for r in records)
    assert sorted(r.patient for r in records if r.label == 1) == sorted(
        2 * ["P_00002", "P_00004", "P_00006", "P_00008"]
    )
    assert {r.client for r in records} == {"cbis_ddsm"}


def test_a_path_as_written_in_the_csv_is_read_as_it_is(tmp_path):
    root = tmp_path / "c"
    root.mkdir()
    write_dicom(root / "Mass-Training_P_00001_LEFT_CC" / "s" / "r" / "000000.dcm", image(1, 0))
    with (root / "mass_case_description_train_set.csv").open("w", newline="") as f:
        csv.writer(f).writerows(
            [["patient_id", "pathology", "image file path"],
             ["P_00001", "MALIGNANT", "Mass-Training_P_00001_LEFT_CC/s/r/000000.dcm"],
             ["P_00001", "BENIGN", "Mass-Training_P_00001_LEFT_CC/s/r/000000.dcm"]]  # two findings: one image
        )  # fmt: skip
    (record,) = cbis_ddsm_records(root)
    assert (record.identity, record.label) == ("cbis_ddsm/Mass-Training_P_00001_LEFT_CC/s/r/000000.dcm", 1)


def test_a_missing_case_folder_is_refused_naming_the_csv_and_the_file(cbis, tmp_path):
    root = tmp_path / "c"
    shutil.copytree(cbis, root)
    shutil.rmtree(root / "Mass-Test_P_00008_LEFT_MLO")
    with pytest.raises(DataError, match=r"test_set\.csv: 1 images .*c/Mass-Test_P_00008_LEFT_MLO/"):
        cbis_ddsm_records(root)


def test_an_unknown_pathology_names_the_line(cbis, tmp_path):
    root = tmp_path / "c"
    shutil.copytree(cbis, root)
    table = root / "mass_case_description_train_set.csv"
    table.write_text(table.read_text().replace("BENIGN_WITHOUT_CALLBACK", "UNSURE", 1))
    with pytest.raises(DataError, match=r"train_set\.csv: line 6: pathology 'UNSURE'"):
        cbis_ddsm_records(root)


def test_no_table_names_the_four_and_the_archive_page(tmp_path):
    with pytest.raises(InputFileError, match=r"mass_case_description_train_set\.csv.*cancerimagingarchive\.net"):
        Mammograms(cbis_ddsm_root=tmp_path).setup()
