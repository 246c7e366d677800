"""Where a run's state lives: one rule, the same in a straight run and after a resume.

- The live module, the optimizer of a client's turn, batches and activations: the run's device
  (``federation.accelerator``/``devices``; ``run.fabric.device``).
- The server: ``strategy.global_state`` and every other tensor of ``strategy.state_dict()`` (FedOpt's moments,
  SCAFFOLD's ``c``, APPLE's cores...): the store's device, ``federation.store_device`` (the CPU by default), where
  the clients' uploads arrive. A strategy receives its initial state there (``initialize``); whatever a hook or
  ``aggregate`` put elsewhere is moved there at the end of each round (:func:`place_server_state`), before the
  checkpoint; a resume loads it there.
- The client store (:class:`~fedlit.core.store.ClientStore`): each client's tensors, its optimizer state
  (``optimizer_state: persist``) and the strategies' per-client state, on ``store_device``; in pinned host memory
  when that is the CPU and the run's device a CUDA GPU.
- A checkpoint file holds CPU tensors; it is read onto the CPU, then placed as above. Callbacks restore their own
  state (their ``load_state_dict``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from fedlit.core.tensors import tensors
from fedlit.strategies.base import Strategy


def moved(obj: Any, device: torch.device) -> Any:
    """``obj`` (tensors in dicts, lists and tuples) with every tensor on ``device``: a tensor already there is kept
    (not copied), containers are rebuilt."""
    if isinstance(obj, Tensor):
        return obj if obj.device == device else obj.detach().to(device)
    if isinstance(obj, Mapping):
        return {k: moved(v, device) for k, v in obj.items()}
    if isinstance(obj, list):
        return [moved(v, device) for v in obj]
    if isinstance(obj, tuple):
        return tuple(moved(v, device) for v in obj)
    return obj


def misplaced(state: Any, device: torch.device) -> bool:
    """Whether a tensor of ``state`` is not on ``device``."""
    return any(t.device != device for t in tensors(state))


def place_server_state(strategy: Strategy, device: torch.device) -> None:
    """Move the strategy's state to ``device`` (through ``load_state_dict``, as a resume loads it) if any of its
    tensors is elsewhere; nothing when all are there."""
    state = strategy.state_dict()
    if misplaced(state, device):
        strategy.load_state_dict(moved(state, device))


def server_inputs(named: Mapping[str, Tensor], device: torch.device) -> dict[str, Tensor]:
    """The live module's tensors ``named`` as the strategy's ``initialize`` receives them: on ``device``."""
    return {n: t.detach().to(device) for n, t in named.items()}
