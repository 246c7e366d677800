"""Checks before jsonargparse: negative floats after their option, and top-level keys that are no option (a YAML
anchor kept under a key of its own)."""

from __future__ import annotations

from pathlib import Path

from fedlit.config.recipe_checks import join_negative_values, top_level_anchors
from tests.test_cli import QUICK, error_of

QUICKSTART = Path(QUICK[1]).read_text()


def test_negative_floats_that_argparse_takes_for_options_are_joined_to_their_option():
    argv = ["fit", "--a", "-1e-3", "--b", "-1", "--c", "-inf", "--d=-2", "-nan", "--e", "-.5", "--f", "-x"]
    argv += ["--g", "-NaN"]
    assert join_negative_values(argv) == [
        "fit",
        "--a=-1e-3",
        "--b",
        "-1",  # argparse reads -1 and -.5 as values already
        "--c=-inf",
        "--d=-2",
        "-nan",  # its option already has its value
        "--e",
        "-.5",
        "--f",
        "-x",  # not a number: an option of its own, as argparse says
        "--g=-NaN",
    ]


def test_top_level_anchors_are_found_on_mappings_sequences_and_scalars():
    text = "base: &b {a: 1}\n.common: &c [1, 2]\nplain: &s 3\nmodel:\n  x: *b\n  y: &inner 4\nlast: *s\n"
    assert top_level_anchors(text) == {"base": "b", ".common": "c", "plain": "s"}


def test_a_negative_value_on_the_command_line_reaches_its_option(capsys, tmp_path):
    err = error_of(["fit", *QUICK, "--out_dir", str(tmp_path), "--model.init_args.momentum", "-1e-3"], capsys)
    assert err == "fedlit: error: model.init_args.momentum=-0.001 must be in [0, 1).\n"


def test_a_top_level_anchor_key_says_where_to_put_the_anchor(capsys, tmp_path):
    recipe = tmp_path / "anchored.yaml"
    recipe.write_text(
        ".common: &cnn {in_channels: 1, width: 16, depth: 2}\n"
        + QUICKSTART.replace("init_args: {in_channels: 1, width: 16, depth: 2}", "init_args: *cnn")
    )
    err = error_of(["fit", "--config", str(recipe), "--out_dir", str(tmp_path / "run")], capsys)
    assert err.startswith(f"fedlit: error: {recipe}: top-level key '.common' is not a fedlit section. The top-level")
    assert "'.common' holds the YAML anchor &cnn: put the anchor where the value is first used" in err
    assert "--config common.yaml --config this.yaml" in err
    assert "Did you mean" not in err and err.count("\n") == 1
    assert not (tmp_path / "run").exists()


def test_a_misspelled_section_is_refused_with_the_closest_one(capsys, tmp_path):
    recipe = tmp_path / "typo.yaml"
    recipe.write_text(QUICKSTART.replace("federation:", "federaton:"))
    err = error_of(["fit", "--config", str(recipe), "--out_dir", str(tmp_path / "run")], capsys)
    assert err.startswith(f"fedlit: error: {recipe}: top-level key 'federaton' is not a fedlit section. Did you mean ")
    assert "'federation'?" in err and "anchor" not in err
