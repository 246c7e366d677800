"""The gain over a Local run (``--baseline_run``): mean and std worked out by hand on hand-written run folders,
and the refusals of another data set, another seed, a non-Local run and a missing or corrupt results.json."""

from __future__ import annotations

import json
import math
import statistics

import pytest

from fedlit.core.errors import ConfigError
from fedlit.engine.records.baseline import LOCAL, gain_over_local, load, protocol
from fedlit.strategies import FedAvg
from tests.conftest import TinyTabular, make_federation

HIGHER = {"accuracy": True, "loss": False}


def _baseline(folder, clients, *, best=True, seed=0, strategy=LOCAL, manifest=None, protocol=None):
    """A hand-written finished run: results.json with ``clients`` at round 3 (best) and 5 (last), trained as
    ``protocol`` records."""
    folder.mkdir(parents=True, exist_ok=True)
    results = {
        "strategy_class": strategy,
        "seed": seed,
        "last": {"round": 5, "clients": clients, "summary": {}},
        "protocol": protocol,
    }
    if best:
        results["best"] = {"round": 3, "clients": clients, "summary": {}}
    (folder / "results.json").write_text(json.dumps(results))
    data = TinyTabular()
    data.setup()
    (folder / "manifest.json").write_text(json.dumps(manifest or data.manifest()))
    return folder


def test_mean_and_std_of_the_gains_by_hand():
    run = {
        "a": {"accuracy": 0.8, "loss": 0.5},
        "b": {"accuracy": 0.6, "loss": 0.7},
        "c": {"accuracy": 0.9, "loss": 0.4},
    }
    local = {
        "last": {
            "round": 5,
            "clients": {
                "a": {"accuracy": 0.7, "loss": 0.6},
                "b": {"accuracy": 0.65, "loss": 0.6},
                "c": {"accuracy": 0.6, "loss": 0.8},
            },
        }
    }
    gain = gain_over_local(run, 4, "best", local, HIGHER)
    # gains 0.1, -0.05, 0.3: mean 0.35 / 3; deviations -1/60, -10/60, 11/60, squares sum 222/3600, / (3 - 1)
    assert gain["selection"] == "last" and gain["round"] == 4 and gain["baseline_round"] == 5  # no best: last
    assert gain["clients"]["b"]["accuracy"] == pytest.approx(-0.05)
    assert gain["mean"]["accuracy"] == pytest.approx(0.1166667, abs=1e-7)
    assert gain["std"]["accuracy"] == pytest.approx(0.1755942, abs=1e-7)
    # loss, lower is better, so the gain is local minus run: 0.1, -0.1, 0.4 -> mean 0.4 / 3 (a lower loss is a
    # positive gain), std sqrt(((1/30)^2 + (7/30)^2 + (8/30)^2) / 2) = sqrt(114/1800)
    assert gain["clients"]["c"]["loss"] == pytest.approx(0.4)
    assert gain["mean"]["loss"] == pytest.approx(0.1333333, abs=1e-7)
    assert gain["std"]["loss"] == pytest.approx(0.2516611, abs=1e-7)
    one = gain_over_local({"a": run["a"]}, 4, "last", local, HIGHER)
    assert one["mean"]["accuracy"] == pytest.approx(0.1) and math.isnan(one["std"]["accuracy"])


def test_a_client_missing_from_the_baseline_is_refused():
    with pytest.raises(ConfigError, match=r"clients \['z'\] have no test values"):
        gain_over_local({"z": {"accuracy": 1.0}}, 1, "last", {"last": {"round": 1, "clients": {}}}, HIGHER)


