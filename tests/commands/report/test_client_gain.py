"""The per-client gain over Local and its mean ± std across clients (values worked out by hand)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from fedlit.commands import report
from fedlit.commands.report import client_gain
from tests.commands.test_report import FEDAVG, LOCAL, make_run


@pytest.fixture
def experiment(tmp_path: Path) -> Path:
    make_run(tmp_path / "fedavg" / "seed_0", FEDAVG, 0, last={"a": 0.8, "b": 0.6, "c": 0.9})
    make_run(tmp_path / "fedavg" / "seed_1", FEDAVG, 1, last={"a": 0.6, "b": 0.4, "c": 0.7})
    make_run(tmp_path / "local" / "seed_0", LOCAL, 0, last={"a": 0.7, "b": 0.7, "c": 0.5}, lr=0.2)
    make_run(tmp_path / "local" / "seed_1", LOCAL, 1, last={"a": 0.5, "b": 0.3, "c": 0.5}, lr=0.2)
    return tmp_path


def test_each_clients_gain_is_averaged_over_seeds_then_spread_across_clients(experiment: Path) -> None:
    groups = report.by_method(report.load_runs([experiment])[0])
    gains = client_gain.client_gains(groups["FedAvg"], groups["Local"], "last", "accuracy", higher=True)
    # a: values 0.8, 0.6 -> 0.7; gains 0.1, 0.1 -> 0.1.  b: 0.5; gains -0.1, 0.1 -> 0.0.  c: 0.8; gains 0.4, 0.2 -> 0.3
    assert gains == {
        "a": pytest.approx((0.7, 0.1)),
        "b": pytest.approx((0.5, 0.0)),
        "c": pytest.approx((0.8, 0.3)),
    }
    # across clients: mean (0.1 + 0.0 + 0.3) / 3 = 0.133333; std sqrt((0.033333^2 + 0.133333^2 + 0.166667^2) / 2)
    # = sqrt(0.046667 / 2) = 0.152753
    assert client_gain.across_clients(gains) == pytest.approx((0.133333, 0.152753), abs=1e-6)
    # a lower-is-better metric turns the sign: Local's value minus the method's
    lower = client_gain.client_gains(groups["FedAvg"], groups["Local"], "last", "accuracy", higher=False)
    assert lower["c"] == pytest.approx((0.8, -0.3))


def test_the_report_shows_the_table_only_with_a_baseline(experiment: Path, tmp_path: Path) -> None:
    text = report.write([experiment], tmp_path / "out", vector=None).read_text()
    assert "## Per-client gain over Local (last round)" in text
    assert "| FedAvg | c | 0.8000 (+0.3000) |" in text
    assert "| **FedAvg** | **mean gain ± std across clients** | +0.1333 ± 0.1528 |" in text
    alone = report.write([experiment / "fedavg"], tmp_path / "alone", vector=None).read_text()
    assert "Per-client gain" not in alone


def test_an_undefined_value_is_left_out_of_the_spread() -> None:
    gains = {"a": (0.7, 0.1), "b": (math.nan, math.nan), "c": (0.8, 0.3)}
    assert client_gain.across_clients(gains) == pytest.approx((0.2, math.sqrt(0.02)))
