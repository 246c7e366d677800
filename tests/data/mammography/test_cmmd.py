"""The CMMD layout: its clinical table and one DICOM folder per patient, each image's breast read from its header."""

import shutil

import pytest

from fedlit.core.errors import DataError, InputFileError
from fedlit.data.mammography import cmmd_records
from tests.data.mammography.layouts import image, make_cmmd, write_dicom


@pytest.fixture(scope="module")
def cmmd(tmp_path_factory):
    return make_cmmd(tmp_path_factory.mktemp("cmmd"))


def test_images_are_labelled_by_their_patient_and_breast(cmmd):
    with pytest.warns(UserWarning, match="8 images of a breast without a line"):
        records = cmmd_records(cmmd)
    assert len(records) == 16 and all(r.identity.endswith(("1-1.dcm", "1-2.dcm")) for r in records)
    assert sorted({r.patient for r in records if r.label == 1}) == ["D1-0002", "D1-0004", "D1-0006", "D1-0008"]


def test_the_xlsx_name_falls_back_to_its_csv_export_and_a_missing_table_names_both(cmmd, tmp_path):
    assert len(cmmd_records(cmmd, "CMMD_clinicaldata_revision.xlsx")) == 16
    with pytest.raises(InputFileError, match=r"no file .*clinical\.csv.*cancerimagingarchive\.net/collection/cmmd"):
        cmmd_records(cmmd, "clinical.csv")


def test_an_image_without_laterality_is_refused_naming_it(cmmd, tmp_path):
    root = tmp_path / "c"
    shutil.copytree(cmmd, root)
    write_dicom(root / "D1-0003" / "s" / "r" / "1-9.dcm", image(0, 1))
    with pytest.raises(DataError, match=r"D1-0003/s/r/1-9\.dcm: no ImageLaterality or Laterality"):
        cmmd_records(root)


def test_a_patient_without_images_is_refused_naming_the_table(cmmd, tmp_path):
    root = tmp_path / "c"
    shutil.copytree(cmmd, root)
    shutil.rmtree(root / "D1-0005")
    with pytest.raises(DataError, match=r"revision\.csv: 1 images it lists do not exist: .*D1-0005"):
        cmmd_records(root)
