"""Tuned baselines of ``fedlit grid`` (:mod:`fedlit.commands.grid_tune`): each point of a method's declared grid runs
over the tuning seeds, the best mean validation value of the selection metric wins (never a test value), the chosen
point runs over the seeds, and the choice is recorded and reported."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import pytest

from fedlit.cli import main
from fedlit.commands import grid as grid_command
from fedlit.commands import grid_tune
from fedlit.commands.grid import load_grid

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "recipes" / "quickstart.yaml"
TINY = "--federation.progress_bar false --data.init_args.samples_per_client 20 --federation.local_epochs 1"
LR = "--model.init_args.lr"
TUNED = f"  FedAvg: {{overrides: --strategy FedAvg, tune: {{{LR}: [0.001, 0.1]}}}}\n"


def write_grid(folder: Path, methods: str = TUNED, top: str = "seeds: [0]\ntune_seeds: [0, 1]\n") -> Path:
    path = folder / "grid.yaml"
    path.write_text(
        f"{top}out_dir: {folder / 'out'}\noverrides: {TINY} --federation.rounds 2\n"
        f"datasets:\n  a: {{recipes: [{QUICKSTART}]}}\nmethods:\n{methods}"
    )
    return path


@pytest.fixture(scope="module")
def tuned(tmp_path_factory) -> Path:
    """A tuned cell: 2 learning rates x tuning seeds 0, 1, then the chosen one over seed 0; run in this process."""
    folder = tmp_path_factory.mktemp("tuned")
    main(["grid", "--config", str(write_grid(folder)), "--in_process"])
    return folder / "out"


def validation_value(run: Path) -> float:
    """Read independently of fedlit: the server's val ``<metric>_mean`` row of metrics.csv at results.json's best
    round."""
    results = json.loads((run / "results.json").read_text())
    metric, selected = results["selection_metric"], results["best"]["round"]
    with (run / "metrics.csv").open(newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["client"] == "" and r["split"] == "val"]
    return [float(r["value"]) for r in rows if int(r["round"]) == selected and r["metric"] == f"{metric}_mean"][-1]


def test_the_points_are_the_product_in_declared_order():
    labels = [label for label, _ in grid_tune.points({LR: [0.01, 0.02], "--strategy.init_args.lam": [0.1, True]})]
    assert labels == ["lr=0.01_lam=0.1", "lr=0.01_lam=true", "lr=0.02_lam=0.1", "lr=0.02_lam=true"]
    both = grid_tune.points({LR: [1], "--strategy.init_args.lr": [2]})  # same last name: the whole option
    assert both == [("model.init_args.lr=1_strategy.init_args.lr=2", {LR: 1, "--strategy.init_args.lr": 2})]
    assert grid_tune.words({LR: 0.5, "--x": None}) == [LR, "0.5", "--x", "null"]


@pytest.mark.long
def test_the_choice_is_the_best_mean_validation_value_and_runs_over_the_seeds(tuned):
    cell = tuned / "a" / "FedAvg"
    assert sorted(p.name for p in (cell / "tune").iterdir()) == ["lr=0.001", "lr=0.1"]
    means = {}
    for label in ("lr=0.001", "lr=0.1"):
        assert sorted(p.name for p in (cell / "tune" / label).glob("seed_*")) == ["seed_0", "seed_1"]
        means[label] = sum(validation_value(cell / "tune" / label / f"seed_{s}") for s in (0, 1)) / 2
    best = "lr=0.1" if means["lr=0.1"] > means["lr=0.001"] else "lr=0.001"  # a tie: the first point
    record = json.loads((cell / "tuning.json").read_text())
    assert (record["metric"], record["split"], record["direction"]) == ("accuracy", "val", "higher")
    assert record["tune_seeds"] == [0, 1] and record["grid"] == {LR: [0.001, 0.1]}
    assert [p["label"] for p in record["points"]] == ["lr=0.001", "lr=0.1"]
    assert [p["mean"] for p in record["points"]] == pytest.approx(list(means.values()))
    assert record["chosen"]["label"] == best
    chosen_lr = record["chosen"]["options"][LR]
    assert chosen_lr == float(best.split("=")[1])
    # the cell's experiment: the chosen point over the grid's seeds (seed 0 only)
    assert sorted(p.name for p in cell.glob("seed_*")) == ["seed_0"]
    assert json.loads((cell / "seed_0" / "results.json").read_text())["protocol"]["optimizer"]["lr"] == chosen_lr
    grid_cell = json.loads((tuned / "grid.json").read_text())["cells"]["a/FedAvg"]
    assert grid_cell["tuned"]["options"] == {LR: chosen_lr} and grid_cell["status"] == "finished"
    assert grid_cell["command"][grid_cell["command"].index(LR) + 1] == str(chosen_lr)


def _set_values(run: Path, val: float, test: float) -> None:
    """Make a run's validation value at its selected round ``val`` and every test value ``test``."""
    results = json.loads((run / "results.json").read_text())
    metric, selected = results["selection_metric"], results["best"]["round"]
    for when in ("best", "last"):
        for values in results[when]["clients"].values():
            values[metric] = test
        results[when]["summary"][f"{metric}_mean"] = test
    (run / "results.json").write_text(json.dumps(results))
    with (run / "metrics.csv").open(newline="") as f:
        rows = list(csv.reader(f))
    for row in rows[1:]:
        if row[0] == str(selected) and row[2] == "val" and row[3] in (metric, f"{metric}_mean"):
            row[4] = str(val)
        if row[2] == "test" and row[3].startswith(metric):
            row[4] = str(test)
    with (run / "metrics.csv").open("w", newline="") as f:
        csv.writer(f).writerows(rows)


