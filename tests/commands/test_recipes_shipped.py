"""``fedlit recipes``: the recipes ship with the package (package data) and copy out to run from any folder."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedlit.cli import main
from fedlit.commands.recipes import recipes_folder, shipped

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]


def test_every_recipe_of_the_checkout_ships():
    expected = sorted(p.relative_to(ROOT / "recipes").as_posix() for p in (ROOT / "recipes").rglob("*.yaml"))
    assert shipped() == expected and "quickstart.yaml" in expected
    patterns = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["fedlit"]
    in_wheel = sorted(
        {
            p.relative_to(ROOT / "fedlit" / "recipes").as_posix()
            for pattern in patterns
            for p in (ROOT / "fedlit").glob(pattern)
        }
    )
    assert in_wheel == expected  # what setuptools puts in the wheel (fedlit/recipes links to recipes/)
    assert recipes_folder().resolve() == (ROOT / "recipes").resolve()


def test_copy_then_rerun_keeps_and_refuses(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    main(["recipes", "quickstart", "flamby_heart"])
    written = capsys.readouterr().out.split()
    assert written[0] == "recipes/quickstart.yaml" and len(written) == 1 + len(
        list((ROOT / "recipes" / "flamby_heart").glob("*.yaml"))
    )
    assert (tmp_path / "recipes" / "quickstart.yaml").read_text() == (ROOT / "recipes" / "quickstart.yaml").read_text()
    main(["recipes", "quickstart.yaml"])  # the same content again: fine
    (tmp_path / "recipes" / "quickstart.yaml").write_text("# edited\n")
    with pytest.raises(SystemExit):
        main(["recipes", "quickstart.yaml"])
    assert "recipes/quickstart.yaml exist with other content" in capsys.readouterr().err
    assert (tmp_path / "recipes" / "quickstart.yaml").read_text() == "# edited\n"
    with pytest.raises(SystemExit):
        main(["recipes", "quikstart"])
    assert "Did you mean quickstart.yaml?" in capsys.readouterr().err
