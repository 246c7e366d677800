"""fedlit's own model builders, registered in timm's registry like timm's models.

`register_model` registers a builder with timm (so `timm.create_model(name)` and `TimmBackbone(name=...)`
find it) and records its name, so that one parametrized test exercises every builder fedlit adds.

The modules that define builders import this one, never the reverse (as in timm, whose model files import its
registry): `fedlit.models.list_models` and `fedlit.models.register_model` are handed out by the package after it
has imported fedlit's own builders (`fedlit.models.tiny`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from timm.models import register_model as _timm_register_model

__all__ = ["list_models", "register_model"]

_Builder = TypeVar("_Builder", bound=Callable[..., object])
_NAMES: list[str] = []


def register_model(builder: _Builder) -> _Builder:
    """Register a timm-style builder (`builder(pretrained=False, **kwargs) -> nn.Module`) under its name.

    Args:
        builder: The function; its `__name__` is the model name.

    Returns:
        `builder`, unchanged.
    """
    _timm_register_model(builder)
    if builder.__name__ not in _NAMES:
        _NAMES.append(builder.__name__)
    return builder


def list_models() -> list[str]:
    """Names of the builders registered through `register_model` so far, sorted.

    Through `fedlit.models.list_models` they include fedlit's own (`fedlit_test_*`): the package imports
    `fedlit.models.tiny` before it hands out this function.
    """
    return sorted(_NAMES)
