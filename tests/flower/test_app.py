"""``fedlit flower-app`` writes an app folder Flower accepts, with the recipe in its run config; the certificates
script makes a SuperLink certificate that verifies against its CA for the hosts asked."""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

import pytest

pytest.importorskip("flwr.app", reason="flwr is not installed (pip install 'fedlit[flower]'): no Flower deployment")

from flwr.common.config import validate_config  # noqa: E402

from fedlit.cli import run  # noqa: E402
from fedlit.core.errors import ConfigError  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "recipes" / "quickstart.yaml"


def test_flower_app_writes_a_valid_app_with_the_recipe(tmp_path):
    run(
        [
            "flower-app",
            "--config",
            str(RECIPE),
            "--out",
            str(tmp_path / "app"),
            "--overrides",
            "--federation.rounds 2",
            "--client_ids",
            "site_0,site_1",
            "--client_timeout",
            "60",
        ]
    )
    import tomli  # a dependency of flwr (tomllib is Python 3.11+)

    config = tomli.loads((tmp_path / "app" / "pyproject.toml").read_text())
    valid, errors, _ = validate_config(config, check_module=True, project_dir=tmp_path / "app")
    assert valid, errors
    app = config["tool"]["flwr"]["app"]
    assert app["components"] == {"serverapp": "fedlit.flower.server:app", "clientapp": "fedlit.flower.clientapp:app"}
    run_config = app["config"]
    assert run_config["recipe"] == RECIPE.read_text()
    assert run_config["overrides"] == "--federation.rounds 2"
    assert run_config["out-dir"] == str((tmp_path / "app-run").resolve())  # beside the app folder
    assert (run_config["client-ids"], run_config["client-timeout"], run_config["secure-aggregation"]) == (
        "site_0,site_1",
        60.0,
        False,
    )
    assert config["project"]["dependencies"] == ["flwr>=1.40,<1.43"]


def test_flower_app_refuses_a_misspelled_override(tmp_path):
    with pytest.raises(ConfigError, match="federation.roundz is not an option. Did you mean .rounds.?"):
        run(
            [
                "flower-app",
                "--config",
                str(RECIPE),
                "--out",
                str(tmp_path / "app"),
                "--overrides",
                "--federation.roundz 2",
            ]
        )
    assert not (tmp_path / "app").exists()


def test_the_run_folder_stays_out_of_the_bundle_flower_ships_to_the_nodes(tmp_path):
    """Flower bundles the app folder's *.json, *.md, ... into every `flwr run`: the server's run must not be in it."""
    import tomli
    from flwr.cli.build import build_fab_from_disk

    app = tmp_path / "app"
    run(["flower-app", "--config", str(RECIPE), "--out", str(app)])
    out_dir = Path(tomli.loads((app / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"]["out-dir"])
    # what the ServerApp runs: `fedlit fit` of the recipe into the run config's out-dir
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
            str(out_dir),
        ]
    )
    outputs = {"results.json", "results.md", "manifest.json", "class_counts.json", "metrics.csv", "config.json"}
    assert outputs <= {p.name for p in out_dir.iterdir()} and any(out_dir.rglob("*.ckpt"))
    with zipfile.ZipFile(io.BytesIO(build_fab_from_disk(app))) as fab:
        shipped = fab.namelist()
    assert "pyproject.toml" in shipped
    assert not [name for name in shipped if Path(name).name in outputs or name.endswith(".ckpt")], shipped


@pytest.mark.parametrize("inside", ["app", "app/run", "app/a/b"])
def test_a_run_folder_inside_the_app_folder_is_refused(tmp_path, inside):
    with pytest.raises(
        ConfigError,
        match=r"^--out_dir .* is inside the app folder .*: Flower ships the app folder's "
        r"files .* to every node on each `flwr run`; put the run folder outside it, "
        r"e.g. the default .*app-run\.$",
    ):
        run(
            ["flower-app", "--config", str(RECIPE), "--out", str(tmp_path / "app"), "--out_dir", str(tmp_path / inside)]
        )
    assert not (tmp_path / "app").exists()