@pytest.mark.long
def test_validation_not_test_values_choose_and_finished_points_are_not_rerun(tuned, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(tuned, out)
    grid = load_grid(write_grid(tmp_path))
    tune = grid.methods["FedAvg"].tune

    def never(argv):
        raise AssertionError(f"a finished point ran again: {argv}")

    for good, bad in (("lr=0.001", "lr=0.1"), ("lr=0.1", "lr=0.001")):
        for seed in (0, 1):  # the validation values favour `good`, the test values `bad`
            _set_values(out / "a" / "FedAvg" / "tune" / good / f"seed_{seed}", val=0.9 - 0.1 * seed, test=0.1)
            _set_values(out / "a" / "FedAvg" / "tune" / bad / f"seed_{seed}", val=0.2, test=1.0)
        chosen = grid_tune.tune_cell(grid, "a", "FedAvg", tune, never, dry_run=False)
        assert chosen is not None and chosen["label"] == good and chosen["mean"] == pytest.approx(0.85)
        record = json.loads((out / "a" / "FedAvg" / "tuning.json").read_text())
        assert {p["label"]: p["scores"] for p in record["points"]}[good] == pytest.approx({"0": 0.9, "1": 0.8})

    # a lower-is-better metric, as the run's module declares it: the lowest mean wins
    for label, val in (("lr=0.001", 0.3), ("lr=0.1", 0.2)):
        for seed in (0, 1):
            run = out / "a" / "FedAvg" / "tune" / label / f"seed_{seed}"
            _set_values(run, val=val, test=0.5)
            results = json.loads((run / "results.json").read_text())
            results.setdefault("higher_is_better", {})["accuracy"] = False
            (run / "results.json").write_text(json.dumps(results))
    chosen = grid_tune.tune_cell(grid, "a", "FedAvg", tune, never, dry_run=False)
    assert chosen is not None and chosen["label"] == "lr=0.1"
    assert json.loads((out / "a" / "FedAvg" / "tuning.json").read_text())["direction"] == "lower"

    # no validation value at the selected round: the error names the run
    run = out / "a" / "FedAvg" / "tune" / "lr=0.1" / "seed_1"
    with (run / "metrics.csv").open(newline="") as f:
        rows = [r for r in csv.reader(f) if r[2] != "val"]
    with (run / "metrics.csv").open("w", newline="") as f:
        csv.writer(f).writerows(rows)
    with pytest.raises(grid_tune.TuningFailed, match=f"{run}: metrics.csv has no validation accuracy"):
        grid_tune.tune_cell(grid, "a", "FedAvg", tune, never, dry_run=False)


@pytest.mark.long
def test_resume_reruns_only_the_unfinished_point_and_the_cell(tuned, tmp_path, capsys, monkeypatch):
    out = tmp_path / "out"
    shutil.copytree(tuned, out)
    config = str(write_grid(tmp_path))
    started: list[list[str]] = []
    run_cell = grid_command._run_cell
    monkeypatch.setattr(
        grid_command, "_run_cell", lambda argv, in_process: started.append(argv) or run_cell(argv, in_process)
    )
    main(["grid", "--config", config, "--in_process"])
    assert started == [] and "seeds [0] finished before, skipped" in capsys.readouterr().out

    cell = out / "a" / "FedAvg"
    kept = (cell / "tune" / "lr=0.1" / "seed_0" / "results.json").stat().st_mtime_ns
    shutil.rmtree(cell / "tune" / "lr=0.001" / "seed_1")
    shutil.rmtree(cell / "seed_0")
    main(["grid", "--config", config, "--in_process"])
    assert [a[a.index("--out_dir") + 1] for a in started] == [str(cell / "tune" / "lr=0.001"), str(cell)]
    assert started[0][started[0].index("--seeds") + 1 : started[0].index("--out_dir")] == ["0", "1"]
    assert "1/2 tuning points finished before, kept" in capsys.readouterr().out
    assert (cell / "tune" / "lr=0.1" / "seed_0" / "results.json").stat().st_mtime_ns == kept
    assert (cell / "tune" / "lr=0.001" / "seed_1" / "results.json").is_file()
    assert (cell / "seed_0" / "results.json").is_file()


@pytest.mark.long
def test_the_report_lists_the_choice_and_leaves_the_tuning_runs_out_of_the_table(tuned, tmp_path, capsys):
    main(["report", str(tuned), "--out", str(tmp_path / "report"), "--vector", "none"])
    printed = capsys.readouterr().out
    record = json.loads((tuned / "a" / "FedAvg" / "tuning.json").read_text())
    line = (
        f"FedAvg on a: lr={record['chosen']['options'][LR]} (validation accuracy "
        f"{record['chosen']['mean']:.4f}, 2 points, seeds 0, 1)"
    )
    assert f"tuned: {line}" in printed and "1 run ->" in printed
    text = (tmp_path / "report" / "report.md").read_text()
    assert text.index("| data set | FedAvg |") < text.index("### Tuned hyperparameters") < text.index(line)


def test_dry_run_lists_every_tuning_point_then_the_cell_and_writes_nothing(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    methods = TUNED.replace("]}}", "], --strategy.init_args.weighting: [uniform, num_examples]}}")
    main(["grid", "--config", str(write_grid(tmp_path, methods)), "--dry_run"])
    lines = capsys.readouterr().out.splitlines()[1:]
    folders = [line.split("--out_dir ")[1] for line in lines]
    labels = ["lr=0.001_weighting=uniform", "lr=0.001_weighting=num_examples", "lr=0.1_weighting=uniform"]
    assert folders == [f"out/a/FedAvg/tune/{p}" for p in [*labels, "lr=0.1_weighting=num_examples"]] + ["out/a/FedAvg"]
    assert f"{LR} 0.001 --strategy.init_args.weighting num_examples --seeds 0 1 " in lines[1]
    assert "'<the chosen --model.init_args.lr, --strategy.init_args.weighting>' --seeds 0 " in lines[-1]
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("methods", "top", "expected"),
    [
        ("{M: {tune: {--model.init_args.lr: []}}}", "", "methods.M.tune.--model.init_args.lr: []; give a non-empty"),
        ("{M: {tune: {--model.init_args.lr: 0.1}}}", "", "--model.init_args.lr: 0.1; give a non-empty list"),
        ("{M: {tune: {--seeds: [1, 2]}}}", "", "methods.M.tune.--seeds: --seeds is set by the grid"),
        (
            "{M: {overrides: --model.init_args.lr 0.1, tune: {--model.init_args.lr: [0.1, 0.2]}}}",
            "",
            "methods.M.tune.--model.init_args.lr: --model.init_args.lr is also in the method's overrides",
        ),
        ("{M: {tune: {model.init_args.lr: [0.1]}}}", "", "'model.init_args.lr' is not an option"),
        ("{M: {tune: [--model.init_args.lr]}}", "", "methods.M.tune: give a mapping of options to lists"),
        ("{M: {tune: {--model.init_args.lr: [0.1, 0.1]}}}", "", "give distinct numbers"),
        ("{M: {overrides: --strategy FedAvg}}", "tune_seeds: []\n", "tune_seeds: []; give distinct integers"),
    ],
)
def test_a_bad_tune_is_one_line_naming_the_key_and_the_fix(methods, top, expected, tmp_path, capsys):
    path = tmp_path / "g.yaml"
    path.write_text(f"seeds: [0]\n{top}datasets: {{x: {{recipes: [{QUICKSTART}]}}}}\nmethods: {methods}\n")
    with pytest.raises(SystemExit) as exit_info:
        main(["grid", "--config", str(path), "--dry_run"])
    err = capsys.readouterr().err.strip()
    assert exit_info.value.code == 2 and len(err.splitlines()) == 1
    assert expected in err and str(path) in err


def test_a_data_set_does_not_tune(tmp_path):
    path = tmp_path / "g.yaml"
    path.write_text(
        f"seeds: [0]\ndatasets: {{x: {{recipes: [{QUICKSTART}], tune: {{{LR}: [0.1]}}}}}}\nmethods: {{M: {{}}}}\n"
    )
    with pytest.raises(ValueError, match=r"datasets.x.tune: a method tunes its options, not a data set"):
        load_grid(path)
    assert load_grid(write_grid(tmp_path, top="seeds: [3, 4]\n")).tune_seeds == [3]  # default: the first seed
