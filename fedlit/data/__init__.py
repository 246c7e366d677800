"""Federated data: the ``FederatedDataModule`` API, partitioners and one module per data set."""

from fedlit.data.datamodule import FederatedDataModule, PartitionedData, PoolSubset, SplitName, TaskType
from fedlit.data.heart_disease import FedHeartDisease
from fedlit.data.medical_abstracts import MedicalAbstracts
from fedlit.data.medmnist import MedMNIST, MedMNISTTransform
from fedlit.data.partition import (
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
from fedlit.data.splits import SPLITS, check_split_fractions, split_clients, split_sizes, stratified_split
from fedlit.data.synthetic import SyntheticImages

__all__ = [
    "IID",
    "SPLITS",
    "Dirichlet",
    "FedHeartDisease",
    "FederatedDataModule",
    "MedMNIST",
    "MedicalAbstracts",
    "MedMNISTTransform",
    "Natural",
    "PartitionedData",
    "Partitioner",
    "Pathological",
    "PoolSubset",
    "Shards",
    "SplitName",
    "SyntheticImages",
    "TaskType",
    "check_split_fractions",
    "dirichlet_partition",
    "iid_partition",
    "natural_partition",
    "pathological_partition",
    "shards_partition",
    "split_clients",
    "split_sizes",
    "stratified_split",
]
