"""Exceptions raised inside user code keep their traceback: only fedlit's own errors and the parser's become the
one-line ``fedlit: error: ...`` of a configuration mistake."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedlit.cli import main
from fedlit.data import SyntheticImages
from fedlit.models import SmallCNN

ROOT = Path(__file__).resolve().parents[2]
QUICK = [
    "--config",
    str(ROOT / "recipes" / "quickstart.yaml"),
    "--federation.progress_bar",
    "false",
    "--data.init_args.samples_per_client",
    "20",
    "--federation.rounds",
    "1",
    "--federation.local_epochs",
    "1",
]


class TypoInBuild(SyntheticImages):
    """A user's data module whose ``build`` has a typo in a key."""

    def build(self):
        table = {"test": self.num_clients}
        return table["tset"]


class BrokenBackbone(SmallCNN):
    """A user's backbone whose constructor has a bug (built by jsonargparse from the recipe)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        raise TypeError("unsupported operand type(s) for +: 'int' and 'str'")


def test_a_key_error_in_a_data_modules_build_keeps_its_traceback(tmp_path, capsys):
    with pytest.raises(KeyError, match="tset") as info:
        main(
            [
                "fit",
                *QUICK,
                "--out_dir",
                str(tmp_path / "run"),
                "--data",
                f"{__name__}.TypoInBuild",
                "--data.init_args.num_clients",
                "2",
            ]
        )
    assert info.traceback[-1].name == "build" and info.traceback[-1].path == Path(__file__)
    assert "fedlit: error" not in capsys.readouterr().err


def test_a_bug_in_a_constructor_built_from_the_recipe_keeps_its_traceback(tmp_path, capsys):
    with pytest.raises(TypeError, match="unsupported operand") as info:
        main(
            [
                "fit",
                *QUICK,
                "--out_dir",
                str(tmp_path / "run"),
                "--model.init_args.backbone.class_path",
                f"{__name__}.BrokenBackbone",
            ]
        )
    assert info.traceback[-1].name == "__init__" and info.traceback[-1].path == Path(__file__)
    assert "fedlit: error" not in capsys.readouterr().err


def test_fedlits_own_error_in_a_constructor_is_still_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as info:
        main(["fit", *QUICK, "--out_dir", str(tmp_path / "run"), "--model.init_args.num_classes", "1"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("fedlit: error: ") and "model.init_args.num_classes=1" in err and "Traceback" not in err


def test_a_corrupt_run_configuration_is_named_in_one_line(tmp_path, capsys):
    (tmp_path / "config.json").write_text('{"model": {"class_path": 25')  # cut short, as by a full disk
    with pytest.raises(SystemExit) as info:
        main(["test", "--run", str(tmp_path)])
    err = capsys.readouterr().err
    assert info.value.code == 2 and err.startswith(
        f"fedlit: error: --run {tmp_path}: {tmp_path / 'config.json'} is not a readable run configuration"
    )


def test_the_explainer_follows_the_chain_as_python_prints_it():
    from fedlit.config.explain import explain

    try:
        try:
            raise KeyError(25)
        except KeyError:
            raise ValueError("the recipe's problem") from None
    except ValueError as err:
        assert explain(err) == "the recipe's problem"
