"""Client-level differential privacy (DP-FedAvg: McMahan, Ramage, Talwar, Zhang, ICLR 2018); the symbols and
deviations are in :mod:`fedlit.privacy`."""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch
from lightning.pytorch import Callback
from torch import Tensor
from typing_extensions import override

from fedlit.core.contexts import ServerContext
from fedlit.core.errors import ConfigError
from fedlit.module import FederatedModule
from fedlit.privacy.accounting import ACCOUNTANT, check_settings, rdp_accountant, warn_uncovered

if TYPE_CHECKING:
    from fedlit.strategies.base import ClientUpdate
    from fedlit.strategies.fedavg import FedAvg


def clip_update(state: dict[str, Tensor], reference: Mapping[str, Tensor], names: list[str], clip_norm: float) -> float:
    """Clip the joint L2 norm of ``state - reference`` over ``names`` to ``clip_norm``, rewriting ``state`` in place.

    Every delta is scaled by ``min(1, clip_norm / ||delta||)``, the norm taken over all of ``names`` together (in
    float64, so a large model's norm is exact enough).

    Returns:
        The norm of the delta before clipping.
    """
    deltas = {n: state[n].detach().to(reference[n].device, torch.float64) - reference[n].double() for n in names}
    norm = math.sqrt(sum(float(d.pow(2).sum()) for d in deltas.values()))
    scale = min(1.0, clip_norm / norm) if norm > 0 else 1.0
    if scale < 1.0:
        for n, d in deltas.items():
            state[n] = (reference[n].double() + d * scale).to(state[n].device, state[n].dtype)
    return norm


def gaussian_noise(shapes: Mapping[str, torch.Size], std: float, seed: int) -> dict[str, Tensor]:
    """Independent N(0, std^2) float32 noise for each tensor shape, in the order of ``shapes``, drawn on the CPU
    from a generator seeded with ``seed``: the same values on every process and device."""
    generator = torch.Generator().manual_seed(seed)
    return {n: torch.normal(0.0, std, size=tuple(s), generator=generator) for n, s in shapes.items()}


