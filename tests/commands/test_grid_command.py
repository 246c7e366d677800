"""``fedlit grid``: every method on every data set over the seeds, resumable seed by seed, a failing cell reported
and skipped; and ``fedlit report`` of its folder: the data sets x methods table (FHBench's Table 2 layout)."""

from __future__ import annotations

import json
import math
import shutil
import statistics
from pathlib import Path

import pytest

from fedlit.cli import main
from fedlit.commands import grid as grid_command
from fedlit.commands import grid_tune
from fedlit.commands.fit import build_parser
from fedlit.commands.grid import load_grid
from fedlit.commands.seeds import split_seeds

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "recipes" / "quickstart.yaml"
TINY = "--federation.progress_bar false --data.init_args.samples_per_client 20 --federation.local_epochs 1"


def write_grid(folder: Path, methods: str, datasets: str | None = None, seeds: str = "[0, 1]") -> Path:
    datasets = datasets or (
        f"  a: {{recipes: [{QUICKSTART}]}}\n"
        f"  b: {{recipes: [{QUICKSTART}], overrides: --data.init_args.num_clients 3}}\n"
    )
    path = folder / "grid.yaml"
    path.write_text(
        f"seeds: {seeds}\nout_dir: {folder / 'out'}\noverrides: {TINY} --federation.rounds 2\n"
        f"datasets:\n{datasets}methods:\n{methods}"
    )
    return path


METHODS = "  FedAvg: {overrides: --strategy FedAvg}\n  Local: {overrides: [--strategy, Local]}\n"


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """A 2 data sets x 2 methods x 2 seeds grid, run once in this process."""
    folder = tmp_path_factory.mktemp("grid")
    main(["grid", "--config", str(write_grid(folder, METHODS)), "--in_process"])
    return folder / "out"


def best_mean(run: Path) -> float:
    """The clients' mean test accuracy at the best-validation round, read from the run's results.json."""
    clients = json.loads((run / "results.json").read_text())["best"]["clients"]
    return sum(v["accuracy"] for v in clients.values()) / len(clients)


@pytest.mark.long
def test_layout_one_experiment_per_cell_and_the_grid_record(finished):
    assert sorted(p.name for p in finished.iterdir()) == ["a", "b", "grid.json"]
    for dataset, clients in (("a", 4), ("b", 3)):
        for method in ("FedAvg", "Local"):
            cell = finished / dataset / method
            assert sorted(p.name for p in cell.iterdir()) == ["experiment.json", "seed_0", "seed_1"]
            assert json.loads((cell / "experiment.json").read_text())["finished"] == [0, 1]
            for seed in (0, 1):
                results = json.loads((cell / f"seed_{seed}" / "results.json").read_text())
                assert results["seed"] == seed and results["strategy_class"].endswith(method)
                assert len(results["best"]["clients"]) == clients
    record = json.loads((finished / "grid.json").read_text())
    assert record["datasets"] == ["a", "b"] and record["methods"] == ["FedAvg", "Local"] and record["seeds"] == [0, 1]
    cell = record["cells"]["b/Local"]
    assert cell["status"] == "finished" and cell["folder"] == "b/Local" and cell["wall_s"] >= 0
    assert cell["command"][-2:] == ["--out_dir", str(finished / "b" / "Local")]
    assert "--data.init_args.num_clients 3 --strategy Local --seeds 0 1" in " ".join(cell["command"])


def test_the_report_table_holds_the_mean_and_se_over_seeds_best_in_bold(finished, tmp_path, capsys):
    main(["report", str(finished), "--out", str(tmp_path / "report"), "--vector", "none"])
    printed = capsys.readouterr().out
    text = (tmp_path / "report" / "report.md").read_text()
    assert text.index("## Table: test accuracy at the best-validation round") < text.index("## Per-client test")
    assert "| data set | FedAvg | Local |" in text
    for dataset in ("a", "b"):
        cells = {}
        for method in ("FedAvg", "Local"):
            values = [best_mean(finished / dataset / method / f"seed_{s}") for s in (0, 1)]
            cells[method] = (statistics.mean(values), statistics.stdev(values) / math.sqrt(2))
        best = max(cells, key=lambda m: round(cells[m][0], 4))
        shown = [f"{m:.4f} ± {se:.4f}" for m, se in cells.values()]
        shown = [f"**{s}**" if method == best else s for s, method in zip(shown, cells, strict=True)]
        assert f"| {dataset} | {shown[0]} | {shown[1]} |" in text
        assert any(line.split()[:1] == [dataset] and shown[0] in line for line in printed.splitlines())
    assert "a/FedAvg" in text  # the per-method detail stays below, methods named data set/method
    assert "Not paired" not in text  # each data set's FedAvg is paired with the Local run of its own data


