"""The import paths downstream code uses keep working after the move to layers."""

from __future__ import annotations

import pytest


def test_the_public_paths_give_the_objects_of_their_new_homes():
    import fedlit
    from fedlit.engine.loop.run import Run
    from fedlit.federation import Federation
    from fedlit.module import FederatedModule

    assert fedlit.Federation is Federation and issubclass(Federation, Run)
    assert fedlit.FederatedModule is FederatedModule
    from fedlit.callbacks import EarlyStopping  # noqa: F401  (recipes name it by this path)
    from fedlit.data import Dirichlet, FederatedDataModule, SyntheticImages  # noqa: F401
    from fedlit.data.common.datamodule import PartitionedData
    from fedlit.data.common.pool import PartitionedData as pooled
    from fedlit.strategies import SCAFFOLD, FedAvg, Strategy  # noqa: F401
    from fedlit.tasks import ClassificationModule, concordance_index  # noqa: F401

    assert PartitionedData is pooled


def test_the_old_math_module_finds_each_function_in_its_new_home_with_a_warning():
    from fedlit.core import tensors
    from fedlit.strategies import apple, scaffold
    from fedlit.strategies import functional as old
    from fedlit.strategies.common import aggregate

    with pytest.warns(DeprecationWarning, match="moved to fedlit.strategies.common.aggregate.weighted_average"):
        assert old.weighted_average is aggregate.weighted_average
    with pytest.warns(DeprecationWarning):
        assert old.apple_mix is apple.apple_mix and old.scaffold_control_variate is scaffold.scaffold_control_variate
    with pytest.warns(DeprecationWarning, match="fedlit.core.tensors.nbytes"):
        assert old.state_nbytes is tensors.nbytes
    with pytest.raises(AttributeError, match="no attribute 'not_a_function'"):
        old.not_a_function  # noqa: B018


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("fedlit.engine.rounds", "fedlit.engine.loop.rounds"),
        ("fedlit.engine.record", "fedlit.engine.records.record"),
        ("fedlit.engine.fused", "fedlit.engine.speedups.fused"),
        ("fedlit.strategies.aggregate", "fedlit.strategies.common.aggregate"),
        ("fedlit.strategies.apple_math", "fedlit.strategies.apple.equations"),
        ("fedlit.models.sam_adapter", "fedlit.models.sam.adapter"),
        ("fedlit.commands.report_runs", "fedlit.commands.report.runs"),
        ("fedlit.data.datamodule", "fedlit.data.common.datamodule"),
    ],
)
def test_a_moved_module_s_old_path_warns_and_gives_the_new_module(old, new):
    import importlib
    import sys

    sys.modules.pop(old, None)
    with pytest.warns(DeprecationWarning, match=f"{old} moved to {new}"):
        module = importlib.import_module(old)
    assert module is importlib.import_module(new)
