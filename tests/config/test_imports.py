"""A recipe's own code: ``imports:`` and ``--import`` make a recipe's custom classes importable without
PYTHONPATH, in ``fit``, ``export``, ``cost``/``--dry_run`` and the Flower app; and the recipe flows down once:
``fit`` and ``cost`` are peers over :mod:`fedlit.config`."""

from __future__ import annotations

import ast
import json
import os
import sys
import textwrap
import warnings
from pathlib import Path

import pytest

from fedlit.cli import main, run
from fedlit.core.errors import ConfigError
from tests.children import run_child

ROOT = Path(__file__).resolve().parents[2]
FEDLIT = Path(sys.executable).parent / "fedlit"

#: A user's strategy: FedAvg whose server learning rate is its own (hand-checkable) hyperparameter.
STRATEGIES = '''
from fedlit.strategies import FedAvg


class MyFedAvg(FedAvg):
    """FedAvg with a tag of its own, shown in its repr."""

    def __init__(self, tag: str = "mine", **kwargs):
        super().__init__(**kwargs)
        self.tag = tag

    def __repr__(self):
        return f"MyFedAvg(tag={self.tag!r})"
'''


def recipe_text(strategy: str, imports: str | None = None) -> str:
    """A tiny quickstart: 2 clients x 12 samples of 8x8 images, 1 round of 1 local step."""
    head = f"imports: {imports}\n" if imports is not None else ""
    return head + textwrap.dedent(f"""\
        model:
          class_path: fedlit.tasks.ClassificationModule
          init_args:
            backbone: {{class_path: fedlit.models.SmallCNN, init_args: {{in_channels: 1, width: 4, depth: 1}}}}
            num_classes: 2
            roles: [{{pattern: "backbone.*", role: shared}}]
        data:
          class_path: fedlit.data.SyntheticImages
          init_args: {{num_clients: 2, samples_per_client: 12, num_classes: 2, image_size: 8, seed: 0, batch_size: 8}}
        strategy:
          {strategy}
        federation: {{rounds: 1, local_steps: 1, seed: 0, threads: 1, progress_bar: false}}
        """)


@pytest.fixture
def isolated(monkeypatch):
    """``sys.path`` as it was, after a test that imports a user's code in-process. The imported modules stay in
    ``sys.modules``, as a test module's own classes do: their classes stay subclasses of Strategy, which
    jsonargparse imports again by module name when it lists the subclasses."""
    monkeypatch.setattr(sys, "path", list(sys.path))


def test_fit_and_export_through_the_cli_without_pythonpath(tmp_path):
    """The subprocess has no PYTHONPATH and runs from another folder: only the recipe's `imports` finds the file."""
    folder, elsewhere = tmp_path / "recipes", tmp_path / "elsewhere"
    folder.mkdir()
    elsewhere.mkdir()
    (folder / "my_strategies.py").write_text(STRATEGIES)
    recipe = folder / "mine.yaml"
    recipe.write_text(recipe_text("{class_path: my_strategies.MyFedAvg, init_args: {tag: hand}}", "[my_strategies.py]"))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = tmp_path / "run"
    fit = run_child([str(FEDLIT), "fit", "--config", str(recipe), "--out_dir", str(out)], cwd=elsewhere, env=env)
    assert fit.returncode == 0, fit.stderr[-3000:]
    config = json.loads((out / "config.json").read_text())
    assert config["strategy"]["class_path"] == "my_strategies.MyFedAvg"
    assert config["imports"] == [str(folder / "my_strategies.py")]  # recorded by absolute path
    assert json.loads((out / "results.json").read_text())["last"]["round"] == 1
    export = run_child([str(FEDLIT), "export", "--run", str(out)], cwd=elsewhere, env=env)
    assert export.returncode == 0, export.stderr[-3000:]
    for client in ("site_0", "site_1"):
        meta = json.loads((out / "export" / client / "export.json").read_text())
        assert meta["strategy"] == "MyFedAvg(tag='hand')" and meta["round"] == 1


