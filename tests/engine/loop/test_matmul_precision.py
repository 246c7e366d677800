"""``federation.matmul_precision`` sets ``torch.set_float32_matmul_precision`` while a run computes and gives the
process its own setting back after it; None (the default) leaves the process's setting alone."""

from __future__ import annotations

from dataclasses import fields

import pytest
import torch
from lightning.pytorch import Callback

from fedlit.engine.loop.settings import Settings
from fedlit.strategies import FedAvg
from tests.conftest import make_federation


class _Seen(Callback):
    """Records the matmul precision in force at each round's start."""

    def __init__(self) -> None:
        self.rounds: list[str] = []

    def on_round_start(self, trainer, pl_module, server_round) -> None:
        self.rounds.append(torch.get_float32_matmul_precision())


@pytest.fixture
def process_precision():
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high")  # what a user's script set before building the federation
    yield "high"
    torch.set_float32_matmul_precision(before)


@pytest.mark.parametrize("chosen", ["highest", "medium"])
def test_the_chosen_precision_holds_during_the_run_and_the_process_gets_its_own_after(
    tmp_path, process_precision, chosen
):
    seen = _Seen()
    make_federation(tmp_path, FedAvg(), rounds=2, matmul_precision=chosen, callbacks=[seen]).fit()
    assert seen.rounds == [chosen, chosen]
    assert torch.get_float32_matmul_precision() == process_precision


def test_none_leaves_the_process_setting(tmp_path, process_precision):
    seen = _Seen()
    federation = make_federation(tmp_path, FedAvg(), rounds=1, callbacks=[seen])
    assert federation.settings.matmul_precision is None
    federation.fit()
    assert seen.rounds == [process_precision] and torch.get_float32_matmul_precision() == process_precision


def test_a_value_outside_the_choices_is_refused_with_them():
    values = {f.name: f.default for f in fields(Settings)} | {"matmul_precision": "low"}
    assert Settings.problems(values) == [
        "federation.matmul_precision='low' is not one of ['highest', 'high', 'medium', None]"
    ]
    assert Settings.problems(values | {"matmul_precision": None}) == []