def test_a_second_invocation_runs_nothing_and_a_deleted_seed_alone_is_rerun(finished, tmp_path, capsys, monkeypatch):
    out = tmp_path / "out"
    shutil.copytree(finished, out)
    config = str(write_grid(tmp_path, METHODS))
    started: list[str] = []
    run_cell = grid_command._run_cell
    monkeypatch.setattr(
        grid_command, "_run_cell", lambda argv, in_process: started.append(argv) or run_cell(argv, in_process)
    )
    main(["grid", "--config", config, "--in_process"])
    assert started == [] and capsys.readouterr().out.count("finished before, skipped") == 4

    kept = out / "a" / "FedAvg" / "seed_0" / "results.json"
    before = kept.stat().st_mtime_ns, best_mean(out / "a" / "FedAvg" / "seed_1")
    shutil.rmtree(out / "a" / "FedAvg" / "seed_1")
    stopped = out / "b" / "Local" / "seed_0"  # a run stopped after its last checkpoint: resumed from it
    (stopped / "results.json").unlink()
    (stopped / "results.md").unlink()
    main(["grid", "--config", config, "--in_process"])
    assert [a[a.index("--out_dir") + 1] for a in started] == [str(out / "a" / "FedAvg"), str(out / "b" / "Local")]
    assert all(a[-2:] == ["--ckpt_path", "last"] for a in started)
    printed = capsys.readouterr().out
    assert "seed 0 finished before" in printed and "seed 1 finished before" in printed
    assert kept.stat().st_mtime_ns == before[0]
    assert best_mean(out / "a" / "FedAvg" / "seed_1") == before[1]  # the same seed gives the same run again
    assert (stopped / "results.json").is_file()
    assert json.loads((out / "a" / "FedAvg" / "experiment.json").read_text())["finished"] == [0, 1]


@pytest.mark.long
def test_a_failing_cell_is_reported_the_others_run_and_the_exit_code_is_not_zero(tmp_path, capsys):
    methods = "  Broken: {overrides: --strategy NoSuchStrategy}\n  FedAvg: {overrides: --strategy FedAvg}\n"
    config = write_grid(tmp_path, methods, datasets=f"  a: {{recipes: [{QUICKSTART}]}}\n", seeds="[0]")
    with pytest.raises(SystemExit) as exit_info:
        main(["grid", "--config", str(config), "--in_process"])
    assert exit_info.value.code == 1
    assert (tmp_path / "out" / "a" / "FedAvg" / "seed_0" / "results.json").is_file()
    assert not (tmp_path / "out" / "a" / "Broken" / "seed_0" / "results.json").exists()
    cells = json.loads((tmp_path / "out" / "grid.json").read_text())["cells"]
    assert cells["a/Broken"]["status"] == "failed" and cells["a/FedAvg"]["status"] == "finished"
    out = capsys.readouterr().out
    assert "a/Broken: FAILED (strategy.class_path='NoSuchStrategy'" in out
    assert "1/2 cells finished" in out and "failed: a/Broken" in out

    # the default: each cell in its own process (here the failing one only; a process start imports torch)
    with pytest.raises(SystemExit) as exit_info:
        main(["grid", "--config", str(config), "--only", "a/Broken"])
    assert exit_info.value.code == 1
    assert json.loads((tmp_path / "out" / "grid.json").read_text())["cells"]["a/Broken"]["status"] == "failed"
    assert "a/Broken: FAILED (exit code 2" in capsys.readouterr().out


