"""Reading a mammogram DICOM: the window / VOI LUT function, MONOCHROME1 inverted, scaling, resizing, and the
errors naming the file (values worked out by hand from DICOM PS3.3 C.11.2.1.2)."""

import sys

import numpy as np
import pytest

from fedlit.core.errors import ConfigError, DataError
from fedlit.data.mammography import MammogramFile, dicom_pixels
from tests.data.mammography.layouts import write_dicom

RAMP = np.tile(np.array([0, 1000, 2000, 3000, 4000], dtype=np.uint16), (4, 1))


def test_without_a_window_the_values_are_scaled_by_their_own_range(tmp_path):
    path = write_dicom(tmp_path / "a.dcm", RAMP)
    np.testing.assert_allclose(dicom_pixels(path)[0], [0.0, 0.25, 0.5, 0.75, 1.0])


def test_a_linear_window_clips_outside_it(tmp_path):
    # c = 2000, w = 2000: x <= 1000 -> bottom, x > 2999 -> top, 2000 -> (0.5 / 1999 + 0.5) of the range
    path = write_dicom(tmp_path / "a.dcm", RAMP, window=(2000, 2000))
    np.testing.assert_allclose(dicom_pixels(path)[0], [0.0, 0.0, 0.5 / 1999 + 0.5, 1.0, 1.0], atol=1e-6)
    np.testing.assert_allclose(dicom_pixels(path, window=False)[0], [0.0, 0.25, 0.5, 0.75, 1.0])


def test_a_sigmoid_voi_lut_function_is_applied(tmp_path):
    # y = 1 / (1 + exp(-4 (x - c) / w)), then min-max: at 1000, (0.119203 - 0.017986) / 0.964028 = 0.104994
    path = write_dicom(tmp_path / "a.dcm", RAMP, window=(2000, 2000), voi_function="SIGMOID")
    np.testing.assert_allclose(dicom_pixels(path)[0], [0.0, 0.104994, 0.5, 0.895006, 1.0], atol=1e-5)


def test_monochrome1_is_inverted_so_that_dense_tissue_is_bright(tmp_path):
    path = write_dicom(tmp_path / "a.dcm", RAMP, photometric="MONOCHROME1")
    np.testing.assert_allclose(dicom_pixels(path)[0], [1.0, 0.75, 0.5, 0.25, 0.0])


def test_the_reader_resizes_and_repeats_the_grey_channel(tmp_path):
    write_dicom(tmp_path / "src" / "a.dcm", np.full((32, 24), 7, dtype=np.uint16) + np.eye(32, 24, dtype=np.uint16))
    x = MammogramFile({"src": str(tmp_path / "src")}, channels=3, image_size=16)("src/a.dcm")
    assert x.shape == (3, 16, 16) and x.dtype.is_floating_point
    assert float(x.min()) >= 0.0 and float(x.max()) <= 1.0 and float(x.max()) > 0.0
    assert bool((x[0] == x[2]).all())


def test_a_file_that_is_not_dicom_is_refused_naming_it(tmp_path):
    path = tmp_path / "fake.dcm"
    path.write_bytes(b"not a dicom file at all")
    with pytest.raises(DataError, match=r"fake\.dcm: cannot be read as a DICOM file"):
        dicom_pixels(path)
    with pytest.raises(DataError, match=r"nothere\.dcm: DICOM file not found"):
        dicom_pixels(tmp_path / "nothere.dcm")


def test_without_pydicom_the_error_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "pydicom", None)
    with pytest.raises(ConfigError, match=r"fedlit\[imaging\]"):
        dicom_pixels("x.dcm")