def test_the_import_option_works_as_the_recipes_imports(tmp_path, monkeypatch, isolated):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "user_cli_strategies.py").write_text(STRATEGIES)
    recipe = tmp_path / "plain.yaml"
    recipe.write_text(recipe_text("{class_path: user_cli_strategies.MyFedAvg, init_args: {tag: option}}"))
    out = tmp_path / "run"
    results = run(["fit", "--config", str(recipe), "--out_dir", str(out), "--import", "user_cli_strategies.py"])
    assert results["last"]["round"] == 1
    assert json.loads((out / "config.json").read_text())["imports"] == [str(tmp_path / "user_cli_strategies.py")]
    written = run(["export", "--run", str(out), "--import", "user_cli_strategies.py"])
    assert sorted(written) == ["site_0", "site_1"]
    assert json.loads((out / "export" / "site_0" / "export.json").read_text())["strategy"] == ("MyFedAvg(tag='option')")


def test_a_module_of_a_package_beside_the_recipe(tmp_path, isolated):
    package = tmp_path / "my_package"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "strategies.py").write_text(STRATEGIES)
    recipe = tmp_path / "pkg.yaml"
    recipe.write_text(recipe_text("{class_path: my_package.strategies.MyFedAvg}", "[my_package.strategies]"))
    report = run(["cost", "--config", str(recipe), "--format", "json"])
    assert report["strategies"][0]["strategy"] == "MyFedAvg(tag='mine')"


@pytest.mark.parametrize(
    ("imports", "option", "expected"),
    [
        (
            "[missing.py]",
            [],
            "imports of {recipe}: 'missing.py': no such file ({folder}/missing.py; a relative path is "
            "read from the recipe's folder",
        ),
        (
            "[my_nowhere.strategies]",
            [],
            "imports of {recipe}: 'my_nowhere.strategies': no module named 'my_nowhere', "
            "neither installed nor in the recipe's folder ({folder})",
        ),
        (
            "my_strategies.py",
            [],
            "imports of {recipe}: expected a list of module names or .py files, got "
            "'my_strategies.py'. Write it as `imports: [my_strategies.py]`",
        ),
        (
            None,
            ["--import", "absent.py"],
            "--import: 'absent.py': no such file ({cwd}/absent.py; a relative path is read from the current folder",
        ),
    ],
)
def test_a_bad_entry_is_refused_with_the_entry_the_place_and_the_fix(
    imports, option, expected, tmp_path, capsys, isolated
):
    folder = tmp_path / "recipes"
    folder.mkdir()
    recipe = folder / "bad.yaml"
    recipe.write_text(recipe_text("{class_path: FedAvg}", imports))
    with pytest.raises(SystemExit) as info:
        main(["fit", "--config", str(recipe), "--out_dir", str(tmp_path / "run"), *option])
    err = capsys.readouterr().err
    assert info.value.code == 2
    assert expected.format(recipe=recipe, folder=folder.resolve(), cwd=Path.cwd()) in err
    assert not (tmp_path / "run").exists()


