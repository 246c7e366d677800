"""Local: every client trains alone, nothing is communicated (the lower bound of personalized FL tables).

Every tensor that would be shared becomes personal, so nothing is uploaded or downloaded and the server holds
no state.
"""

from __future__ import annotations

from torch import Tensor
from typing_extensions import override

from fedlit.core.roles import ParameterRoles
from fedlit.strategies.base import ClientUpdate, Strategy


class Local(Strategy):
    """Local training only: no communication, no aggregation."""

    communicates = False

    @override
    def configure_roles(self, roles: ParameterRoles) -> ParameterRoles:
        """Make every shared tensor personal."""
        return roles.replace(lambda name, role: role == "shared", "personal")

    @override
    def aggregate(self, server_round: int, updates: list[ClientUpdate]) -> dict[str, Tensor]:
        """Nothing to aggregate."""
        return {}
