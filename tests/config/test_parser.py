"""The recipe parser's own checks: a section that names no class says which ``class_path`` is missing (rather than
building the abstract base class)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.test_cli import QUICK, error_of

QUICKSTART = yaml.safe_load(Path(QUICK[1]).read_text())


@pytest.mark.parametrize(
    ("sections", "missing"),
    [
        ({"data": {}}, "data.class_path is"),
        ({"data": {"init_args": {"num_clients": 4}}}, "data.class_path is"),
        ({"data": None, "model": {"init_args": {"lr": 0.1}}}, "model.class_path and data.class_path are"),
    ],
)
def test_a_section_without_its_class_path_names_the_key(tmp_path, capsys, sections, missing):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump({**QUICKSTART, **sections}))
    err = error_of(["fit", "--config", str(recipe), "--out_dir", str(tmp_path / "run")], capsys)
    assert err == (
        f"fedlit: error: {missing} missing: the model, data and strategy sections each name their class, as in "
        "`data: {class_path: fedlit.data.SiteFolders, init_args: {...}}` (`fedlit recipes` lists recipes to start "
        "from).\n"
    )
    assert not (tmp_path / "run").exists()


def test_a_later_config_or_option_that_names_the_class_completes_the_section(tmp_path, capsys):
    from fedlit.cli import main

    first, second = tmp_path / "first.yaml", tmp_path / "second.yaml"
    first.write_text(yaml.safe_dump({**QUICKSTART, "data": {}}))
    second.write_text(yaml.safe_dump({"data": QUICKSTART["data"]}))
    main(["fit", "--config", str(first), "--config", str(second), "--dry_run"])  # the estimate: the recipe is whole
    main(["fit", "--config", str(first), "--data=fedlit.data.SyntheticImages", "--dry_run"])
    assert "class_path" not in capsys.readouterr().err


def test_fit_help_lists_only_the_callbacks_the_loop_accepts(capsys):
    from fedlit.cli import main

    with pytest.raises(SystemExit):
        main(["fit", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    listed = out.split("--callbacks CALLBACKS, --callbacks+ CALLBACKS", 1)[1].split("--out_dir OUT_DIR", 1)[0]
    listed = listed.replace(" ", "")  # help wraps long class paths
    assert "accepted:fedlit.callbacks.EarlyStopping," in listed
    assert "lightning.pytorch.callbacks" not in listed and "knownsubclasses" not in listed
    assert "fedlit.FedAvg" not in listed  # a strategy goes under strategy:
