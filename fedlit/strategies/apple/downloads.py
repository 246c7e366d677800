"""APPLE's bandwidth limit (``max_downloads``) on the client: the cores it keeps of what it downloaded, which cores
it has downloaded, and the indices of the cores it asks for at its next turn.

Luo, Wu. "Adapt to Adaptation: Learning Personalization for Cross-Silo Federated Learning." IJCAI 2022. The rule is
in :mod:`fedlit.strategies.apple`'s docstring and the draw is
:func:`~fedlit.strategies.apple.equations.apple_download_choice`; these are apart from the strategy only to keep
that file under 400 lines.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from fedlit.strategies.apple.equations import apple_download_choice


def is_limited(max_downloads: int | None, n_clients: int) -> bool:
    """Whether ``max_downloads`` (``M``) limits the downloads: fewer than the ``N - 1`` other cores."""
    return max_downloads is not None and max_downloads + 1 < n_clients


def with_kept_cores(received: dict[str, Any], client_state: dict[str, Any]) -> dict[str, Any]:
    """The cores received this turn and, for the others, the values the client last downloaded."""
    return {**client_state.get("cores", {}), **received}


def keep_and_request(
    client_state: dict[str, Any],
    turn: Mapping[str, Any],
    p: Tensor,
    store: torch.device,
    limit: int,
    server_round: int,
    seed: int,
    *,
    lamb: float,
    thresh: float,
) -> Tensor:
    """Keep the cores received this turn in ``client_state`` (``"cores"``) and mark them downloaded (``"touched"``;
    not at the client's first turn, whose download is the initial cores); the indices of the ``limit`` cores to
    download next turn, drawn from ``seed`` by ``p``.

    ``turn`` is the strategy's record of the client's turn: ``received`` (the cores it downloaded), ``clients``
    (every client, in order), ``own`` (its index) and ``first`` (whether it is its first turn).
    """
    clients, own = turn["clients"], turn["own"]
    cache = client_state.setdefault("cores", {})
    touched = client_state.setdefault("touched", torch.eye(len(clients), dtype=torch.bool)[own])
    for j, core in turn["received"].items():
        cache[j] = {n: t.detach().to(store, copy=True) for n, t in core.items()}
        if not turn["first"]:  # the first turn's download is the initial cores
            touched[clients.index(j)] = True
    generator = torch.Generator().manual_seed(seed)
    request = apple_download_choice(p, own, touched, limit, server_round, generator, lamb=lamb, thresh=thresh)
    return torch.tensor(request, dtype=torch.int64)
