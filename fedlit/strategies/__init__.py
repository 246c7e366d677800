"""Federated strategies: one algorithm per file."""

from fedlit.strategies.apfl import APFL
from fedlit.strategies.apple import APPLE
from fedlit.strategies.base import ClientUpdate, Strategy
from fedlit.strategies.common.aggregators import (
    Aggregator,
    KrumAggregator,
    MedianAggregator,
    TrimmedMeanAggregator,
    WeightedMeanAggregator,
)
from fedlit.strategies.ditto import Ditto
from fedlit.strategies.epfl import EPFL
from fedlit.strategies.fedadagrad import FedAdagrad
from fedlit.strategies.fedadam import FedAdam
from fedlit.strategies.fedala import FedALA
from fedlit.strategies.fedavg import FedAvg
from fedlit.strategies.fedavg_ft import FedAvgFT
from fedlit.strategies.fedbabu import FedBABU
from fedlit.strategies.fedbn import FedBN
from fedlit.strategies.feddbe import FedDBE
from fedlit.strategies.feddyn import FedDyn
from fedlit.strategies.fedfomo import FedFomo
from fedlit.strategies.fedheal import FedHEAL
from fedlit.strategies.fedmedian import FedMedian
from fedlit.strategies.fedmetamed import FedMetaMed
from fedlit.strategies.fedopt import FedOpt
from fedlit.strategies.fedper import FedPer
from fedlit.strategies.fedprox import FedProx
from fedlit.strategies.fedprox_ft import FedProxFT
from fedlit.strategies.fedpxn import FedPxN
from fedlit.strategies.fedra import FedRA
from fedlit.strategies.fedrep import FedRep
from fedlit.strategies.fedrod import FedRoD
from fedlit.strategies.fedsa import FedSA
from fedlit.strategies.fedsca import FedSCA
from fedlit.strategies.fedsld import FedSLD
from fedlit.strategies.fedtrimmedavg import FedTrimmedAvg
from fedlit.strategies.fedyogi import FedYogi
from fedlit.strategies.fml import FML
from fedlit.strategies.ida import IDA
from fedlit.strategies.krum import Krum
from fedlit.strategies.lg_fedavg import LGFedAvg
from fedlit.strategies.local import Local
from fedlit.strategies.metafed import MetaFed
from fedlit.strategies.perfedavg import PerFedAvg
from fedlit.strategies.pfedme import pFedMe
from fedlit.strategies.pfedmoap import pFedMoAP
from fedlit.strategies.pgfed import PGFed, PGFedMo
from fedlit.strategies.scaffold import SCAFFOLD
from fedlit.strategies.silobn import SiloBN

__all__ = ["ClientUpdate", "FedAvg", "FedBN", "FedProx", "FedPxN", "FedSLD", "Local", "SiloBN", "Strategy"]
__all__ += [
    "Aggregator",
    "FedAdagrad",
    "FedAdam",
    "FedMedian",
    "FedOpt",
    "FedTrimmedAvg",
    "FedYogi",
    "Krum",
    "KrumAggregator",
    "MedianAggregator",
    "TrimmedMeanAggregator",
    "WeightedMeanAggregator",
]
__all__ += ["FedDyn", "SCAFFOLD"]
__all__ += ["FedSCA"]
__all__ += ["FedHEAL", "FedRA", "FedSA"]
__all__ += ["PGFed", "PGFedMo"]
__all__ += ["EPFL"]
__all__ += ["APPLE"]
__all__ += ["FedMetaMed"]
__all__ += ["FedAvgFT", "FedProxFT"]
__all__ += ["APFL", "FedALA"]
__all__ += ["FedBABU", "FedPer", "FedRep", "LGFedAvg"]
__all__ += ["Ditto", "PerFedAvg", "pFedMe"]
__all__ += ["FedDBE", "FedFomo", "FedRoD"]
__all__ += ["pFedMoAP"]

__all__ += ["FML", "IDA"]
__all__ += ["MetaFed"]
