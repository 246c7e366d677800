"""Federated data: the ``FederatedDataModule`` API (tensor pool or file-backed samples), partitioners, one module
per data set (the segmentation sites ``FedProstateSlices``, ``FedProstateVolumes``, ``FedFundus`` and
``FedPolyp`` among them; ``PTBXL``'s ECGs read as WFDB records), and the generic loaders ``SiteFolders``,
``SiteTable`` and ``SiteDataset``."""

from fedlit.data.cinc2021 import CinC2021
from fedlit.data.common.datamodule import FederatedDataModule, SplitName
from fedlit.data.common.partition import (
    IID,
    Dirichlet,
    Natural,
    Partitioner,
    Pathological,
    Shards,
    dirichlet_partition,
    iid_partition,
    natural_partition,
    pathological_partition,
    shards_partition,
)
from fedlit.data.common.pool import CLASSIFICATION_TASKS, PartitionedData, PoolSubset, TaskType
from fedlit.data.common.samples import ImageFile, SampleList, SampleSubset, split_samples
from fedlit.data.common.segmentation_pairs import MaskedImageFile, PairFlip, PairRandomCrop
from fedlit.data.common.splits import SPLITS, check_split_fractions, split_clients, split_sizes, stratified_split
from fedlit.data.folders import SiteFolders
from fedlit.data.heart_disease import FedHeartDisease
from fedlit.data.medical_abstracts import MedicalAbstracts
from fedlit.data.medmnist import MedMNIST, MedMNISTTransform
from fedlit.data.polyp import FedPolyp
from fedlit.data.prostate import FedProstate
from fedlit.data.prostate_volumes import FedProstateVolumes
from fedlit.data.ptbxl import PTBXL
from fedlit.data.pubmed_rct import PubMedRCT
from fedlit.data.respiratory import ICBHI, SPRSound
from fedlit.data.segmentation_sites import FedFundus, FedProstateSlices
from fedlit.data.site_dataset import SiteDataset
from fedlit.data.survival import SyntheticSurvival
from fedlit.data.synthetic import SyntheticImages
from fedlit.data.synthetic_segmentation import SyntheticSegmentation
from fedlit.data.synthetic_signals import SyntheticSignals
from fedlit.data.table import SiteTable
from fedlit.data.wfdb_files import WFDBRecord, read_wfdb

__all__ = [
    "CLASSIFICATION_TASKS",
    "CinC2021",
    "IID",
    "ImageFile",
    "SPLITS",
    "Dirichlet",
    "FedFundus",
    "FedHeartDisease",
    "FedPolyp",
    "FedProstate",
    "FedProstateSlices",
    "FedProstateVolumes",
    "FederatedDataModule",
    "MaskedImageFile",
    "MedMNIST",
    "MedicalAbstracts",
    "MedMNISTTransform",
    "Natural",
    "PTBXL",
    "PubMedRCT",
    "PartitionedData",
    "Partitioner",
    "PairFlip",
    "PairRandomCrop",
    "Pathological",
    "PoolSubset",
    "SampleList",
    "SampleSubset",
    "Shards",
    "SiteDataset",
    "SiteFolders",
    "SiteTable",
    "SplitName",
    "SyntheticImages",
    "SyntheticSegmentation",
    "SyntheticSignals",
    "SyntheticSurvival",
    "TaskType",
    "WFDBRecord",
    "check_split_fractions",
    "dirichlet_partition",
    "iid_partition",
    "natural_partition",
    "pathological_partition",
    "read_wfdb",
    "shards_partition",
    "split_clients",
    "split_samples",
    "split_sizes",
    "stratified_split",
    "ICBHI",
    "SPRSound",
]
from fedlit.data.adftd import ADFTD  # noqa: E402

__all__ += ["ADFTD"]
from fedlit.data.eicu import EICU  # noqa: E402

__all__ += ["EICU"]
from fedlit.data.skin_sources import SkinSources  # noqa: E402

__all__ += ["SkinSources"]
from fedlit.data.mammography import Mammograms  # noqa: E402

__all__ += ["Mammograms"]
