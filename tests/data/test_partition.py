"""Partitioners and per-client splits: coverage, determinism, skew, exact shares and error messages."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, reject, settings
from hypothesis import strategies as st

from fedlit.data import (
    IID,
    Dirichlet,
    Natural,
    Partitioner,
    Pathological,
    Shards,
    check_split_fractions,
    natural_partition,
    split_clients,
    split_sizes,
    stratified_split,
)

FAST = settings(max_examples=40, deadline=None)


def _assert_exact_cover(parts: list[np.ndarray], n: int) -> None:
    everything = np.concatenate(parts)
    assert len(everything) == n, "some index is missing or repeated"
    assert np.array_equal(np.sort(everything), np.arange(n))


@st.composite
def labelled(draw: st.DrawFn, min_per_class: int = 1) -> tuple[np.ndarray, int]:
    """Random labels (2-6 classes, every class at least ``min_per_class`` times) and a client count."""
    num_classes = draw(st.integers(2, 6))
    num_clients = draw(st.integers(1, 8))
    per_class = max(min_per_class, num_clients)
    extra = draw(st.lists(st.integers(0, num_classes - 1), max_size=80))
    labels = np.array(list(np.repeat(np.arange(num_classes), per_class)) + extra)
    order = np.random.default_rng(draw(st.integers(0, 2**16))).permutation(len(labels))
    return labels[order], num_clients


@FAST
@given(labelled(), st.integers(0, 2**16))
def test_iid_covers_every_index_once_with_equal_sizes(case: tuple[np.ndarray, int], seed: int) -> None:
    labels, num_clients = case
    parts = IID()(labels, num_clients, np.random.default_rng(seed))
    _assert_exact_cover(parts, len(labels))
    sizes = [len(p) for p in parts]
    assert max(sizes) - min(sizes) <= 1


@FAST
@given(labelled(), st.floats(0.1, 50.0), st.integers(0, 2**16))
def test_dirichlet_covers_every_index_once(case: tuple[np.ndarray, int], alpha: float, seed: int) -> None:
    labels, num_clients = case
    try:
        parts = Dirichlet(alpha=alpha, min_size=1)(labels, num_clients, np.random.default_rng(seed))
    except ValueError as err:
        # Tiny pools with many clients and small alpha can be infeasible: that must be the documented error.
        assert "draws" in str(err) and "raise data.init_args.partitioner.init_args.alpha" in str(err)
        reject()
    _assert_exact_cover(parts, len(labels))
    assert min(len(p) for p in parts) >= 1


@FAST
@given(labelled(), st.integers(1, 6), st.integers(0, 2**16))
def test_pathological_covers_every_index_once_with_k_classes(case: tuple[np.ndarray, int], k: int, seed: int) -> None:
    labels, num_clients = case
    num_classes = len(np.unique(labels))
    k = min(k, num_classes)
    if num_clients * k < num_classes:
        num_clients = -(-num_classes // k)  # enough slots to cover every class
        labels = np.concatenate([labels, np.repeat(np.unique(labels), num_clients)])
    parts = Pathological(classes_per_client=k)(labels, num_clients, np.random.default_rng(seed))
    _assert_exact_cover(parts, len(labels))
    assert [len(np.unique(labels[p])) for p in parts] == [k] * num_clients


@FAST
@given(labelled(), st.integers(3, 12), st.integers(0, 2**16))
def test_shards_covers_every_index_once(case: tuple[np.ndarray, int], num_clients: int, seed: int) -> None:
    labels, _ = case
    labels = np.concatenate([labels, labels])  # at least 4 samples, so 3 clients always fit
    num_clients = min(num_clients, len(labels))
    parts = Shards()(labels, num_clients, np.random.default_rng(seed))
    _assert_exact_cover(parts, len(labels))


LABELS = np.random.default_rng(123).integers(0, 5, size=600)
PARTITIONERS = [IID(), Dirichlet(alpha=0.5), Pathological(classes_per_client=2), Shards()]


@pytest.mark.parametrize("partitioner", PARTITIONERS, ids=repr)
def test_same_seed_same_partition_other_seed_different(partitioner: Partitioner) -> None:
    first = partitioner(LABELS, 6, np.random.default_rng(7))
    again = partitioner(LABELS, 6, np.random.default_rng(7))
    other = partitioner(LABELS, 6, np.random.default_rng(8))
    assert all(np.array_equal(a, b) for a, b in zip(first, again, strict=True))
    assert not all(np.array_equal(a, b) for a, b in zip(first, other, strict=True))


def _mean_distance_to_global(alpha: float) -> float:
    """Average total-variation distance between a client's label distribution and the pool's, over seeds."""
    global_share = np.bincount(LABELS, minlength=5) / len(LABELS)
    distances = []
    for seed in range(5):
        for part in Dirichlet(alpha=alpha)(LABELS, 10, np.random.default_rng(seed)):
            share = np.bincount(LABELS[part], minlength=5) / len(part)
            distances.append(0.5 * np.abs(share - global_share).sum())
    return float(np.mean(distances))


def test_dirichlet_small_alpha_is_more_skewed_than_large_alpha() -> None:
    skewed, near_iid = _mean_distance_to_global(0.1), _mean_distance_to_global(100.0)
    assert skewed > 0.4
    assert near_iid < 0.1
    assert skewed > 4 * near_iid


def test_pathological_spreads_holders_evenly_and_covers_all_classes() -> None:
    labels = np.repeat(np.arange(10), 30)
    parts = Pathological(classes_per_client=2)(labels, 5, np.random.default_rng(0))
    # 5 clients x 2 classes = 10 slots for 10 classes: each class with one client, the whole class.
    assert sorted(len(p) for p in parts) == [60] * 5
    assert sorted(int(c) for p in parts for c in np.unique(labels[p])) == list(range(10))


def test_pathological_warns_and_leaves_out_classes_without_a_holder() -> None:
    labels = np.repeat(np.arange(6), 10)
    with pytest.warns(UserWarning, match="cannot cover all 6 classes"):
        parts = Pathological(classes_per_client=1)(labels, 3, np.random.default_rng(0))
    assert len(np.concatenate(parts)) == 30
    assert [len(np.unique(labels[p])) for p in parts] == [1, 1, 1]


def test_shards_with_12_clients_gives_80_10_and_ten_times_1_percent() -> None:
    labels = np.repeat([0, 1], [100, 200])
    parts = Shards(major=0.8, minor=0.1)(labels, 12, np.random.default_rng(0))
    per_class = np.array([[np.sum(labels[p] == c) for p in parts] for c in (0, 1)])
    assert sorted(per_class[0]) == [1] * 10 + [10, 80]
    assert sorted(per_class[1]) == [2] * 10 + [20, 160]
    # The two classes have different major clients (majors are spread over clients).
    assert per_class[0].argmax() != per_class[1].argmax()


def test_shards_rounds_each_class_to_its_exact_size() -> None:
    labels = np.repeat([0, 1, 2], [37, 53, 11])
    parts = Shards(major=0.6, minor=0.2)(labels, 5, np.random.default_rng(3))
    for c, size in enumerate((37, 53, 11)):
        counts = np.array([np.sum(labels[p] == c) for p in parts])
        assert counts.sum() == size
        expected = np.sort(size * np.array([0.2 / 3, 0.2 / 3, 0.2 / 3, 0.2, 0.6]))
        assert np.all(np.abs(np.sort(counts) - expected) < 1)


def test_natural_groups_by_site_in_sorted_order() -> None:
    groups = np.array([2, 0, 2, 1, 0, 2])
    assert [p.tolist() for p in natural_partition(groups)] == [[1, 4], [3], [0, 2, 5]]
    parts = Natural()(np.zeros(6), 3, np.random.default_rng(0), groups=groups)
    assert [p.tolist() for p in parts] == [[1, 4], [3], [0, 2, 5]]


def test_natural_errors() -> None:
    with pytest.raises(ValueError, match="Natural\\(\\) needs the site of each sample"):
        Natural()(np.zeros(6), 3, np.random.default_rng(0))
    with pytest.raises(ValueError, match="has 3 sites but data.init_args.num_clients=4"):
        Natural()(np.zeros(6), 4, np.random.default_rng(0), groups=np.array([0, 0, 1, 1, 2, 2]))


def test_reprs_show_hyperparameters() -> None:
    assert repr(Dirichlet(alpha=0.1, min_size=3)) == "Dirichlet(alpha=0.1, min_size=3)"
    assert repr(Pathological(classes_per_client=2)) == "Pathological(classes_per_client=2)"
    assert repr(Shards(major=0.7, minor=0.2)) == "Shards(major=0.7, minor=0.2)"
    assert repr(IID()) == "IID()" and repr(Natural()) == "Natural()"


@pytest.mark.parametrize("alpha", [0.0, -1.0])
def test_dirichlet_rejects_non_positive_alpha(alpha: float) -> None:
    with pytest.raises(ValueError, match=rf"data\.init_args\.partitioner\.init_args\.alpha must be > 0, got {alpha}"):
        Dirichlet(alpha=alpha)


def test_dirichlet_reports_impossible_min_size() -> None:
    labels = np.repeat([0, 1], [50, 50])
    with pytest.raises(ValueError, match=r"raise data\.init_args\.partitioner\.init_args\.alpha"):
        Dirichlet(alpha=0.01, min_size=9)(labels, 10, np.random.default_rng(0))
    with pytest.raises(ValueError, match=r"min_size=20 needs 200 samples for 10 clients"):
        Dirichlet(alpha=1.0, min_size=20)(labels, 10, np.random.default_rng(0))


def test_pathological_rejects_bad_classes_per_client() -> None:
    with pytest.raises(ValueError, match=r"partitioner\.init_args\.classes_per_client must be an integer >= 1"):
        Pathological(classes_per_client=0)
    with pytest.raises(ValueError, match=r"classes_per_client=4 is more than the 3 classes"):
        Pathological(classes_per_client=4)(np.repeat([0, 1, 2], 5), 2, np.random.default_rng(0))


def test_more_clients_than_samples_is_refused() -> None:
    message = "cannot give 50 clients at least one sample out of 30: lower data.init_args.num_clients"
    for partitioner in PARTITIONERS:
        with pytest.raises(ValueError, match=message):
            partitioner(np.repeat([0, 1], 15), 50, np.random.default_rng(0))


def test_shards_rejects_major_plus_minor_above_one() -> None:
    with pytest.raises(ValueError, match=r"init_args\.major \+ data\.init_args\.partitioner\.init_args\.minor"):
        Shards(major=0.8, minor=0.3)
    with pytest.raises(ValueError, match="needs 3 or more clients"):
        Shards()(np.repeat([0, 1], 10), 2, np.random.default_rng(0))


def test_split_sizes_are_exact_and_fill_every_requested_split() -> None:
    assert split_sizes(10, (0.4, 0.3, 0.3)).tolist() == [4, 3, 3]
    assert split_sizes(11, (0.4, 0.3, 0.3)).tolist() == [5, 3, 3]
    assert split_sizes(3, (0.8, 0.1, 0.1)).tolist() == [1, 1, 1]
    assert split_sizes(5, (0.5, 0.0, 0.5)).tolist() == [3, 0, 2]


def test_stratified_split_keeps_class_shares_within_one_sample() -> None:
    labels = np.repeat([0, 1, 2], [100, 40, 7])
    indices = np.arange(len(labels)) + 1000
    parts = stratified_split(indices, labels, (0.4, 0.3, 0.3), np.random.default_rng(0))
    assert [len(p) for p in parts] == split_sizes(147, (0.4, 0.3, 0.3)).tolist()
    _assert_exact_cover([p - 1000 for p in parts], 147)
    for part, fraction in zip(parts, (0.4, 0.3, 0.3), strict=True):
        counts = np.bincount(labels[part - 1000], minlength=3)
        assert np.all(np.abs(counts - fraction * np.array([100, 40, 7])) <= 1.0 + 1e-9)


def test_split_clients_with_zero_val_fraction_gives_empty_val() -> None:
    labels = np.repeat([0, 1], 20)
    splits = split_clients([np.arange(0, 20), np.arange(20, 40)], labels, (0.5, 0.0, 0.5),
                           np.random.default_rng(0), ["a", "b"])  # fmt: skip
    assert [len(splits["a"][s]) for s in ("train", "val", "test")] == [10, 0, 10]
    with pytest.raises(ValueError, match=r"client 'b' got 2 samples, fewer than the 3 non-empty splits"):
        split_clients([np.arange(5), np.arange(5, 7)], labels, (0.4, 0.3, 0.3), np.random.default_rng(0), ["a", "b"])


@pytest.mark.parametrize(
    "fractions", [(0.5, 0.5), (0.5, 0.6, 0.3), (0.0, 0.5, 0.5), (0.7, 0.3, 0.0), (1.2, -0.1, -0.1)]
)
def test_bad_split_fractions_name_the_option(fractions: tuple[float, ...]) -> None:
    with pytest.raises(ValueError, match=r"data\.init_args\.split_fractions must be three fractions"):
        check_split_fractions(fractions)
