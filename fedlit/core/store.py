"""ClientStore: every client's own state, kept off the one live model.

The federation holds a single live :class:`~fedlit.module.FederatedModule`; the frozen backbone exists once,
whatever the number of clients. Per client the store keeps only what must persist between its turns: its
trainable and personal tensors (shared + personal roles, buffers included), optionally its optimizer state,
and the per-client state of strategies and callbacks (SCAFFOLD's c_i, APPLE's p_i). Clients that never trained
share one initial template, so memory grows by a client's state only once it has trained. Training client k is
``load_into`` (copy k's tensors into the live model, in place), train, ``save_from`` (copy back).

Everything the store keeps lives on its ``device`` (``federation.store_device``, the CPU by default), the same in a
straight run and after a resume: what is saved, loaded or written by a strategy into :meth:`ClientStore.extra` during
a client's turn is moved there. With ``pin_memory`` (set by the run when the store is on the CPU and the live model
on a CUDA device) its tensors sit in pinned host memory and a swap is a batch of non-blocking copies followed by one
synchronization, instead of one blocking copy per tensor.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch
from torch import Tensor

from fedlit.core.tensors import nbytes


class ClientStore:
    """Per-client tensors, optimizer states and strategy states, on ``device`` (CPU by default).

    Args:
        device: Where stored tensors live.
        pin_memory: Keep them in pinned host memory (a CPU store that a CUDA device reads from and writes to).
    """

    def __init__(self, device: str | torch.device = "cpu", *, pin_memory: bool = False) -> None:
        self.device = torch.device(device)
        self.pin_memory = pin_memory
        self._initial: dict[str, Tensor] = {}
        self._tensors: dict[str, dict[str, Tensor]] = {}
        self._optimizer: dict[str, dict[str, Any]] = {}
        self._extra: dict[str, dict[str, dict[str, Any]]] = {}
        self._kept: set[str] | None = None  # the clients this process holds (None: all of them)
        #: Bytes of each client's tensors and optimizer state, kept as they are stored (:meth:`nbytes` is logged
        #: every round: walking every client's entry would cost in proportion to the clients, not to the round).
        self._sizes: dict[str, int] = {}

    def set_initial(self, tensors: Mapping[str, Tensor]) -> None:
        """The state of a client that has not trained yet (one copy, shared by all such clients)."""
        self._initial = self._stored(dict(tensors))

    @property
    def client_ids(self) -> list[str]:
        """Clients that have their own stored tensors."""
        return list(self._tensors)

    def tensors(self, client_id: str) -> dict[str, Tensor]:
        """The stored tensors of ``client_id`` (the initial template for a client that never trained)."""
        return self._tensors.get(client_id, self._initial)

    def load_into(self, client_id: str, live: Mapping[str, Tensor]) -> None:
        """Copy ``client_id``'s stored tensors into the live model's tensors, in place."""
        stored = self.tensors(client_id)
        missing = sorted(set(live) - set(stored))
        if missing:
            raise KeyError(f"The client store has no tensors {missing[:5]} for client {client_id!r}.")
        pinned = self._pinned()
        with torch.no_grad():
            for name, tensor in live.items():
                tensor.copy_(stored[name], non_blocking=pinned)
        _synchronize(live.values() if pinned else ())

    def save_from(self, client_id: str, live: Mapping[str, Tensor]) -> None:
        """Copy the live tensors back as ``client_id``'s state (allocated once, then reused in place), and move what
        strategies and callbacks wrote into its :meth:`extra` during the turn to the store's device."""
        own = self._tensors.get(client_id)
        with torch.no_grad():
            if own is None or set(own) != set(live):
                self._tensors[client_id] = self._stored(dict(live))
                self._resize(client_id)
            else:
                pinned = self._pinned()
                for name, tensor in live.items():
                    own[name].copy_(tensor, non_blocking=pinned)
                _synchronize(live.values() if pinned else ())
        if client_id in self._extra:
            _place(self._extra[client_id], self.device)

    def optimizer_state(self, client_id: str) -> dict[str, Any] | None:
        """The saved optimizer ``state_dict`` of ``client_id``, if any."""
        return self._optimizer.get(client_id)

    def set_optimizer_state(self, client_id: str, state: dict[str, Any]) -> None:
        """Keep ``client_id``'s optimizer state (moved to the store's device)."""
        self._optimizer[client_id] = self._stored(state)
        self._resize(client_id)

    def extra(self, client_id: str, key: str) -> dict[str, Any]:
        """A mutable dict of per-client state owned by the strategy or callback ``key``."""
        return self._extra.setdefault(client_id, {}).setdefault(key, {})

    def nbytes(self, client_id: str | None = None) -> int:
        """Bytes of what the store keeps for one client (its tensors, optimizer state and strategy/callback state),
        or for the whole store (the template of untrained clients included)."""
        if client_id is not None:
            return self._sizes.get(client_id, 0) + nbytes(self._extra.get(client_id))
        # The strategies' and callbacks' states are changed in place by their owners: walked at every call.
        return nbytes(self._initial) + sum(self._sizes.values()) + nbytes(self._extra)

    def _resize(self, client_id: str) -> None:
        size = nbytes(self._tensors.get(client_id)) + nbytes(self._optimizer.get(client_id))
        if size or client_id in self._tensors or client_id in self._optimizer:
            self._sizes[client_id] = size
        else:
            self._sizes.pop(client_id, None)

    def retain(self, client_ids: set[str]) -> None:
        """Keep only ``client_ids``' entries, now and whenever a state is loaded later (a rank of a multi-device run
        holds its own clients only; see :mod:`fedlit.engine.loop.ranks`)."""
        self._kept = set(client_ids)
        for entries in (self._tensors, self._optimizer, self._extra, self._sizes):
            for client_id in [c for c in entries if c not in self._kept]:
                del entries[client_id]

    def client_state(self, client_id: str) -> dict[str, Any]:
        """Everything the store keeps for ``client_id`` (its tensors, optimizer state and strategy/callback state):
        what a client process saves between its turns when the store lives where the client is (a Flower node)."""
        return {
            "tensors": self._tensors.get(client_id),
            "optimizer": self._optimizer.get(client_id),
            "extra": self._extra.get(client_id),
        }

    def load_client_state(self, client_id: str, state: Mapping[str, Any]) -> None:
        """Restore what :meth:`client_state` returned for ``client_id``."""
        for key, table in (("tensors", self._tensors), ("optimizer", self._optimizer), ("extra", self._extra)):
            if state[key] is None:
                table.pop(client_id, None)
            else:
                table[client_id] = self._stored(state[key])
        self._resize(client_id)

    def state_dict(self) -> dict[str, Any]:
        """Everything in the store, for a checkpoint (tensors and plain containers only)."""
        return {
            "initial": self._initial,
            "tensors": self._tensors,
            "optimizer": self._optimizer,
            "extra": self._extra,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned (only the retained clients' entries, after :meth:`retain`)."""
        self._initial = self._stored(dict(state["initial"]))
        self._tensors = self._stored(self._own(state["tensors"]))
        self._optimizer = self._stored(self._own(state["optimizer"]))
        self._extra = self._stored(self._own(state["extra"]))
        self._sizes = {}
        for client_id in {*self._tensors, *self._optimizer}:
            self._resize(client_id)

    def _own(self, entries: Mapping[str, Any]) -> dict[str, Any]:
        return {c: v for c, v in entries.items() if self._kept is None or c in self._kept}

    def _pinned(self) -> bool:
        return self.pin_memory and self.device.type == "cpu"

    def _stored(self, obj: Any) -> Any:
        """A copy of ``obj`` on the store's device (pinned with :attr:`pin_memory`), complete when it returns."""
        sources: list[Tensor] = []
        out = _to_device(obj, self.device, sources if self._pinned() else None)
        _synchronize(sources)
        return out


def _to_device(obj: Any, device: torch.device, pinned: list[Tensor] | None = None) -> Any:
    """A copy of ``obj`` with every tensor on ``device``. ``pinned`` (a CPU ``device``): copies into pinned host
    memory, those from an accelerator non-blocking, their sources appended to ``pinned`` (to synchronize on)."""
    if isinstance(obj, Tensor):
        if pinned is None:
            return obj.detach().to(device, copy=True)
        if obj.device.type == "cpu":
            return obj.detach().pin_memory()
        pinned.append(obj)
        return torch.empty_like(obj, device=device, pin_memory=True).copy_(obj.detach(), non_blocking=True)
    if isinstance(obj, dict):
        return {k: _to_device(v, device, pinned) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_to_device(v, device, pinned) for v in obj]
    if isinstance(obj, tuple):
        return tuple(_to_device(v, device, pinned) for v in obj)
    return obj


def _place(table: dict[Any, Any] | list[Any], device: torch.device) -> None:
    """Move every tensor held in ``table`` (nested dicts and lists, changed in place: their owners may keep
    references to them) to ``device``; a tensor already there is left as it is."""
    for key, value in table.items() if isinstance(table, dict) else enumerate(table):
        if isinstance(value, Tensor):
            if value.device != device:
                table[key] = value.detach().to(device)
        elif isinstance(value, (dict, list)):
            _place(value, device)
        elif isinstance(value, tuple):
            table[key] = _to_device(value, device)


def _synchronize(tensors: Iterable[Tensor]) -> None:
    """Wait for the non-blocking copies queued on the devices of ``tensors`` (none on the CPU)."""
    for device in {t.device for t in tensors if t.device.type == "cuda"}:
        torch.cuda.synchronize(device)
