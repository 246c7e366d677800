"""Nothing of a run in the bundle ``flwr run`` ships to every node: the ServerApp refuses a run folder inside a Flower
app folder however it was given (run config, recipe, default), before it reaches any node; and the ``.gitignore``
that ``fedlit flower-app`` writes keeps a run folder put there anyway out of the bundle Flower builds."""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

import pytest

pytest.importorskip("flwr.app", reason="flwr is not installed (pip install 'fedlit[flower]'): no Flower deployment")

from flwr.cli.build import build_fab_from_disk  # noqa: E402

from fedlit.cli import run  # noqa: E402
from fedlit.core.errors import ConfigError  # noqa: E402
from fedlit.flower.app import write_app  # noqa: E402
from fedlit.flower.bundle import IGNORE_FILE, check_out_dir, flower_app_holding  # noqa: E402
from fedlit.flower.server import run_server  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "recipes" / "quickstart.yaml"
REFUSED = r"The server's run folder (out-dir) {} is inside the Flower app folder {}: the next `flwr run` of that app"


class NoNodes:
    """A transport the server must never use: the refusal comes before any message."""

    def __getattr__(self, name: str):
        raise AssertionError(f"the server reached the nodes ({name}) before refusing its run folder")


def _app(tmp_path: Path) -> Path:
    return write_app(RECIPE, tmp_path / "app").parent


def _fab(app: Path) -> list[str]:
    with zipfile.ZipFile(io.BytesIO(build_fab_from_disk(app))) as fab:
        return sorted(fab.namelist())


def test_the_nearest_flower_app_folder_above_a_path(tmp_path):
    app = _app(tmp_path)
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "pyproject.toml").write_text('[project]\nname = "not-a-flower-app"\n')
    assert flower_app_holding(app / "a" / "b") == app.resolve()
    assert flower_app_holding(app) == app.resolve()
    assert flower_app_holding(tmp_path / "app-run") is None  # beside it: the default
    assert flower_app_holding(tmp_path / "plain" / "run") is None  # a pyproject.toml without [tool.flwr.app]


@pytest.mark.parametrize("given", ["run config", "relative run config", "recipe", "default"])
def test_the_server_refuses_a_run_folder_inside_the_app_before_any_message(tmp_path, monkeypatch, given):
    app = _app(tmp_path)
    monkeypatch.chdir(app)  # the ServerApp's working folder: relative run folders land in the app folder
    config = {"recipe": RECIPE.read_text(), "out-dir": ""}
    if given == "run config":  # flwr run APP CONNECTION --run-config "out-dir='<app>/run_inside'"
        config["out-dir"], inside = str(app / "run_inside"), app / "run_inside"
    elif given == "relative run config":
        config["out-dir"], inside = "run_inside", app / "run_inside"
    elif given == "recipe":
        config["recipe"] += f"out_dir: {app / 'from_recipe'}\n"
        inside = app / "from_recipe"
    else:  # no out-dir anywhere: fedlit fit's runs/<name>/version_<n> under the working folder
        inside = app / "runs" / "quickstart"
    pattern = REFUSED.format(".*" if given == "default" else inside.resolve(), app.resolve())
    with pytest.raises(ConfigError, match="^" + pattern.replace("(", r"\(").replace(")", r"\)")):
        run_server(NoNodes(), config)
    assert sorted(p.name for p in app.iterdir()) == [IGNORE_FILE, "pyproject.toml"]  # nothing made


def test_a_run_folder_outside_any_app_passes(tmp_path):
    _app(tmp_path)
    check_out_dir(tmp_path / "app-run", "The server's run folder (out-dir)")
    check_out_dir(tmp_path / "elsewhere" / "run", "The server's run folder (out-dir)")


@pytest.mark.long
def test_a_run_folder_put_inside_the_app_anyway_stays_out_of_the_bundle(tmp_path):
    """A real run written into the app folder (by hand, or by a fedlit that did not refuse it): Flower's bundle of the
    app, built as `flwr run` builds it, holds the app's pyproject.toml only."""
    app = _app(tmp_path)
    assert (app / IGNORE_FILE).read_text().splitlines()[-2:] == ["*", "!/pyproject.toml"]
    before = _fab(app)
    run(
        [
            "fit",
            "--config",
            str(RECIPE),
            "--federation.progress_bar",
            "false",
            "--federation.rounds",
            "1",
            "--federation.local_epochs",
            "1",
            "--data.init_args.samples_per_client",
            "30",
            "--out_dir",
            str(app / "run_inside"),
        ]
    )
    written = {p.relative_to(app).as_posix() for p in (app / "run_inside").rglob("*") if p.is_file()}
    assert {"run_inside/results.json", "run_inside/manifest.json", "run_inside/class_counts.json"} <= written
    assert _fab(app) == before == [".info/CONTENT", "pyproject.toml"]
    (app / IGNORE_FILE).unlink()  # without the guard Flower would have shipped the run to every node
    assert {"run_inside/results.json", "run_inside/manifest.json"} <= set(_fab(app))
