"""``fedlit report``'s t-intervals over seeds and the verdicts they allow, against values worked out by hand (the
t quantiles from printed tables: t(0.975, 1) = 12.706205, t(0.975, 2) = 4.302653, t(0.975, 4) = 2.776445)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from fedlit.commands import report
from fedlit.commands.report.interval import shown, t_quantile
from tests.commands.test_report import FEDAVG, LOCAL, make_run


def test_t_quantiles_are_students_not_the_normals() -> None:
    assert t_quantile(1) == pytest.approx(12.706205, abs=1e-6)
    assert t_quantile(2) == pytest.approx(4.302653, abs=1e-6)
    assert t_quantile(4) == pytest.approx(2.776445, abs=1e-6)


def test_three_seeds_whose_interval_holds_zero_are_not_separated() -> None:
    # gains 0.1, 0.2, 0.3: mean 0.2, sd 0.1, se 0.1 / sqrt(3) = 0.057735; half-width 4.302653 * 0.057735 = 0.248414
    interval = report.t_interval([0.1, math.nan, 0.2, 0.3])  # a NaN (an undefined gain) is left out
    assert interval is not None and interval.k == 3
    assert (interval.mean, interval.se) == (pytest.approx(0.2), pytest.approx(0.057735, abs=1e-6))
    assert (interval.low, interval.high) == (pytest.approx(-0.048414, abs=1e-6), pytest.approx(0.448414, abs=1e-6))
    assert report.verdict(interval) == "not separated at 3 seeds"
    assert report.gain_sentence(interval) == (
        "gain over Local: +0.2000 (95 % t-interval -0.0484 to 0.4484, 3 seeds): not separated at 3 seeds"
    )


def test_an_interval_that_excludes_zero_beats_or_loses() -> None:
    # gains 0.3, 0.4, 0.5: mean 0.4, the same se 0.057735 and half-width 0.248414 -> 0.151586 to 0.648414
    above = report.t_interval([0.3, 0.4, 0.5])
    assert above is not None and (above.low, above.high) == (
        pytest.approx(0.151586, abs=1e-6),
        pytest.approx(0.648414, abs=1e-6),
    )
    assert report.verdict(above) == "beats Local" and report.verdict(above, "FedAvg") == "beats FedAvg"
    below = report.t_interval([-0.3, -0.4, -0.5])
    assert report.verdict(below) == "loses to Local" and shown(below) == "-0.6484 to -0.1516"
    # 5 seeds 0.01 .. 0.05: mean 0.03, sd sqrt(0.001 / 4) = 0.015811, se 0.007071; half 2.776445 * 0.007071 = 0.019632
    five = report.t_interval([0.01, 0.03, 0.02, 0.04, 0.05])
    assert five is not None and (five.low, five.high) == (
        pytest.approx(0.010368, abs=1e-6),
        pytest.approx(0.049632, abs=1e-6),
    )
    assert report.verdict(five) == "beats Local"
    # the same mean and se at 3 seeds would not be enough: 0.03 - 4.302653 * 0.007071 = -0.000425
    assert report.verdict(report.t_interval([0.03 - 0.012247, 0.03, 0.03 + 0.012247])) == "not separated at 3 seeds"


def test_one_seed_has_no_interval_and_no_verdict() -> None:
    one = report.t_interval([0.3, math.nan])
    assert one is not None and one.k == 1 and math.isnan(one.low) and math.isnan(one.high)
    assert report.verdict(one) == "one seed: no interval" and shown(one) == "—"
    assert report.gain_sentence(one) == "gain over Local: +0.3000 (1 seed): one seed: no interval"
    assert report.t_interval([]) is None and report.verdict(None) == "—"


def _section(tmp_path: Path) -> str:
    report.write([tmp_path / "runs"], tmp_path / "out", vector=None)
    return (tmp_path / "out" / "report.md").read_text().split("## Mean and worst client")[1].split("## Convergence")[0]


def test_report_prints_the_interval_and_verdict_of_each_gain(tmp_path: Path) -> None:
    # Local 0.5 on client a in every seed, FedAvg 0.8, 0.9, 1.0: gains 0.3, 0.4, 0.5 -> 0.1516 to 0.6484, beats Local
    for seed, value in enumerate((0.8, 0.9, 1.0)):
        make_run(tmp_path / "runs" / "fedavg" / f"seed_{seed}", FEDAVG, seed, last={"a": value})
        make_run(tmp_path / "runs" / "local" / f"seed_{seed}", LOCAL, seed, last={"a": 0.5}, lr=0.2)
    text = _section(tmp_path)
    assert "| gain over Local | 95 % t-interval of the gain | verdict | seeds paired |" in text
    # gain 0.4 ± 0.057735 (standard error)
    assert "| +0.4000 ± 0.0577 | 0.1516 to 0.6484 | beats Local | 0, 1, 2 |" in text
    assert "| Local | 3 | 0.5000 ± 0.0000 | 0.5000 ± 0.0000 | — | — | — | — |" in text
    assert "FedAvg: gain over Local: +0.4000 (95 % t-interval 0.1516 to 0.6484, 3 seeds): beats Local" in text


def test_report_of_two_seeds_that_do_not_separate(tmp_path: Path) -> None:
    # gains 0.1 and 0.2 (seed 0: FedAvg 0.6 against Local 0.5; seed 1: 0.7 against 0.5): se 0.05, half-width
    # 12.706205 * 0.05 = 0.635310 -> -0.4853 to 0.7853
    for seed, value in enumerate((0.6, 0.7)):
        make_run(tmp_path / "runs" / "fedavg" / f"seed_{seed}", FEDAVG, seed, last={"a": value})
        make_run(tmp_path / "runs" / "local" / f"seed_{seed}", LOCAL, seed, last={"a": 0.5}, lr=0.2)
    text = _section(tmp_path)
    assert "| +0.1500 ± 0.0500 | -0.4853 to 0.7853 | not separated at 2 seeds | 0, 1 |" in text
    assert "FedAvg: gain over Local: +0.1500 (95 % t-interval -0.4853 to 0.7853, 2 seeds): not separated" in text


def test_report_of_one_paired_seed_gives_no_interval(tmp_path: Path) -> None:
    make_run(tmp_path / "runs" / "fedavg", FEDAVG, 0, last={"a": 0.2})
    make_run(tmp_path / "runs" / "local", LOCAL, 0, last={"a": 0.5}, lr=0.2)
    text = _section(tmp_path)
    assert "| -0.3000 | — | one seed: no interval | 0 |" in text
    assert "FedAvg: gain over Local: -0.3000 (1 seed): one seed: no interval" in text
