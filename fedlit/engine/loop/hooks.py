"""The one way the loop calls hooks on the callbacks (the strategy first, then the extra callbacks).

Hooks are called with keyword arguments named as in Lightning (``trainer``, ``pl_module``, ``batch``...), and each
callback gets only the arguments its method declares (all of them with ``**kwargs``), as ``Fabric.call`` does. A hook
that no callback overrides is skipped (inspecting signatures at every batch is a measurable cost). Hooks of a
client's turn may also give each callback its own ``client_state``: the dict kept for that client in the
:class:`~fedlit.core.store.ClientStore` under the callback's ``state_key``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any

from lightning.pytorch import Callback, LightningModule

from fedlit.core.store import ClientStore

_Bound = tuple[Any, Callable[..., Any], frozenset[str], bool]


class Hooks:
    """The callbacks of a run and the calls of their hooks.

    Args:
        callbacks: The strategy, then the extra callbacks.
    """

    def __init__(self, callbacks: Sequence[Callback]) -> None:
        self.callbacks = list(callbacks)
        self._bound: dict[str, list[_Bound]] = {}

    def call(self, hook: str, *, client_states: ClientStore | None = None, **kwargs: Any) -> None:
        """Call ``hook`` on every callback that implements it, with the keyword arguments it declares; with
        ``client_states``, also each callback's ``client_state`` of ``kwargs["client_id"]``."""
        for callback, method, params, takes_all in self._methods(hook):
            given = kwargs if takes_all else {k: v for k, v in kwargs.items() if k in params}
            if client_states is not None and (takes_all or "client_state" in params):
                given = {**given, "client_state": client_states.extra(kwargs["client_id"], callback.state_key)}
            method(**given)

    def implemented(self, hook: str) -> bool:
        """Whether some callback implements ``hook`` with more than Lightning's no-op default."""
        return bool(self._methods(hook))

    def _methods(self, hook: str) -> list[_Bound]:
        bound = self._bound.get(hook)
        if bound is None:
            bound = []
            for callback in self.callbacks:
                impl = getattr(type(callback), hook, None)
                if not callable(impl) or impl in (getattr(Callback, hook, None), getattr(LightningModule, hook, None)):
                    continue
                method = getattr(callback, hook)
                params = inspect.signature(method).parameters
                takes_all = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
                bound.append((callback, method, frozenset(params), takes_all))
            self._bound[hook] = bound
        return bound
