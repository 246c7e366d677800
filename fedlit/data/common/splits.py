"""Per-client train/val/test splits (FHBench splits every client 4:3:3 after partitioning)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from fedlit.core.errors import ConfigError, DataError

SPLITS = ("train", "val", "test")


def check_split_fractions(fractions: Sequence[float], option: str = "data.init_args.split_fractions") -> None:
    """Validate (train, val, test) fractions: three numbers >= 0 summing to 1, train and test > 0.

    Raises:
        ValueError: naming ``option``, the value received and what is allowed.
    """
    values = tuple(fractions)
    allowed = "three fractions (train, val, test) >= 0 that sum to 1, train and test > 0, e.g. (0.4, 0.3, 0.3)"
    if len(values) != 3:
        raise ConfigError(f"{option} must be {allowed}; got {values!r}")
    if any(not f >= 0 for f in values) or values[0] <= 0 or values[2] <= 0 or abs(sum(values) - 1) > 1e-6:
        raise ConfigError(f"{option} must be {allowed}; got {values!r} (sum {sum(values):g})")


def split_sizes(num_samples: int, fractions: Sequence[float]) -> np.ndarray:
    """Sizes of the splits of ``num_samples`` samples, proportional to ``fractions`` and summing exactly.

    Rounding is by largest remainder, then every split with a fraction > 0 gets at least one sample (taken
    from the largest split), so a client never has an empty train, val or test split it was promised.

    Raises:
        ValueError: if there are fewer samples than splits with a fraction > 0.
    """
    shares = np.asarray(fractions, dtype=np.float64)
    wanted = int((shares > 0).sum())
    if num_samples < wanted:
        raise ConfigError(f"cannot split {num_samples} samples into {wanted} non-empty splits {tuple(fractions)}")
    exact = num_samples * shares / shares.sum()
    sizes = np.floor(exact).astype(np.int64)
    sizes[np.argsort(-(exact - sizes), kind="stable")[: num_samples - sizes.sum()]] += 1
    for i in np.flatnonzero((shares > 0) & (sizes == 0)):
        sizes[np.argmax(sizes)] -= 1
        sizes[i] += 1
    return sizes


def stratified_split(
    indices: np.ndarray, labels: np.ndarray, fractions: Sequence[float], rng: np.random.Generator
) -> list[np.ndarray]:
    """Split ``indices`` into parts of sizes ``split_sizes(len(indices), fractions)``, stratified by label.

    Each class is spread evenly over a random order (the k-th of its n members sits at (k + u) / n, u
    uniform), and that order is cut into consecutive parts. So every class lands in every part in proportion,
    to within one sample; a class with fewer members than parts simply lands where its random offset puts it
    (plain random). The split sizes are exact whatever the class counts.

    Args:
        indices: sample indices (into a pool) to split.
        labels: one 1-D label per entry of ``indices``.
        fractions: share of each part.
        rng: generator for the shuffles and offsets.

    Returns:
        One sorted index array per fraction (empty where the fraction is 0).
    """
    indices = np.asarray(indices)
    labels = np.asarray(labels)
    keys = np.empty(len(indices), dtype=np.float64)
    for c in np.unique(labels):
        members = np.flatnonzero(labels == c)
        keys[rng.permutation(members)] = (np.arange(len(members)) + rng.random()) / len(members)
    # The tie-break by a random permutation keeps classes with equal keys from always landing in one order.
    order = np.lexsort((rng.permutation(len(indices)), keys))
    bounds = np.cumsum(split_sizes(len(indices), fractions))[:-1]
    return [np.sort(indices[part]) for part in np.split(order, bounds)]


def split_clients(
    parts: Sequence[np.ndarray],
    labels: np.ndarray,
    fractions: Sequence[float],
    rng: np.random.Generator,
    client_ids: Sequence[str],
) -> dict[str, dict[str, np.ndarray]]:
    """Split every client's pool indices into train/val/test, stratified by ``labels`` (indexed by pool
    index).

    Raises:
        DataError: if a client has fewer samples than the splits it must fill (naming the client).
    """
    splits: dict[str, dict[str, np.ndarray]] = {}
    for client_id, part in zip(client_ids, parts, strict=True):
        needed = sum(f > 0 for f in fractions)
        if len(part) < needed:
            raise DataError(
                f"client {client_id!r} got {len(part)} samples, fewer than the {needed} non-empty splits of "
                f"data.init_args.split_fractions={tuple(fractions)}: lower data.init_args.num_clients or "
                "use a partitioner that gives larger clients (e.g. a larger Dirichlet min_size)"
            )
        splits[client_id] = dict(zip(SPLITS, stratified_split(part, labels[part], fractions, rng), strict=True))
    return splits


def split_problems(
    where: str,
    client_id: str,
    splits: dict[str, np.ndarray],
    size: int,
    *,
    unit: str,
    fix: str,
    train_required: bool = True,
) -> list[str]:
    """What is wrong with one client's splits, as messages: a missing split, an empty train or test split, or an
    entry outside ``0..size-1``.

    Args:
        where: The data set, as messages name it.
        client_id: The client.
        splits: Split name -> indices (into the pool) or positions (into the client's samples).
        size: How many samples the indices may address.
        unit: What the entries are, for the messages (``"index"`` into the pool, ``"position"`` in the client's
            samples).
        fix: What to change when a train or test split is empty.
        train_required: False for a client that is only evaluated (its train split may be empty).
    """
    missing = [s for s in SPLITS if s not in splits]
    if missing:
        return [
            f"{where}: client {client_id!r} has no {missing} split; give every client train, val and test "
            f"{unit} arrays (an empty val array means no validation split)"
        ]
    problems = []
    sizes = {s: len(splits[s]) for s in SPLITS}
    for split in ("train", "test") if train_required else ("test",):
        if sizes[split] == 0:
            problems.append(
                f"client {client_id!r} has 0 {split} samples in {where} (train {sizes['train']}, val "
                f"{sizes['val']}, test {sizes['test']}): every client needs at least one train and one test "
                f"sample; {fix}"
            )
    for split in SPLITS:
        entries = np.asarray(splits[split])
        if len(entries) and (entries.min() < 0 or entries.max() >= size):
            bad = int(entries[(entries < 0) | (entries >= size)][0])
            problems.append(
                f"{where}: client {client_id!r}'s {split} split holds {unit} {bad}, outside the "
                f"{size} samples {'of the pool' if unit == 'index' else 'of the client'}"
            )
    return problems
