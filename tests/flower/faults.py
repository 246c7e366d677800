"""A recipe callback for fault tests: it raises in one client's turn of one round, where that client trains (in
the simulation's process, or on its Flower node)."""

from __future__ import annotations

from lightning.pytorch import Callback


class RaiseAt(Callback):
    """Raise ``RuntimeError`` at the start of ``client_id``'s turn in ``server_round``.

    Args:
        client_id: The client that fails.
        server_round: The round it fails in.
    """

    def __init__(self, client_id: str, server_round: int) -> None:
        self.client_id, self.server_round = client_id, server_round

    def on_client_fit_start(self, server_round: int, client_id: str) -> None:
        if (client_id, server_round) == (self.client_id, self.server_round):
            raise RuntimeError(f"disk full on {client_id}")


class ExitAt(RaiseAt):
    """End the process (``os._exit(3)``, as a crash) at the start of ``client_id``'s turn in ``server_round``."""

    def on_client_fit_start(self, server_round: int, client_id: str) -> None:
        if (client_id, server_round) == (self.client_id, self.server_round):
            import os

            os._exit(3)


class ScaleUpdateAt(RaiseAt):
    """Scale ``client_id``'s update (what it uploads minus what it was sent) by ``factor`` in ``server_round``, after
    the client's own checks: a patched node that sends a scaled update.

    Args:
        client_id: The client whose update is scaled.
        server_round: The round.
        factor: The scale (500: a 500x update).
    """

    def __init__(self, client_id: str, server_round: int, factor: float = 500.0) -> None:
        super().__init__(client_id, server_round)
        self.factor = factor
        self.sent: dict = {}

    def on_client_fit_start(self, server_round: int, client_id: str, received: dict) -> None:
        self.sent = {n: t.detach().clone() for n, t in received.items()}

    def on_client_fit_end(self, server_round: int, client_id: str, update) -> None:
        if (client_id, server_round) != (self.client_id, self.server_round):
            return
        for name, tensor in update.state.items():
            if tensor.is_floating_point() and name in self.sent:
                base = self.sent[name].to(tensor.device, tensor.dtype)
                update.state[name] = base + self.factor * (tensor - base)
