"""Secure aggregation of a round's uploads with Flower's SecAgg+ (the server learns only their weighted mean).

Bell, Bonawitz, Gascón, Lepoint, Raykova. "Secure Single-Server Aggregation with (Poly)Logarithmic Overhead."
ACM CCS 2020.

Each client of a round uploads ``[w_k, w_k x_k]`` (``w_k = n_k / max_weight``, ``x_k`` its shared tensors, ``n_k``
its ``num_examples``), quantized to integers and masked by pairwise masks agreed with its neighbours plus a private
mask; the masks cancel in the sum, so the server recovers ``sum_k w_k x_k / sum_k w_k`` and nothing about a single
``x_k`` (Flower's :class:`~flwr.server.workflow.SecAggPlusWorkflow` on the server, ``secaggplus_mod`` on the
clients, flwr 1.41). As Flower's own legacy path does, every client's ``update.state`` is then set to that mean:
a strategy whose ``aggregate`` is a ``num_examples``-weighted mean of the states (see
:attr:`fedlit.strategies.Strategy.secure_aggregation`) gives the same result as with the plain uploads, up to
the quantization error below.

Server (:mod:`fedlit.flower.secagg_server`): :func:`~fedlit.flower.secagg_server.secure_fit` runs the four stages
of the protocol for one round over the round's nodes (the clients train inside the third, "collect masked vectors")
and returns the round's turns. Client (:mod:`fedlit.flower.secagg_client`):
:func:`~fedlit.flower.secagg_client.client_mods` goes into the ``ClientApp``; its train function hands the messages
for which :func:`~fedlit.flower.secagg_client.is_secure_train` holds to
:func:`~fedlit.flower.secagg_client.handle_secure_train`. This module holds what both sides share: the options
(:class:`SecAggOptions`), which strategies can aggregate securely (:func:`check_secure_aggregation`,
:func:`compatible_strategies`), the keys of fedlit's entries in the messages and the tensor conversions; it imports
neither side (both import it).

Quantization (``SecAggOptions``): a client multiplies its tensors by ``w_k``, clips them to
``[-clipping_range, clipping_range]`` and rounds them stochastically (unbiased) to a grid of step
``2 clipping_range / quantization_range``. The mean of K clients is therefore off by at most
``K max_weight (2 clipping_range + max|x|) / (quantization_range sum_k n_k)`` per value (the rounding of the
values, and of the weights ``w_k`` to multiples of ``1 / quantization_range``). A client refuses to upload (and
drops out of the round with an error naming the option) when a value would be clipped,
``max|x| n_k / max_weight > clipping_range``, or when ``n_k > max_weight``; the server refuses a round whose
``K quantization_range`` reaches the masks' modulus ``2^32``.

What the secure path does not hide: the clients' ``num_examples``, training loss and step count, and integer
tensors (BatchNorm's ``num_batches_tracked``, a step counter that would not fit the clipping range), which
travel in the clear beside the masked vector. Extras (``configure_client_extras``, ``update.extras``) cannot be
masked and are refused. Deviation from the paper's cryptographic pseudo-random generator: flwr 1.41 expands each
mask with NumPy's Mersenne Twister seeded by 32 bits folded from the agreed key, so a mask is one of 2^32; the
protection is that of this implementation.

Faults: a turn whose ``problem`` is set (non-finite loss or tensor) or whose training raised is never masked into
the sum: the client raises, the ``ClientApp`` answers with an error, the protocol treats the client as dropped
(its pairwise masks are rebuilt from the shares its neighbours hold) and
:func:`~fedlit.flower.secagg_server.secure_fit` returns the turn as quarantined (``problem`` set, nothing uploaded)
or as the error's description. The round goes on while every remaining client keeps at least
``reconstruction_threshold`` live neighbours; otherwise Flower halts it and every turn of the round is an error.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Mapping
from dataclasses import dataclass, fields
from difflib import get_close_matches
from typing import Any

import numpy as np
import torch
from flwr.server.workflow import SecAggPlusWorkflow
from torch import Tensor

from fedlit.core.errors import ConfigError
from fedlit.strategies.base import Strategy
from fedlit.strategies.common.aggregators import WeightedMeanAggregator
from fedlit.strategies.fedavg import FedAvg

OPTION = "secure-aggregation"
#: The masks' modulus (Flower's ``modulus_range``): sums of quantized values must stay below it.
MODULUS = 2**32
#: Methods that read the uploads: a class that overrides one below the class declaring ``secure_aggregation``
#: has not declared that its own version needs only the weighted mean.
_READS_UPLOADS = (
    "aggregate",
    "combine",
    "client_weights",
    "check_uploads",
    "on_before_aggregate",
    "configure_client_extras",
    "on_client_fit_end",
)
_PREFIX = "fedlit."  # keys of fedlit's entries in the FitIns config and the FitRes metrics
_FAULT = "fedlit-secagg-fault"  # marks the description of a client's fault inside Flower's error reason


def _parse_setting(text: str) -> Any:
    """The run config's ``secure-aggregation`` text: ``true``/``false`` or a JSON mapping of options."""
    if text.strip().lower() in ("true", "false", ""):
        return text.strip().lower() == "true"
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise ConfigError(
            f"{OPTION}={text!r} must be true, false or a JSON mapping of options such as "
            f"'{{\"max_weight\": 200}}' ({err})."
        ) from None


