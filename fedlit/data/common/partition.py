"""Partitioners: which samples of a pool go to which client.

Each partitioner is a pure function of a 1-D labels array and a ``numpy.random.Generator`` that returns one
array of sample indices per client, plus a small config class (what a YAML recipe names under
``data.init_args.partitioner``) that validates its hyperparameters when built and calls the function.

- ``IID``: a random equal split.
- ``Dirichlet``: per class, the shares of the clients are drawn from Dir(alpha) (Hsu et al., 2019).
- ``Pathological``: every client holds ``classes_per_client`` classes (McMahan et al., 2017).
- ``Shards``: the "practical non-IID" of Luo & Wu (APPLE, IJCAI 2022): per class one client gets ``major``,
  another ``minor``, the others share the rest equally.
- ``Natural``: the data set's own sites (hospitals, scanners) are the clients.
"""

from __future__ import annotations

import warnings
from abc import ABC, abstractmethod

import numpy as np
from typing_extensions import override

from fedlit.core.errors import ConfigError

_OPTION = "data.init_args.partitioner.init_args"


def _check_num_clients(num_samples: int, num_clients: int) -> None:
    if isinstance(num_clients, bool) or not isinstance(num_clients, int | np.integer) or num_clients < 1:
        raise ConfigError(
            f"data.init_args.num_clients must be a positive integer, got {num_clients!r}: set it to 1 or more"
        )
    if num_clients > num_samples:
        raise ConfigError(
            f"cannot give {num_clients} clients at least one sample out of {num_samples}: "
            f"lower data.init_args.num_clients to at most {num_samples}"
        )


def _largest_remainder(total: int, shares: np.ndarray) -> np.ndarray:
    """Integer counts proportional to ``shares`` that sum to ``total`` exactly (Hamilton's method)."""
    exact = total * shares / shares.sum()
    counts = np.floor(exact).astype(np.int64)
    # Ties go to the lower index (stable sort), so the rounding is deterministic.
    order = np.argsort(-(exact - counts), kind="stable")
    counts[order[: total - counts.sum()]] += 1
    return counts


