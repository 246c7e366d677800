"""``fedlit recipes``: the recipes ship with the package (package data) and copy out to run from any folder."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from fedlit.cli import main
from fedlit.commands.recipes import description, recipes_folder, shipped

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


def test_a_description_is_the_header_comment_first_sentence_without_paper_titles():
    text = (
        '# FedAvg (McMahan et al., "Communication-Efficient Learning", AISTATS 2017) on toy\n'
        "# data of T. Dinh. More text.\n# Run: fedlit fit --config x.yaml\nmodel: 1\n"
    )
    assert description(text) == "FedAvg (McMahan et al., AISTATS 2017) on toy data of T. Dinh."
    assert description("# one two three four five.\n", width=12) == "one two..."
    assert description("# A first line\n#\n# after a blank comment line.\n") == "A first line"
    assert description("model: 1\n# a comment later\n") == ""


def test_the_listing_gives_each_recipe_its_description(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "300")
    main(["recipes"])
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == shipped()
    quickstart = next(line for line in lines if line.startswith("quickstart.yaml "))
    assert quickstart.split(None, 1)[1] == (
        "Quickstart: FedBN (Li et al., ICLR 2021) on a synthetic heterogeneous medical-like image set that fedlit "
        "generates itself: 4 sites that differ in intensity, contrast, noise, blur and label mix."
    )
    assert all(len(line.split(None, 1)) == 2 for line in lines)  # every shipped recipe has a header comment


def test_the_tcga_recipe_gives_flambys_fedavg_learning_rate_as_a_command(monkeypatch):
    import shlex

    from fedlit.commands.fit import parser
    from fedlit.config.parser import load

    header = (ROOT / "recipes" / "survival_site_table.yaml").read_text().split("\nmodel:")[0]
    assert "lr 0.01" in header and "eta) 0.1" in header  # FedAdam's settings
    text = " ".join(line.lstrip("# ") for line in header.splitlines())
    command = re.search(r"fedlit fit --config \S+ --strategy FedAvg [^\n]*?--model.init_args.lr \S+", text)
    assert command is not None
    monkeypatch.chdir(ROOT)
    options = load(shlex.split(command.group(0))[1:], parser("fit")).options
    assert options.strategy.class_path.endswith(".FedAvg") and options.model.init_args.lr == 0.1
