"""The lazy names of ``fedlit.models``: each one resolves to the object defined in the submodule it names."""

from __future__ import annotations

import importlib
import sys

import pytest

import fedlit.models
from tests.children import run_child


@pytest.mark.parametrize("name", fedlit.models.__all__)
def test_every_exported_name_resolves_to_its_submodule(name: str) -> None:
    # A renamed submodule left in _EXPORTS (models/checkpoints.py became models/pretrained.py) fails here by name.
    value = getattr(fedlit.models, name)
    module = importlib.import_module(f"fedlit.models.{fedlit.models._EXPORTS[name]}")
    assert value is getattr(module, name)


def test_exports_and_all_list_the_same_names() -> None:
    assert sorted(fedlit.models.__all__) == sorted(fedlit.models._EXPORTS)


def test_package_registry_names_come_with_fedlit_builders_registered() -> None:
    # registry.py no longer imports tiny.py (tiny imports the registry): the package does it before handing out
    # list_models/register_model. A fresh interpreter, since this one has imported tiny already.
    code = (
        "import sys\nfrom fedlit.models import list_models\nprint(list_models(), 'fedlit.models.tiny' in sys.modules)"
    )
    done = run_child([sys.executable, "-c", code])
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["['fedlit_test_cnn',", "'fedlit_test_vit']", "True"]
