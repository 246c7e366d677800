"""The lazy names of ``fedlit.models``: each one resolves to the object defined in the submodule it names."""

from __future__ import annotations

import importlib

import pytest

import fedlit.models


@pytest.mark.parametrize("name", fedlit.models.__all__)
def test_every_exported_name_resolves_to_its_submodule(name: str) -> None:
    # A renamed submodule left in _EXPORTS (models/checkpoints.py became models/pretrained.py) fails here by name.
    value = getattr(fedlit.models, name)
    module = importlib.import_module(f"fedlit.models.{fedlit.models._EXPORTS[name]}")
    assert value is getattr(module, name)


def test_exports_and_all_list_the_same_names() -> None:
    assert sorted(fedlit.models.__all__) == sorted(fedlit.models._EXPORTS)
