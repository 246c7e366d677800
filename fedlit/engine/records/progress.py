"""The run's progress bar over rounds, showing the current client, its local step and its running loss."""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from tqdm.auto import tqdm


class Progress:
    """A progress bar over the rounds (nothing shown when disabled).

    Args:
        enabled: Show the bar (``federation.progress_bar``, on rank 0 only).
    """

    def __init__(self, enabled: bool = False) -> None:
        self.enabled = enabled
        self._bar: Any = None
        self._client, self._shown = "", 0.0

    def rounds(self, first: int, last: int) -> Iterable[int]:
        """Rounds ``first``..``last`` with the bar over them."""
        self._bar = tqdm(range(first, last + 1), desc="rounds", disable=not self.enabled, initial=first - 1, total=last)
        return self._bar

    def close(self) -> None:
        """Close the bar."""
        if self._bar is not None:
            self._bar.close()

    def client(self, label: str) -> None:
        """Show which client trains now."""
        self._client = label
        if self._bar is not None and not self._bar.disable:
            self._bar.set_postfix_str(label, refresh=False)

    def step(self, steps: int, loss: float) -> None:
        """Show the current client's local step and running loss (at most twice a second)."""
        now = time.monotonic()
        if self._bar is None or self._bar.disable or now - self._shown < 0.5:
            return
        self._shown = now
        self._bar.set_postfix_str(f"{self._client} step {steps} loss {loss:.4g}")