def test_dry_run_prints_the_commands_and_writes_nothing(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the recipe lies outside it: shown as an absolute path
    config = write_grid(tmp_path, METHODS)
    main(["grid", "--config", str(config), "--dry_run", "--only", "b/*"])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("fedlit grid: 2 cells (2 data sets x 2 methods, 2 selected)")
    assert [line.split("--out_dir ")[1] for line in lines[1:]] == [f"out/b/{m}" for m in ("FedAvg", "Local")]
    assert lines[1].startswith(f"fedlit fit --config {QUICKSTART} ") and "--seeds 0 1" in lines[1]
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("method", "unknown key 'method' (did you mean 'methods'?)"),
        ("datasets-missing", "datasets.x.recipes: nope.yaml not found"),
        ("entry-key", "methods.M: unknown key 'override' (did you mean 'overrides'?)"),
        ("seed-override", "methods.M.overrides: --seeds is set by the grid"),
        ("seeds", "seeds: [0, 0]; give distinct integers"),
        ("only", "--only z/*: no cell"),
    ],
)
def test_a_bad_grid_file_is_one_line_naming_the_file_and_key(text, expected, tmp_path, capsys):
    base = {
        "seeds": "[0, 0]" if text == "seeds" else "[0]",
        "datasets": (
            "{x: {recipes: [nope.yaml]}}" if text == "datasets-missing" else f"{{x: {{recipes: [{QUICKSTART}]}}}}"
        ),
        "method" if text == "method" else "methods": (
            "{M: {override: --strategy FedAvg}}"
            if text == "entry-key"
            else "{M: {overrides: --strategy FedAvg --seeds 3}}"
            if text == "seed-override"
            else "{M: {overrides: --strategy FedAvg}}"
        ),
    }
    path = tmp_path / "g.yaml"
    path.write_text("".join(f"{k}: {v}\n" for k, v in base.items()))
    with pytest.raises(SystemExit) as exit_info:
        main(["grid", "--config", str(path), "--dry_run", *(["--only", "z/*"] if text == "only" else [])])
    err = capsys.readouterr().err.strip()
    assert exit_info.value.code == 2 and len(err.splitlines()) == 1
    assert expected in err and (str(path) in err or text == "only")


def test_report_table_grid_needs_a_grid_folder(tmp_path, capsys):
    (tmp_path / "runs").mkdir()
    with pytest.raises(SystemExit):
        main(["report", str(tmp_path / "runs"), "--table", "grid"])
    assert "--table grid: give one output folder of `fedlit grid`" in capsys.readouterr().err


@pytest.mark.parametrize("path", sorted((ROOT / "recipes" / "grids").glob("*.yaml")), ids=lambda p: p.name)
@pytest.mark.long
def test_shipped_grids_name_existing_recipes_and_each_cell_parses(path, monkeypatch):
    monkeypatch.chdir(ROOT)
    grid = load_grid(path)
    assert path.read_text().startswith("# ") and f"# Run: fedlit grid --config recipes/grids/{path.name}" in (
        path.read_text()
    )
    for dataset, method in grid.cells():
        seeds, argv = split_seeds(grid.argv(dataset, method))
        cfg = build_parser().parse_args(argv).fit
        assert seeds == grid.seeds and cfg.strategy.class_path.split(".")[-1] == method
        for _, options in grid_tune.points(grid.methods[method].tune):  # each tuning point parses, its values set
            extra = grid_tune.words(options)
            tuned = build_parser().parse_args(split_seeds(grid.argv(dataset, method, extra=extra))[1]).fit
            for option, value in options.items():
                assert tuned[option[2:]] == value, (method, option)


@pytest.mark.long
def test_the_modalities_grid_has_fhbench_columns_on_lora_backbones_over_offline_data(monkeypatch):
    monkeypatch.chdir(ROOT)
    grid = load_grid(ROOT / "recipes" / "grids" / "fhbench_cpu_modalities.yaml")
    assert grid.seeds == [0, 1, 2]
    cells = list(grid.cells())
    assert sorted({d for d, _ in cells}) == [
        "medical_abstracts",
        "pneumoniamnist",
        "signals_generated",
        "sounds_generated",
    ]
    assert [m for d, m in cells if d == "pneumoniamnist"] == [
        "FedAvg",
        "FedProx",
        "SCAFFOLD",
        "APFL",
        "FedALA",
        "APPLE",
        "EPFL",
    ]
    for dataset, method in cells:
        cfg = build_parser().parse_args(split_seeds(grid.argv(dataset, method))[1]).fit
        assert cfg.model.init_args.backbone.init_args.lora.r == 8  # EPFL's column needs LoRA in every row
        assert (cfg.federation.rounds, cfg.federation.local_steps) == (3, 5)
        # data that ships offline: the shared folder (read from the repository root) and packaged weights, or
        # signals generated in code
        data = cfg.data.init_args
        if dataset.endswith("_generated"):
            assert cfg.data.class_path == "fedlit.data.SyntheticSignals"
            continue
        assert str(data.get("path") or data.get("root")).startswith("../shared/data/")
