"""Mammography: the RSNA screening, CBIS-DDSM and CMMD DICOM trees read as federated sites (``Mammograms``), each
image windowed by its VOI LUT, ``MONOCHROME1`` inverted, scaled to [0, 1] and resized; patient-level splits; and
generated images that join a site's training split only. Needs pydicom (``pip install 'fedlit[imaging]'``).
docs/breast_case_study.md gives the breast-cancer case study these serve."""

from fedlit.data.mammography.cbis_ddsm import cbis_ddsm_records
from fedlit.data.mammography.cmmd import cmmd_records
from fedlit.data.mammography.dicom import MammogramFile, dicom_pixels
from fedlit.data.mammography.records import CLASS_NAMES, Mammogram
from fedlit.data.mammography.rsna import rsna_records
from fedlit.data.mammography.sites import Mammograms

__all__ = [
    "CLASS_NAMES",
    "Mammogram",
    "MammogramFile",
    "Mammograms",
    "cbis_ddsm_records",
    "cmmd_records",
    "dicom_pixels",
    "rsna_records",
]
