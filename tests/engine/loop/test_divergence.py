"""``federation.divergence``: a round whose mean training loss is over 100 times the first round's warns once
(``warn``), stops the run before the round is saved (``stop``), or is let be (``off``)."""

from __future__ import annotations

import csv
import io
import warnings

import pytest
import torch
from lightning.pytorch import Callback

from fedlit import FedAvg
from fedlit.core.errors import FedlitError
from tests.conftest import make_federation


class Exploding(Callback):
    """Each round's training losses 1000 times the last round's, as a far too high learning rate gives them."""

    def on_client_fit_end(self, update, server_round, **kwargs) -> None:
        update.metrics["loss"] *= 1000.0 ** (server_round - 1)


def _divergence_warnings(caught) -> list[str]:
    return [str(w.message) for w in caught if "training diverges" in str(w.message)]


def test_warn_says_it_once_and_the_run_goes_on(tmp_path):
    fed = make_federation(tmp_path, FedAvg(), rounds=3, callbacks=[Exploding()])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fed.fit()
    first = fed.state.divergence["loss"]
    said = _divergence_warnings(caught)
    assert len(said) == 1 and said[0].startswith("Round 2: the clients' mean training loss ")
    assert f"is over 100 times that of round 1 ({first:.3g}): the training diverges" in said[0]
    assert fed.state.round == 3


def test_stop_ends_the_run_before_the_round_is_saved(tmp_path):
    fed = make_federation(tmp_path, FedAvg(), rounds=3, callbacks=[Exploding()], divergence="stop")
    with pytest.raises(FedlitError) as err:
        fed.fit()
    ckpt = tmp_path / "checkpoints" / "last.ckpt"
    assert str(err.value).endswith(
        f"federation.divergence=stop: the round is not recorded or saved; the last good checkpoint {ckpt} is kept."
    )
    assert torch.load(ckpt, weights_only=True)["server_round"] == 1
    rows = list(csv.reader(io.StringIO((tmp_path / "metrics.csv").read_text(), newline="")))
    assert {r[0] for r in rows[1:]} == {"1"}


def test_off_and_a_healthy_run_say_nothing(tmp_path):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        make_federation(tmp_path / "off", FedAvg(), rounds=3, callbacks=[Exploding()], divergence="off").fit()
        healthy = make_federation(tmp_path / "healthy", FedAvg(), rounds=3)
        healthy.fit()
    assert _divergence_warnings(caught) == [] and healthy.state.divergence["round"] == 1


def test_a_resumed_run_compares_with_the_first_round_of_the_run(tmp_path):
    make_federation(tmp_path, FedAvg(), rounds=1, callbacks=[Exploding()]).fit()
    resumed = make_federation(tmp_path, FedAvg(), rounds=2, callbacks=[Exploding()], divergence="stop")
    with pytest.raises(FedlitError, match="Round 2: .* over 100 times that of round 1"):
        resumed.fit(ckpt_path=tmp_path / "checkpoints" / "last.ckpt")