@dataclass
class SecAggOptions:
    """The SecAgg+ settings of a Flower deployment (the Flower run config's ``secure-aggregation``).

    The defaults suit small federations (a few to a few dozen clients per round): every client is every other's
    neighbour and its secrets are rebuilt from two thirds of their shares (at least 2), so up to a third of a
    round's clients may drop out, and the server would need the shares of two thirds of a client's neighbours
    (colluding with it) to unmask that client's upload.

    Attributes:
        num_shares: Neighbours each client shares its secrets with, itself included: an integer > 2, or a fraction
            in (0, 1] of the round's clients (1.0: all). Bell et al. take O(log n) for large rounds.
        reconstruction_threshold: Shares needed to rebuild a client's secrets: an integer >= 2 below
            ``num_shares``, or a fraction in (0, 1] of ``num_shares`` (at least 2). Higher: more colluding clients
            needed to unmask one upload, fewer dropouts tolerated (``num_shares - threshold`` per neighbourhood).
        clipping_range: Weighted values are clipped to [-clipping_range, clipping_range] before quantization (a
            client that would be clipped refuses instead, see the module docstring).
        quantization_range: Grid points over [-clipping_range, clipping_range]; the error shrinks with it, and
            ``clients per round * quantization_range`` must stay below 2^32.
        max_weight: The largest ``num_examples`` a client may have (its weight is ``num_examples / max_weight``);
            closest to the largest client's count gives the smallest error.
        timeout: Seconds the server waits for the replies of each stage (the third includes local training);
            None: no limit, a node that never answers stalls the round.
    """

    num_shares: int | float = 1.0
    reconstruction_threshold: int | float = 0.67
    clipping_range: float = 8.0
    quantization_range: int = 2**22
    max_weight: float = 1000.0
    timeout: float | None = None

    def __post_init__(self) -> None:
        problems = []
        shares, threshold = self.num_shares, self.reconstruction_threshold
        if (
            isinstance(shares, bool)
            or not isinstance(shares, int | float)
            or (shares <= 2 if isinstance(shares, int) else not 0 < shares <= 1)
        ):
            problems.append(
                f"{OPTION}.num_shares={shares!r} must be an integer > 2 or a fraction in (0, 1] of the "
                "round's clients (1.0: every client)"
            )
        if (
            isinstance(threshold, bool)
            or not isinstance(threshold, int | float)
            or (threshold < 2 if isinstance(threshold, int) else not 0 < threshold <= 1)
        ):
            problems.append(
                f"{OPTION}.reconstruction_threshold={threshold!r} must be an integer >= 2 or a fraction "
                "in (0, 1] of num_shares"
            )
        elif (
            isinstance(threshold, int)
            and isinstance(shares, int)
            and not isinstance(shares, bool)
            and threshold >= shares
        ):
            problems.append(f"{OPTION}.reconstruction_threshold={threshold} must be below num_shares={shares}")
        if not (isinstance(self.clipping_range, int | float) and self.clipping_range > 0):
            problems.append(f"{OPTION}.clipping_range={self.clipping_range!r} must be > 0")
        if (
            isinstance(self.quantization_range, bool)
            or not isinstance(self.quantization_range, int)
            or not 2 <= self.quantization_range < 2**31
        ):
            problems.append(
                f"{OPTION}.quantization_range={self.quantization_range!r} must be an integer in "
                "[2, 2^31) (default 2^22 = 4194304)"
            )
        if not (isinstance(self.max_weight, int | float) and self.max_weight > 0):
            problems.append(
                f"{OPTION}.max_weight={self.max_weight!r} must be > 0 (at least the largest client's "
                "number of training examples)"
            )
        if self.timeout is not None and not (isinstance(self.timeout, int | float) and self.timeout > 0):
            problems.append(f"{OPTION}.timeout={self.timeout!r} must be > 0 seconds or null (no limit)")
        if problems:
            raise ConfigError("; ".join(problems) + ".")

    @classmethod
    def from_config(cls, config: SecAggOptions | Mapping[str, Any] | str | bool | None) -> SecAggOptions | None:
        """The options from the run config's ``secure-aggregation``: a mapping of the fields above (or its JSON
        text), ``true`` for the defaults, ``false`` or null for no secure aggregation (None). Unknown keys are
        refused."""
        if isinstance(config, cls):
            return config
        if isinstance(config, str):
            config = _parse_setting(config)
        if config is None or config is False:
            return None
        if config is True:
            return cls()
        if not isinstance(config, Mapping):
            raise ConfigError(
                f"{OPTION}={config!r} must be true, false or a mapping of {[f.name for f in fields(cls)]}."
            )
        names = [f.name for f in fields(cls)]
        unknown = [k for k in config if k not in names]
        if unknown:
            hints = [
                f"{k!r} (did you mean {close[0]!r}?)" if (close := get_close_matches(str(k), names, 1)) else repr(k)
                for k in unknown
            ]
            raise ConfigError(f"{OPTION} has unknown keys {', '.join(hints)}; the keys are {names}.")
        return cls(**config)

    def resolved(self, num_clients: int) -> tuple[int, int]:
        """``(num_shares, threshold)`` for a round of ``num_clients``, as the workflow derives them (flwr 1.41)."""
        if isinstance(self.num_shares, float):
            shares = round(self.num_shares * num_clients)
            if shares < num_clients and shares % 2 == 0:
                shares += 1
            if shares <= 2:
                shares = num_clients
        else:
            shares = self.num_shares
        if isinstance(self.reconstruction_threshold, float):
            threshold = max(round(self.reconstruction_threshold * shares), 2)
        else:
            threshold = self.reconstruction_threshold
        return shares, threshold

    def workflow(self) -> SecAggPlusWorkflow:
        """Flower's workflow with these settings."""
        return SecAggPlusWorkflow(
            self.num_shares,
            self.reconstruction_threshold,
            max_weight=float(self.max_weight),
            clipping_range=float(self.clipping_range),
            quantization_range=self.quantization_range,
            modulus_range=MODULUS,
            timeout=self.timeout,
        )


