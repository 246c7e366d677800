"""Parser errors explained in one line: non-finite learning rates, YAML booleans where names are meant, and
misspelled nested class paths with the closest class of the kind the option takes."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.test_cli import QUICK, error_of

QUICKSTART = Path(QUICK[1]).read_text()
OWN = " (or the import path of your own subclass of fedlit.models.backbones.Backbone).\n"


@pytest.mark.parametrize("value", ["-inf", "inf", "nan"])
def test_a_non_finite_learning_rate_on_the_command_line(value, capsys, tmp_path):
    err = error_of(["fit", *QUICK, "--out_dir", str(tmp_path), "--model.init_args.lr", value], capsys)
    assert err == (
        f"fedlit: error: model.init_args.lr={value}: not a finite number: a learning rate must be a finite "
        "number > 0 (e.g. model.init_args.lr=0.01).\n"
    )


@pytest.mark.parametrize("value, shown", [(".inf", "inf"), (".nan", "nan"), ("-.inf", "-inf")])
def test_a_non_finite_learning_rate_in_the_recipe(value, shown, capsys, tmp_path):
    recipe = tmp_path / "lr.yaml"
    recipe.write_text(QUICKSTART.replace("lr: 0.02", f"lr: {value}"))
    err = error_of(["fit", "--config", str(recipe), "--out_dir", str(tmp_path / "run")], capsys)
    assert err == (
        f"fedlit: error: model.init_args.lr={shown} is not a learning rate: it must be a finite number > 0.\n"
    )


def test_class_names_read_as_booleans_say_to_quote_them(capsys, tmp_path):
    recipe = tmp_path / "names.yaml"
    recipe.write_text(
        QUICKSTART.split("data:")[0]
        + f"data:\n  class_path: fedlit.data.SiteFolders\n  init_args: {{root: {tmp_path}, class_names: [no, yes]}}\n"
        + "strategy: FedAvg\n"
    )
    err = error_of(["fit", "--config", str(recipe), "--out_dir", str(tmp_path / "run")], capsys)
    assert err == (
        "fedlit: error: data.init_args.class_names: expected a string, got the boolean False: YAML reads an "
        'unquoted yes, no, on, off, true or false as a boolean. Quote it: ["no", "yes"], not [no, yes].\n'
    )


@pytest.mark.parametrize(
    "given, why, closest",
    [
        ("fedlit.models.SmalCNN", " (module 'fedlit.models' has no attribute 'SmalCNN')", "fedlit.models.SmallCNN"),
        ("SmalCNN", "", "SmallCNN"),
        ("fedlit.modelz.SmallCNN", " (No module named 'fedlit.modelz')", "fedlit.models.backbones.SmallCNN"),
    ],
)
def test_a_misspelled_nested_class_path_names_its_option_and_the_closest_class(given, why, closest, capsys, tmp_path):
    extra = ["--model.init_args.backbone.class_path", given]
    recipe = tmp_path / "typo.yaml"
    recipe.write_text(QUICKSTART.replace("class_path: fedlit.models.SmallCNN", f"class_path: {given}"))
    err = error_of(["fit", "--config", str(recipe), "--out_dir", str(tmp_path / "run")], capsys)
    start = (
        f"fedlit: error: model.init_args.backbone.class_path={given!r} is not a known Backbone{why}. Did you mean "
        f"{closest!r}? Valid names: "
    )
    assert err.startswith(start) and err.endswith(OWN) and err.count("\n") == 1
    names = err[len(start) : -len(OWN)].split(", ")
    assert names == sorted(names) and {"CLIP", "Identity", "MLP", "SmallCNN", "TimmBackbone"} <= set(names)
    assert extra  # the same through the command line:
    assert error_of(["fit", *QUICK, "--out_dir", str(tmp_path / "run"), *extra], capsys) == err


def test_a_misspelled_optimizer_still_lists_the_shorthands(capsys, tmp_path):
    err = error_of(["fit", *QUICK, "--out_dir", str(tmp_path), "--model.init_args.optimizer", "sgdd"], capsys)
    assert "model.init_args.optimizer='sgdd' is not one of the shorthands ['sgd', 'adam', 'adamw']" in err
    assert "Did you mean 'sgd'?" in err