def test_a_run_reports_its_gain_over_a_local_run(tmp_path):
    local = {
        "c0": {"accuracy": 0.5, "loss": 1.0},
        "c1": {"accuracy": 0.25, "loss": 1.5},
        "c2": {"accuracy": 0.75, "loss": 0.5},
    }
    fed = make_federation(tmp_path / "run", FedAvg(), rounds=2)
    fed.baseline_run = _baseline(tmp_path / "local", local, protocol=protocol(fed))
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


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (None, r"no results.json there"),
        ("{not json", r"results.json cannot be read as JSON"),
        ('{"seed": 0}', r"results.json holds no test results"),
    ],
)
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

    tiny = [
        *QUICK,
        "--federation.local_epochs",
        "1",
        "--data.init_args.samples_per_client",
        "12",
        "--federation.rounds",
        "1",
    ]
    local = run(["fit", *tiny, "--strategy", "Local", "--out_dir", str(tmp_path / "local")])
    fit = run(["fit", *tiny, "--out_dir", str(tmp_path / "fedbn"), "--baseline_run", str(tmp_path / "local")])
    expected = [
        fit["best"]["clients"][c]["accuracy"] - local["best"]["clients"][c]["accuracy"] for c in fit["best"]["clients"]
    ]
    assert fit["gain_over_local"]["mean"]["accuracy"] == pytest.approx(statistics.mean(expected))
    assert "baseline_run" not in json.loads((tmp_path / "fedbn" / "config.json").read_text())
    tested = run(
        ["test", "--run", str(tmp_path / "fedbn"), "--ckpt_path", "best", "--baseline_run", str(tmp_path / "local")]
    )
    assert tested["gain_over_local"]["selection"] == "best"
    assert tested["gain_over_local"]["mean"]["accuracy"] == pytest.approx(statistics.mean(expected))


def test_a_baseline_trained_otherwise_is_refused_naming_each_difference_unless_any(tmp_path):
    local = {"c0": {"accuracy": 0.5}, "c1": {"accuracy": 0.25}, "c2": {"accuracy": 0.75}}
    fed = make_federation(tmp_path / "run", FedAvg(), rounds=2, local_steps=5)
    theirs = json.loads(json.dumps(protocol(fed)))  # as a results.json holds it
    assert theirs["rounds"] == 2 and theirs["local_steps"] == 5 and theirs["local_epochs"] is None
    assert theirs["optimizer"] == {"name": "sgd", "lr": 0.1, "momentum": 0.9, "weight_decay": 0.0}
    theirs.update(rounds=10, local_steps=20, selection_metric="loss")
    theirs["optimizer"]["lr"] = 0.05
    theirs["model"]["shapes"] = "0123456789ab"
    fed.baseline_run = _baseline(tmp_path / "local", local, protocol=theirs)
    with pytest.raises(ConfigError) as info:
        fed.fit()
    message = str(info.value)
    for part in (
        "federation.rounds 10 (this run: 2)",
        "federation.local_steps 20 (this run: 5)",
        "optimizer lr 0.05 (this run: 0.1)",
        "model shapes '0123456789ab'",
        "the selection metric 'loss' (this run: 'accuracy')",
        "--baseline_compare any",
    ):
        assert part in message
    assert "\n" not in message and not (tmp_path / "run" / "results.json").exists()
    # a run of an older fedlit (no protocol recorded) is refused too
    fed.baseline_run = _baseline(tmp_path / "old", local)
    with pytest.raises(ConfigError, match="records no training protocol"):
        load(fed.baseline_run, fed)
    # --baseline_compare any: compared anyway, and results.json says so and lists what differed
    fed.baseline_run, fed.baseline_compare = tmp_path / "local", "any"
    results = fed.fit()
    saved = json.loads((tmp_path / "run" / "results.json").read_text())
    assert saved["gain_over_local"]["compare"] == "any" and len(saved["gain_over_local"]["differences"]) == 5
    assert saved["protocol"] == json.loads(json.dumps(protocol(fed)))
    assert results["gain_over_local"]["clients"]["c1"]["accuracy"] == pytest.approx(
        results["best"]["clients"]["c1"]["accuracy"] - 0.25
    )


def test_the_cli_refuses_a_shorter_run_against_a_longer_local_one_unless_any(tmp_path):
    from fedlit.cli import run
    from tests.test_cli import QUICK

    tiny = [*QUICK, "--federation.local_epochs", "1", "--data.init_args.samples_per_client", "12"]
    run(["fit", *tiny, "--federation.rounds", "2", "--strategy", "Local", "--out_dir", str(tmp_path / "local")])
    with pytest.raises(ConfigError, match=r"trained otherwise: federation.rounds 2 \(this run: 1\)\. Give"):
        run(
            [
                "fit",
                *tiny,
                "--federation.rounds",
                "1",
                "--out_dir",
                str(tmp_path / "short"),
                "--baseline_run",
                str(tmp_path / "local"),
            ]
        )
    fit = run(
        [
            "fit",
            *tiny,
            "--federation.rounds",
            "1",
            "--out_dir",
            str(tmp_path / "any"),
            "--baseline_run",
            str(tmp_path / "local"),
            "--baseline_compare",
            "any",
        ]
    )
    assert fit["gain_over_local"]["compare"] == "any"
    assert fit["gain_over_local"]["differences"] == ["federation.rounds 2 (this run: 1)"]