def _definer(cls: type, name: str) -> type | None:
    return next((c for c in cls.__mro__ if name in vars(c)), None)


def _class_problem(cls: type) -> str | None:
    """Why ``cls`` cannot aggregate securely whatever its arguments, or None."""
    if not getattr(cls, "secure_aggregation", False):
        return "its aggregate needs each client's upload (secure_aggregation = False)"
    flag = _definer(cls, "secure_aggregation")
    for method in _READS_UPLOADS:
        owner = _definer(cls, method)
        if owner is not None and flag is not None and owner is not flag and issubclass(owner, flag):
            return (
                f"{owner.__name__} overrides {method} after {flag.__name__} declared secure_aggregation, "
                f"without declaring it again"
            )
    return None


def compatible_strategies() -> list[str]:
    """The strategies of :mod:`fedlit.strategies` that can aggregate securely (with their default arguments)."""
    import fedlit.strategies as strategies  # the registry, imported when asked: it loads every strategy

    classes = [getattr(strategies, n) for n in strategies.__all__]
    return sorted(
        c.__name__
        for c in classes
        if isinstance(c, type) and issubclass(c, Strategy) and not inspect.isabstract(c) and _class_problem(c) is None
    )


def check_secure_aggregation(strategy: Strategy) -> None:
    """Raise a ``ConfigError`` naming ``strategy`` and the reason when it cannot run under secure aggregation:
    its ``aggregate`` needs more than the ``num_examples``-weighted mean of the uploaded states
    (:attr:`~fedlit.strategies.Strategy.secure_aggregation`), its aggregator is not the weighted mean, its
    weighting is not by ``num_examples``, or it overrides a method that reads the uploads without declaring it."""
    why = _class_problem(type(strategy))
    if why is None and isinstance(strategy, FedAvg):
        if type(strategy.aggregator) is not WeightedMeanAggregator:
            why = f"its aggregator {strategy.aggregator!r} needs each client's upload"
        elif strategy.weighting != "num_examples":
            why = (
                f"strategy.init_args.weighting={strategy.weighting!r}: SecAgg+ weighs each upload by its "
                "num_examples (use weighting: num_examples)"
            )
    if why is not None:
        raise ConfigError(
            f"{OPTION}: {strategy!r} cannot aggregate securely: {why}. SecAgg+ reveals only the num_examples-"
            f"weighted mean of the uploads; strategies that need no more: {', '.join(compatible_strategies())}. "
            f"Use one of them or turn {OPTION} off."
        )


# ---- shared by the server side (secagg_server) and the client side (secagg_client) ---------------------------


def _numpy(tensor: Tensor) -> np.ndarray:
    tensor = tensor.detach().cpu()
    return (tensor.float() if tensor.dtype == torch.bfloat16 else tensor).numpy()  # numpy has no bfloat16


def _dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown tensor dtype {name!r} in a SecAgg+ message")
    return dtype