def test_a_class_path_of_code_not_imported_says_how_to_import_it(tmp_path, capsys):
    recipe = tmp_path / "r.yaml"
    recipe.write_text(recipe_text("{class_path: my_unlisted.MyFedAvg}"))
    with pytest.raises(SystemExit):
        main(["fit", "--config", str(recipe), "--out_dir", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert "no module named 'my_unlisted'" in err and "`imports: [my_unlisted.py]`" in err and "--import" in err


def test_the_flower_app_ships_the_recipes_code_to_its_nodes(tmp_path, monkeypatch, isolated):
    pytest.importorskip("flwr.app", reason="flwr is not installed: no Flower deployment")
    import tomli

    from fedlit.flower.client import node_run
    from fedlit.flower.inprocess import InProcessTransport
    from fedlit.flower.server import run_server

    (tmp_path / "my_flower_strategies.py").write_text(STRATEGIES)
    recipe = tmp_path / "app.yaml"
    recipe.write_text(
        recipe_text("{class_path: my_flower_strategies.MyFedAvg, init_args: {tag: node}}", "[my_flower_strategies.py]")
    )
    path = run(["flower-app", "--config", str(recipe), "--out", str(tmp_path / "app")])
    config = tomli.loads(path.read_text())["tool"]["flwr"]["app"]["config"]
    assert json.loads(config["imports"]) == {"files": {"my_flower_strategies.py": STRATEGIES}, "import": []}
    # a node elsewhere, where the module is not importable: rebuilt from the run config alone
    node = tmp_path / "node"
    node.mkdir()
    monkeypatch.chdir(node)
    del sys.modules["my_flower_strategies"]
    sys.path[:] = [p for p in sys.path if p != str(tmp_path.resolve())]
    built = node_run(config, {"client-id": "site_0"}, node / "work" / "run")
    assert repr(built.strategy) == "MyFedAvg(tag='node')"
    assert Path(sys.modules["my_flower_strategies"].__file__).parent == node / "work" / "recipe"
    # the server and its nodes, in-process: each writes the code beside its copy of the recipe
    config = {**config, "out-dir": str(tmp_path / "server"), "connect-timeout": 5}
    transport = InProcessTransport(
        {c: (lambda c=c: node_run(config, {"client-id": c}, node / c / "run")) for c in ("site_0", "site_1")}
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        results = run_server(transport, config)
    assert set(results["last"]["clients"]) == {"site_0", "site_1"} and results["last"]["round"] == 1
    recorded = json.loads((tmp_path / "server" / "config.json").read_text())
    assert recorded["strategy"]["class_path"] == "my_flower_strategies.MyFedAvg"
    assert recorded["strategy"]["init_args"]["tag"] == "node"


def test_an_unsafe_shipped_file_name_is_refused(tmp_path):
    from fedlit.config.imports import unship

    with pytest.raises(ConfigError, match="'../evil.py', which is not a relative .py path"):
        unship(json.dumps({"files": {"../evil.py": "x = 1"}, "import": []}), tmp_path / "code")
    assert not (tmp_path / "evil.py").exists()


# ------------------------------------------------------------------------------------------- the flow
def _fedlit_imports(path: Path) -> set[str]:
    """The fedlit modules a file imports (at the top or inside functions)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("fedlit"):
            found |= {node.module, *(f"{node.module}.{alias.name}" for alias in node.names)}
        elif isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name.startswith("fedlit")}
    return found


def test_fit_and_cost_are_peers_over_the_config_layer():
    commands = ROOT / "fedlit" / "commands"
    assert "fedlit.commands.cost" not in _fedlit_imports(commands / "fit.py")
    assert "fedlit.commands.fit" not in _fedlit_imports(commands / "cost.py")
    for module in ("parser", "resolve", "build", "costing", "imports"):  # the config layer never calls up
        assert not {
            m
            for m in _fedlit_imports(ROOT / "fedlit" / "config" / f"{module}.py")
            if m.startswith(("fedlit.commands", "fedlit.cli", "fedlit.flower"))
        }, module


def test_fit_dry_run_prints_the_estimate_of_the_cost_command(capsys):
    recipe = ["--config", str(ROOT / "recipes" / "quickstart.yaml")]
    dry = run(["fit", *recipe, "--dry_run"])
    cost = run(["cost", *recipe])
    assert dry == cost
    # quickstart: 4 clients, 10 rounds, all evaluated; FedBN keeps BatchNorm personal
    assert (dry["clients"]["total"], dry["rounds"], dry["evaluated_rounds"]) == (4, 10, 10)
    printed = capsys.readouterr().out
    assert "fedlit fit --dry_run (nothing trained, no data read)" in printed
    assert "fedlit cost (nothing trained, no data read)" in printed
