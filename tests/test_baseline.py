"""The gain over a Local run (``--baseline_run``): mean and std worked out by hand on hand-written run folders,
and the refusals of another data set, another seed, a non-Local run and a missing or corrupt results.json."""

from __future__ import annotations

import json
import math
import statistics

import pytest

from fedlit.core.errors import ConfigError
from fedlit.engine.baseline import LOCAL, gain_over_local, load
from fedlit.strategies import FedAvg
from tests.conftest import TinyTabular, make_federation

HIGHER = {"accuracy": True, "loss": False}


def _baseline(folder, clients, *, best=True, seed=0, strategy=LOCAL, manifest=None):
    """A hand-written finished run: results.json with ``clients`` at round 3 (best) and 5 (last)."""
    folder.mkdir(parents=True, exist_ok=True)
    results = {"strategy_class": strategy, "seed": seed, "last": {"round": 5, "clients": clients, "summary": {}}}
    if best:
        results["best"] = {"round": 3, "clients": clients, "summary": {}}
    (folder / "results.json").write_text(json.dumps(results))
    data = TinyTabular()
    data.setup()
    (folder / "manifest.json").write_text(json.dumps(manifest or data.manifest()))
    return folder


def test_mean_and_std_of_the_gains_by_hand():
    run = {"a": {"accuracy": 0.8, "loss": 0.5}, "b": {"accuracy": 0.6, "loss": 0.7}, "c": {"accuracy": 0.9,
                                                                                         "loss": 0.4}}
    local = {"last": {"round": 5, "clients": {"a": {"accuracy": 0.7, "loss": 0.6}, "b": {"accuracy": 0.65,
                                                                                        "loss": 0.6},
                                              "c": {"accuracy": 0.6, "loss": 0.8}}}}
    gain = gain_over_local(run, 4, "best", local, HIGHER)
    # gains 0.1, -0.05, 0.3: mean 0.35 / 3; deviations -1/60, -10/60, 11/60, squares sum 222/3600, / (3 - 1)
    assert gain["selection"] == "last" and gain["round"] == 4 and gain["baseline_round"] == 5  # no best: last
    assert gain["clients"]["b"]["accuracy"] == pytest.approx(-0.05)
    assert gain["mean"]["accuracy"] == pytest.approx(0.1166667, abs=1e-7)
    assert gain["std"]["accuracy"] == pytest.approx(0.1755942, abs=1e-7)
    # loss: -0.1, 0.1, -0.4 -> mean -0.4 / 3, std sqrt(((1/30)^2 + (7/30)^2 + (8/30)^2) / 2) = sqrt(114/1800)
    assert gain["mean"]["loss"] == pytest.approx(-0.1333333, abs=1e-7)
    assert gain["std"]["loss"] == pytest.approx(0.2516611, abs=1e-7)
    one = gain_over_local({"a": run["a"]}, 4, "last", local, HIGHER)
    assert one["mean"]["accuracy"] == pytest.approx(0.1) and math.isnan(one["std"]["accuracy"])


def test_a_client_missing_from_the_baseline_is_refused():
    with pytest.raises(ConfigError, match=r"clients \['z'\] have no test values"):
        gain_over_local({"z": {"accuracy": 1.0}}, 1, "last", {"last": {"round": 1, "clients": {}}}, HIGHER)


def test_a_run_reports_its_gain_over_a_local_run(tmp_path):
    local = {"c0": {"accuracy": 0.5, "loss": 1.0}, "c1": {"accuracy": 0.25, "loss": 1.5},
             "c2": {"accuracy": 0.75, "loss": 0.5}}
    fed = make_federation(tmp_path / "run", FedAvg(), rounds=2)
    fed.baseline_run = _baseline(tmp_path / "local", local)
    results = fed.fit()
    gain = results["gain_over_local"]
    assert gain["selection"] == "best" and gain["baseline_round"] == 3 and gain["round"] == results["best"]["round"]
    ours = results["best"]["clients"]
    expected = [ours[c]["accuracy"] - local[c]["accuracy"] for c in ("c0", "c1", "c2")]
    assert [gain["clients"][c]["accuracy"] for c in ("c0", "c1", "c2")] == pytest.approx(expected)
    assert gain["mean"]["accuracy"] == pytest.approx(statistics.mean(expected))
    assert gain["std"]["accuracy"] == pytest.approx(statistics.stdev(expected))
    saved = json.loads((tmp_path / "run" / "results.json").read_text())["gain_over_local"]
    assert saved["mean"]["accuracy"] == pytest.approx(statistics.mean(expected))
    assert "### Gain over Local (best" in (tmp_path / "run" / "results.md").read_text()


def test_another_data_partition_or_seed_is_refused_before_training(tmp_path):
    other = TinyTabular(seed=1)
    other.setup()
    fed = make_federation(tmp_path / "run", FedAvg(), rounds=1)
    fed.baseline_run = _baseline(tmp_path / "local", {}, manifest=other.manifest(), seed=7)
    with pytest.raises(ConfigError, match=r"data seed 1 \(this run: 0\).*federation.seed 7 \(this run: 0\)"):
        fed.fit()
    assert not (tmp_path / "run" / "results.json").exists()


@pytest.mark.parametrize(("content", "expected"), [
    (None, r"no results.json there"),
    ("{not json", r"results.json cannot be read as JSON"),
    ('{"seed": 0}', r"results.json holds no test results"),
])
def test_a_missing_or_corrupt_results_json_names_the_file(tmp_path, content, expected):
    folder = _baseline(tmp_path / "local", {})
    if content is None:
        (folder / "results.json").unlink()
    else:
        (folder / "results.json").write_text(content)
    with pytest.raises(ConfigError, match=expected) as info:
        load(folder)
    assert str(folder) in str(info.value)


def test_a_run_of_another_strategy_is_refused(tmp_path):
    folder = _baseline(tmp_path / "fedavg", {}, strategy="fedlit.strategies.fedavg.FedAvg")
    with pytest.raises(ConfigError, match="is a run of fedlit.strategies.fedavg.FedAvg, not of"):
        load(folder)


def test_fit_and_test_take_a_baseline_run(tmp_path):
    from fedlit.cli import run
    from tests.test_cli import QUICK

    tiny = [*QUICK, "--federation.local_epochs", "1", "--data.init_args.samples_per_client", "12",
            "--federation.rounds", "1"]
    local = run(["fit", *tiny, "--strategy", "Local", "--out_dir", str(tmp_path / "local")])
    fit = run(["fit", *tiny, "--out_dir", str(tmp_path / "fedbn"), "--baseline_run", str(tmp_path / "local")])
    expected = [fit["best"]["clients"][c]["accuracy"] - local["best"]["clients"][c]["accuracy"]
                for c in fit["best"]["clients"]]
    assert fit["gain_over_local"]["mean"]["accuracy"] == pytest.approx(statistics.mean(expected))
    assert "baseline_run" not in json.loads((tmp_path / "fedbn" / "config.json").read_text())
    tested = run(["test", "--run", str(tmp_path / "fedbn"), "--ckpt_path", "best", "--baseline_run",
                  str(tmp_path / "local")])
    assert tested["gain_over_local"]["selection"] == "best"
    assert tested["gain_over_local"]["mean"]["accuracy"] == pytest.approx(statistics.mean(expected))