def iid_partition(labels: np.ndarray, num_clients: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Split the samples uniformly at random into ``num_clients`` parts of (almost) equal size."""
    _check_num_clients(len(labels), num_clients)
    return [np.sort(part) for part in np.array_split(rng.permutation(len(labels)), num_clients)]


def dirichlet_partition(
    labels: np.ndarray,
    num_clients: int,
    rng: np.random.Generator,
    *,
    alpha: float,
    min_size: int = 2,
    max_tries: int = 1000,
) -> list[np.ndarray]:
    """Per class, split its samples among clients with proportions drawn from Dir(alpha).

    The whole draw is repeated until every client has at least ``min_size`` samples.

    Raises:
        ValueError: when no draw in ``max_tries`` gives every client ``min_size`` samples.
    """
    _check_num_clients(len(labels), num_clients)
    if num_clients * min_size > len(labels):
        raise ConfigError(
            f"{_OPTION}.min_size={min_size} needs {num_clients * min_size} samples for {num_clients} "
            f"clients, the pool has {len(labels)}: lower min_size or data.init_args.num_clients"
        )
    classes = np.unique(labels)
    for _ in range(max_tries):
        parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
        for c in classes:
            members = rng.permutation(np.flatnonzero(labels == c))
            proportions = rng.dirichlet(np.full(num_clients, alpha))
            cuts = (np.cumsum(proportions)[:-1] * len(members)).astype(np.int64)
            for client, chunk in enumerate(np.split(members, cuts)):
                parts[client].append(chunk)
        merged = [np.sort(np.concatenate(chunks)) for chunks in parts]
        if min(len(p) for p in merged) >= min_size:
            return merged
    raise ConfigError(
        f"Dirichlet(alpha={alpha}) gave some client fewer than min_size={min_size} samples in {max_tries} "
        f"draws ({len(labels)} samples, {num_clients} clients): raise {_OPTION}.alpha, lower "
        f"{_OPTION}.min_size or lower data.init_args.num_clients"
    )


def pathological_partition(
    labels: np.ndarray, num_clients: int, rng: np.random.Generator, *, classes_per_client: int
) -> list[np.ndarray]:
    """Give every client ``classes_per_client`` classes and split each class among the clients holding it.

    Classes are dealt round-robin over a shuffled class order, so every class is held by some client whenever
    ``num_clients * classes_per_client >= number of classes`` and holders are spread evenly over classes. If
    there are fewer slots than classes, the samples of the classes nobody holds are left out (with a warning).

    Raises:
        ValueError: if ``classes_per_client`` exceeds the number of classes, or a class has fewer samples than
            clients holding it (some client would miss one of its classes).
    """
    _check_num_clients(len(labels), num_clients)
    classes = np.unique(labels)
    if classes_per_client > len(classes):
        raise ConfigError(
            f"{_OPTION}.classes_per_client={classes_per_client} is more than the {len(classes)} classes "
            f"in the labels: set it between 1 and {len(classes)}"
        )
    order = rng.permutation(classes)
    holders: dict[int, list[int]] = {int(c): [] for c in classes}
    for client in range(num_clients):
        for slot in range(classes_per_client):
            holders[int(order[(client * classes_per_client + slot) % len(classes)])].append(client)
    left_out = [c for c, h in holders.items() if not h]
    if left_out:
        warnings.warn(
            f"Pathological: {num_clients} clients x {classes_per_client} classes cannot cover all "
            f"{len(classes)} classes; the samples of classes {left_out} are left out",
            stacklevel=2,
        )
    parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
    for c, clients in holders.items():
        if not clients:
            continue
        members = rng.permutation(np.flatnonzero(labels == c))
        if len(members) < len(clients):
            raise ConfigError(
                f"Pathological: class {c} has {len(members)} samples but {len(clients)} clients hold it: "
                f"lower {_OPTION}.classes_per_client or data.init_args.num_clients"
            )
        for client, chunk in zip(clients, np.array_split(members, len(clients)), strict=True):
            parts[client].append(chunk)
    return [np.sort(np.concatenate(chunks)) for chunks in parts]


def shards_partition(
    labels: np.ndarray, num_clients: int, rng: np.random.Generator, *, major: float = 0.8, minor: float = 0.1
) -> list[np.ndarray]:
    """Per class: one client gets ``major`` of it, another ``minor``, the others share the rest equally.

    The major client of class ``j`` is ``perm[j % num_clients]`` for a seeded permutation ``perm`` (so majors
    are spread over clients); the minor client is drawn among the others. Counts are rounded so each class is
    split exactly (largest remainder).

    Raises:
        ValueError: with fewer than 2 clients, or 2 clients and ``major + minor < 1`` (the rest has no owner).
    """
    _check_num_clients(len(labels), num_clients)
    rest = 1.0 - major - minor
    if num_clients < 2 or (num_clients == 2 and rest > 1e-12):
        raise ConfigError(
            f"Shards(major={major}, minor={minor}) needs 3 or more clients (2 when major + minor = 1), got "
            f"data.init_args.num_clients={num_clients}: raise num_clients"
        )
    perm = rng.permutation(num_clients)
    parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
    for j, c in enumerate(np.unique(labels)):
        members = rng.permutation(np.flatnonzero(labels == c))
        major_client = perm[j % num_clients]
        others = np.delete(np.arange(num_clients), major_client)
        minor_client = rng.choice(others)
        shares = np.full(num_clients, rest / max(num_clients - 2, 1))
        shares[major_client], shares[minor_client] = major, minor
        counts = _largest_remainder(len(members), shares)
        for client, chunk in enumerate(np.split(members, np.cumsum(counts)[:-1])):
            parts[client].append(chunk)
    return [np.sort(np.concatenate(chunks)) for chunks in parts]


def natural_partition(groups: np.ndarray) -> list[np.ndarray]:
    """One client per distinct value of ``groups`` (the site of each sample), in sorted order of values."""
    groups = np.asarray(groups)
    return [np.flatnonzero(groups == g) for g in np.unique(groups)]


class Partitioner(ABC):
    """Base of the partitioner configs: validates the call, then delegates to the pure function."""

    def __call__(
        self,
        labels: np.ndarray,
        num_clients: int,
        rng: np.random.Generator,
        *,
        groups: np.ndarray | None = None,
    ) -> list[np.ndarray]:
        """Split the pool into ``num_clients`` index arrays.

        Args:
            labels: one label per sample of the pool (1-D).
            num_clients: number of clients to create.
            rng: the generator that makes the split reproducible.
            groups: the site of each sample, for data sets that have sites (only ``Natural`` uses it).

        Returns:
            The sorted sample indices of each client.
        """
        labels = np.asarray(labels)
        if labels.ndim != 1:
            raise ConfigError(f"partitioners take one label per sample (1-D), got labels of shape {labels.shape}")
        return self._partition(labels, num_clients, rng, groups)

    @abstractmethod
    def _partition(
        self, labels: np.ndarray, num_clients: int, rng: np.random.Generator, groups: np.ndarray | None
    ) -> list[np.ndarray]: ...


class IID(Partitioner):
    """A uniformly random split into clients of (almost) equal size."""

    @override
    def _partition(
        self, labels: np.ndarray, num_clients: int, rng: np.random.Generator, groups: np.ndarray | None
    ) -> list[np.ndarray]:
        return iid_partition(labels, num_clients, rng)

    @override
    def __repr__(self) -> str:
        return "IID()"


class Dirichlet(Partitioner):
    """Label skew: per class, the clients' shares are drawn from Dir(alpha); small alpha means more skew.

    Args:
        alpha: concentration (> 0); FHBench uses 0.1, 0.5 is a common milder setting.
        min_size: fewest samples any client may get; the draw is repeated until this holds.
    """

    def __init__(self, *, alpha: float, min_size: int = 2) -> None:
        problems = []
        if not alpha > 0:
            problems.append(f"{_OPTION}.alpha must be > 0, got {alpha!r}: use e.g. 0.1 (skewed) to 100 (near IID)")
        if isinstance(min_size, bool) or not isinstance(min_size, int) or min_size < 1:
            problems.append(f"{_OPTION}.min_size must be an integer >= 1, got {min_size!r}")
        if problems:
            raise ConfigError("; ".join(problems))
        self.alpha = float(alpha)
        self.min_size = min_size

    @override
    def _partition(
        self, labels: np.ndarray, num_clients: int, rng: np.random.Generator, groups: np.ndarray | None
    ) -> list[np.ndarray]:
        return dirichlet_partition(labels, num_clients, rng, alpha=self.alpha, min_size=self.min_size)

    @override
    def __repr__(self) -> str:
        return f"Dirichlet(alpha={self.alpha}, min_size={self.min_size})"


class Pathological(Partitioner):
    """Every client holds exactly ``classes_per_client`` classes.

    Args:
        classes_per_client: classes per client, between 1 and the number of classes (checked when called).
    """

    def __init__(self, *, classes_per_client: int) -> None:
        if isinstance(classes_per_client, bool) or not isinstance(classes_per_client, int) or classes_per_client < 1:
            raise ConfigError(
                f"{_OPTION}.classes_per_client must be an integer >= 1, got {classes_per_client!r}: "
                "use e.g. 2 (Luo's thesis)"
            )
        self.classes_per_client = classes_per_client

    @override
    def _partition(
        self, labels: np.ndarray, num_clients: int, rng: np.random.Generator, groups: np.ndarray | None
    ) -> list[np.ndarray]:
        return pathological_partition(labels, num_clients, rng, classes_per_client=self.classes_per_client)

    @override
    def __repr__(self) -> str:
        return f"Pathological(classes_per_client={self.classes_per_client})"


class Shards(Partitioner):
    """Practical non-IID (Luo & Wu, APPLE, IJCAI 2022): per class, ``major`` to one client, ``minor`` to
    another.

    With 12 clients and the defaults this is 1 x 80%, 1 x 10% and 10 x 1% of every class.

    Args:
        major: share of each class given to its major client.
        minor: share given to its minor client; the remaining ``1 - major - minor`` is shared equally.
    """

    def __init__(self, *, major: float = 0.8, minor: float = 0.1) -> None:
        problems = []
        for name, value in (("major", major), ("minor", minor)):
            if not 0 <= value <= 1:
                problems.append(f"{_OPTION}.{name} must be in [0, 1], got {value!r}")
        if not problems and major + minor > 1 + 1e-12:
            problems.append(
                f"{_OPTION}.major + {_OPTION}.minor must be <= 1, got {major} + {minor} = {major + minor}: "
                "lower one of them (e.g. major=0.8, minor=0.1)"
            )
        if problems:
            raise ConfigError("; ".join(problems))
        self.major = float(major)
        self.minor = float(minor)

    @override
    def _partition(
        self, labels: np.ndarray, num_clients: int, rng: np.random.Generator, groups: np.ndarray | None
    ) -> list[np.ndarray]:
        return shards_partition(labels, num_clients, rng, major=self.major, minor=self.minor)

    @override
    def __repr__(self) -> str:
        return f"Shards(major={self.major}, minor={self.minor})"


class Natural(Partitioner):
    """The data set's own sites are the clients; only for data sets that record a site per sample."""

    @override
    def _partition(
        self, labels: np.ndarray, num_clients: int, rng: np.random.Generator, groups: np.ndarray | None
    ) -> list[np.ndarray]:
        if groups is None:
            raise ConfigError(
                "partitioner Natural() needs the site of each sample, and this data set has none: choose "
                "IID, Dirichlet, Pathological or Shards for data.init_args.partitioner"
            )
        parts = natural_partition(groups)
        if len(parts) != num_clients:
            raise ConfigError(
                f"partitioner Natural(): the data set has {len(parts)} sites but data.init_args.num_clients="
                f"{num_clients}: set num_clients to {len(parts)}"
            )
        return parts

    @override
    def __repr__(self) -> str:
        return "Natural()"
