"""The server's aggregation step: :meth:`~fedlit.strategies.base.Strategy.aggregate` returns the new server state and
the loop, not the strategy, stores it as ``strategy.global_state``.

What ``aggregate`` returns must be the server state the strategy declared: a mapping with exactly the names of
``global_state`` as :meth:`~fedlit.strategies.base.Strategy.initialize` set it, each tensor of the same shape.
Anything else (``None`` from a strategy that stored its state and forgot to return it, a missing or an extra
tensor, a changed shape) stops the run with a :class:`~fedlit.core.errors.ConfigError` naming the strategy, instead
of silently publishing the old state. Dtypes and devices are kept as returned.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import Tensor

from fedlit.core.errors import ConfigError
from fedlit.strategies.base import ClientUpdate, Strategy

#: How the message ends: the fix.
_FIX = "Return the new server state from aggregate, e.g. `return new_state`; the loop stores it as global_state."


def aggregate(strategy: Strategy, server_round: int, updates: list[ClientUpdate]) -> dict[str, Tensor]:
    """Call ``strategy.aggregate``, check what it returns (:func:`check_server_state`) and store it as
    ``strategy.global_state`` (a new dict holding the returned tensors). Returns the stored state."""
    declared = {n: tuple(t.shape) for n, t in strategy.global_state.items()}  # before the call, which may store
    new_state = strategy.aggregate(server_round, updates)
    check_server_state(strategy, server_round, new_state, declared)
    strategy.global_state = dict(new_state)
    return strategy.global_state


def check_server_state(
    strategy: Strategy, server_round: int, new_state: Any, declared: Mapping[str, tuple[int, ...]]
) -> None:
    """Raise a :class:`~fedlit.core.errors.ConfigError` unless ``new_state`` is a mapping of tensors with exactly the
    names of ``declared`` (the server state's names and shapes before ``aggregate`` ran), each of its shape.

    Args:
        strategy: The strategy whose ``aggregate`` returned ``new_state`` (named in the message).
        server_round: The round, counted from 1.
        new_state: What ``aggregate`` returned.
        declared: Each tensor's shape by name, as ``strategy.global_state`` held them before the call.
    """
    where = f"Round {server_round}: {type(strategy).__name__}.aggregate returned"
    if new_state is None:
        raise ConfigError(
            f"{where} None, not the new server state (the loop ignores what a strategy stores in "
            f"self.global_state itself). {_FIX}"
        )
    if not isinstance(new_state, Mapping):
        raise ConfigError(f"{where} a {type(new_state).__name__}, not a mapping of tensor names to tensors. {_FIX}")
    problems = []
    missing = [n for n in declared if n not in new_state]
    unexpected = [n for n in new_state if n not in declared]
    if missing:
        problems.append(f"missing names {_names(missing)}")
    if unexpected:
        problems.append(f"unexpected names {_names(unexpected)}")
    not_tensors = [n for n in new_state if n in declared and not isinstance(new_state[n], Tensor)]
    if not_tensors:
        problems.append(f"values that are not tensors at {_names(not_tensors)}")
    mismatch = next(
        (n for n in declared if isinstance(new_state.get(n), Tensor) and tuple(new_state[n].shape) != declared[n]), None
    )
    if mismatch is not None:
        problems.append(
            f"{mismatch!r} of shape {list(new_state[mismatch].shape)} where the server state has "
            f"{list(declared[mismatch])}"
        )
    if problems:
        raise ConfigError(
            f"{where} a state that does not fit the server state it declared (the names and shapes of "
            f"global_state as initialize set them): {'; '.join(problems)}. {_FIX}"
        )


def _names(names: list[str], shown: int = 5) -> str:
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return f"{names[:shown]}{more}"
