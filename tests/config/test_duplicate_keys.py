"""A recipe that gives a key twice is refused (PyYAML would silently keep the last), naming the file, the key
and both lines."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedlit.config.parser import read_recipe
from fedlit.core.errors import ConfigError
from tests.test_cli import QUICK, error_of

QUICKSTART = Path(QUICK[1]).read_text()


def test_two_federation_blocks_are_refused_with_both_lines(tmp_path, capsys):
    recipe = tmp_path / "twice.yaml"
    recipe.write_text(QUICKSTART + "\nfederation:\n  rounds: 1\n")
    first = QUICKSTART.splitlines().index("federation:") + 1
    second = len(QUICKSTART.splitlines()) + 2
    err = error_of(["fit", "--config", str(recipe), "--out_dir", str(tmp_path / "run")], capsys)
    assert err == (
        f"fedlit: error: {recipe}: key 'federation' is given twice (line {first} and line {second}); "
        "YAML would silently keep the last one. Merge the two into one.\n"
    )
    assert not (tmp_path / "run").exists()


def test_a_nested_duplicate_names_its_dotted_key(tmp_path):
    recipe = tmp_path / "nested.yaml"
    recipe.write_text(
        "model:\n  init_args:\n    lr: 0.1\n    lr: 0.2\ncallbacks:\n  - class_path: A\n"
        "    init_args: {patience: 1, patience: 2}\n"
    )
    with pytest.raises(ConfigError, match=r"key 'model.init_args.lr' is given twice \(line 3 and line 4\)"):
        read_recipe(recipe)
    recipe.write_text("callbacks:\n  - class_path: A\n    init_args: {patience: 1, patience: 2}\n")
    with pytest.raises(ConfigError, match=r"key 'callbacks\[0\].init_args.patience' is given twice"):
        read_recipe(recipe)


def test_anchors_aliases_and_merge_keys_still_load(tmp_path):
    recipe = tmp_path / "anchors.yaml"
    recipe.write_text("base: &b {lr: 0.1, momentum: 0.9}\nmodel:\n  <<: *b\n  lr: 0.2\nother: *b\n")
    assert read_recipe(recipe) == {
        "base": {"lr": 0.1, "momentum": 0.9},
        "model": {"lr": 0.2, "momentum": 0.9},
        "other": {"lr": 0.1, "momentum": 0.9},
    }