class ClientLevelDP(Callback):
    """Client-level differential privacy of the shared parameters (DP-FedAvg, server-side fixed clipping).

    In ``on_before_aggregate`` each client's update delta (its uploaded shared parameters minus the server's
    ``strategy.global_state``) is clipped to L2 norm ``clip_norm`` (jointly over every shared parameter). In
    ``on_after_aggregate`` Gaussian noise N(0, (noise_multiplier * clip_norm / m)^2), m the number of updates
    aggregated, is added to every shared parameter of the new server state. Each round is one step of the sampled
    Gaussian mechanism with sampling rate q = clients per round / training clients; the RDP accountant gives
    epsilon(delta) after each round.

    Defined for strategies whose new server state is the (weighted) mean of the uploads: FedAvg and its subclasses
    that keep its aggregation (FedProx, FedBN, SiloBN, FedSA...) with the default weighted-mean aggregator. Others
    (Local, FedOpt's server optimizers, robust aggregators, SCAFFOLD...) are refused: the noise scale would not
    match what the server computes.

    With ``weighting: uniform`` the mean is unweighted and the noise scale is exact. With ``weighting:
    num_examples`` a client's clipped delta enters the mean with weight w_k / sum(w), so the largest contribution
    is max(w) / sum(w) * clip_norm instead of clip_norm / m; the accountant then uses the round's effective noise
    multiplier noise_multiplier * sum(w) / (m * max(w)) (<= noise_multiplier; logged as
    ``privacy/effective_noise_multiplier``), and a warning says so.

    Shared buffers (BatchNorm's running statistics) are statistics of the clients' data that the clipping and the
    noise do not cover: a model with shared buffers is refused; make them personal (strategy ``FedBN`` or
    ``SiloBN``, or a role rule) or use a normalization without statistics (GroupNorm, LayerNorm).

    Logs per round ``privacy/epsilon``, ``privacy/delta``, ``privacy/clip_norm``, ``privacy/noise_multiplier``,
    ``privacy/effective_noise_multiplier``, ``privacy/clipped_fraction`` (clients whose delta was clipped) and
    ``privacy/sample_rate``; ``results.json`` gets ``privacy.client_level``. The accountant's history is checkpointed,
    so a resumed run reports the same epsilon.

    Args:
        noise_multiplier: z, the noise std in units of ``clip_norm / m`` (> 0).
        clip_norm: C, the bound on the L2 norm of a client's update delta (> 0).
        delta: The delta of the reported (epsilon, delta)-DP (in (0, 1); below 1 / number of clients).
    """

    def __init__(self, noise_multiplier: float, clip_norm: float, delta: float = 1e-5) -> None:
        check_settings("ClientLevelDP", noise_multiplier, ("clip_norm", clip_norm), delta)
        self.noise_multiplier, self.clip_norm, self.delta = float(noise_multiplier), float(clip_norm), float(delta)
        self.history: list[list[float]] = []  # the accountant's (noise multiplier, sample rate, steps)
        self.rounds = 0
        self._round: dict[str, float] = {}

    @override
    def __repr__(self) -> str:
        return (
            f"ClientLevelDP(noise_multiplier={self.noise_multiplier}, clip_norm={self.clip_norm}, delta={self.delta})"
        )

    @override
    def on_fit_start(self, trainer: ServerContext, pl_module: FederatedModule) -> None:
        from fedlit.strategies.common.aggregators import WeightedMeanAggregator
        from fedlit.strategies.fedavg import FedAvg

        rdp_accountant()  # Opacus is there
        strategy = trainer.strategy
        cls = type(strategy)
        mean = (
            isinstance(strategy, FedAvg)
            and type(strategy.aggregator) is WeightedMeanAggregator
            and all(getattr(cls, m) is getattr(FedAvg, m) for m in ("aggregate", "combine", "client_weights"))
        )
        if not mean or not isinstance(strategy, FedAvg):  # the second test only narrows the type for the checker
            raise ConfigError(
                f"ClientLevelDP is defined for strategies whose server state is the weighted mean of the uploads "
                f"(FedAvg and its subclasses that keep its aggregation, with the default aggregator), not for "
                f"{strategy!r}: the noise it adds would not be calibrated to what {cls.__name__} computes. Use "
                "strategy FedAvg, FedProx, FedBN or SiloBN, or remove the callback."
            )
        buffers = [n for n in strategy.global_state if n not in set(strategy.shared_parameter_names())]
        if buffers:
            raise ConfigError(
                f"ClientLevelDP protects shared parameters only, but the model shares buffers ({buffers[:4]}"
                f"{' ...' if len(buffers) > 4 else ''}: normalization statistics of the clients' data, which "
                "the clipping and the noise do not cover). Make them personal (strategy FedBN or SiloBN, or a "
                "model.init_args.roles rule), or use GroupNorm/LayerNorm instead of BatchNorm."
            )
        if getattr(strategy, "weighting", "uniform") != "uniform":
            warnings.warn(
                f"ClientLevelDP with {strategy!r}: clients are weighted by their number of examples, so the noise "
                f"(calibrated for the unweighted mean) is smaller than z * the largest weighted contribution; the "
                "accountant uses the round's effective noise multiplier (privacy/effective_noise_multiplier). Set "
                "strategy.init_args.weighting: uniform for the exact calibration.",
                stacklevel=2,
            )
        warn_uncovered("ClientLevelDP", self.rounds, trainer)

    def on_before_aggregate(
        self, trainer: ServerContext, pl_module: FederatedModule, server_round: int, updates: list[ClientUpdate]
    ) -> None:
        """Clip each update's delta to ``clip_norm`` (in place) and note the round's weights."""
        strategy = _mean_strategy(trainer)
        names = strategy.shared_parameter_names()
        norms = [clip_update(u.state, strategy.global_state, names, self.clip_norm) for u in updates]
        weights = strategy.client_weights(updates) if updates else []
        m = len(updates)
        effective = (
            self.noise_multiplier * sum(weights) / (m * max(weights))
            if m and max(weights) > 0
            else self.noise_multiplier
        )
        self._round = {"m": m, "clipped": sum(n > self.clip_norm for n in norms), "effective": effective}

    def on_after_aggregate(
        self, trainer: ServerContext, pl_module: FederatedModule, server_round: int, log: dict[str, float] | None = None
    ) -> None:
        """Add the Gaussian noise to the new server state, step the accountant and log the round's privacy."""
        m = int(self._round.get("m", 0))
        if m == 0:
            return
        strategy = _mean_strategy(trainer)
        names = strategy.shared_parameter_names()
        std = self.noise_multiplier * self.clip_norm / m
        noise = gaussian_noise(
            {n: strategy.global_state[n].shape for n in names}, std, trainer.derive_seed("dp-noise", server_round)
        )
        for n in names:
            target = strategy.global_state[n]
            strategy.global_state[n] = target + noise[n].to(target.device, target.dtype)
        sample_rate = self.sample_rate(trainer)
        accountant = rdp_accountant(self.history)
        accountant.step(noise_multiplier=self._round["effective"], sample_rate=sample_rate)
        self.history = [list(h) for h in accountant.history]
        self.rounds += 1
        if log is not None:
            log.update(
                {
                    "privacy/epsilon": self.epsilon(),
                    "privacy/delta": self.delta,
                    "privacy/clip_norm": self.clip_norm,
                    "privacy/noise_multiplier": self.noise_multiplier,
                    "privacy/effective_noise_multiplier": self._round["effective"],
                    "privacy/clipped_fraction": self._round["clipped"] / m,
                    "privacy/sample_rate": sample_rate,
                }
            )

    @staticmethod
    def sample_rate(trainer: ServerContext) -> float:
        """q: the clients a round selects / the clients that train."""
        from fedlit.core.seeding import num_selected

        total = len(trainer.train_client_ids)
        return num_selected(trainer.settings.clients_per_round, total) / total

    def epsilon(self) -> float:
        """Epsilon of the rounds so far at ``delta`` (0 before the first round)."""
        return float(rdp_accountant(self.history).get_epsilon(self.delta)) if self.history else 0.0

    def results_json(self, trainer: ServerContext) -> dict[str, Any]:
        """``results.json``'s ``privacy.client_level``."""
        return {
            "privacy": {
                "client_level": {
                    "epsilon": self.epsilon(),
                    "delta": self.delta,
                    "noise_multiplier": self.noise_multiplier,
                    "clip_norm": self.clip_norm,
                    "rounds": self.rounds,
                    "sample_rate": self.sample_rate(trainer),
                    "accountant": ACCOUNTANT,
                    "accountant_history": self.history,
                    "mechanism": "DP-FedAvg (McMahan et al., ICLR 2018), server-side fixed clipping",
                }
            }
        }

    @override
    def state_dict(self) -> dict[str, Any]:
        return {"history": [list(h) for h in self.history], "rounds": self.rounds}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.history = [list(h) for h in state_dict["history"]]
        self.rounds = int(state_dict["rounds"])


def _mean_strategy(trainer: ServerContext) -> FedAvg:
    """The run's strategy, which :meth:`ClientLevelDP.on_fit_start` checked is a FedAvg that keeps its mean."""
    from fedlit.strategies.fedavg import FedAvg

    strategy = trainer.strategy
    if not isinstance(strategy, FedAvg):
        raise ConfigError(f"ClientLevelDP needs a FedAvg strategy (or a subclass), not {strategy!r}.")
    return strategy
