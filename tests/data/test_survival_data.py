"""SyntheticSurvival, and what set-up accepts and refuses for targets of tasks without classes."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedlit.core.errors import DataError
from fedlit.data import FederatedDataModule, PartitionedData, SyntheticSurvival


def brute_force_c_index(risk: np.ndarray, time: np.ndarray, event: np.ndarray) -> float:
    """Harrell's C by its definition, pair by pair (ties in time: the event first when the other is censored)."""
    concordant = comparable = 0.0
    for i in range(len(risk)):
        for j in range(len(risk)):
            if event[i] == 1 and (time[i] < time[j] or (time[i] == time[j] and event[j] == 0)):
                comparable += 1
                concordant += 1.0 if risk[i] > risk[j] else 0.5 if risk[i] == risk[j] else 0.0
    return concordant / comparable


def test_sites_differ_in_covariates_and_censoring_with_a_known_true_risk():
    data = SyntheticSurvival(num_clients=4, samples_per_client=200, censoring=(0.2, 0.6), seed=3)
    assert data.task == "survival" and data.num_classes == 0 and data.class_counts() is None
    built = data.data
    assert built.targets.dtype == torch.float32 and built.targets.shape == (800, 2)
    assert set(built.targets[:, 1].unique().tolist()) == {0.0, 1.0} and bool((built.targets[:, 0] > 0).all())
    beta = np.array(built.details["beta"])
    assert np.linalg.norm(beta) == pytest.approx(2.0)
    shares, means = [], []
    for s, cid in enumerate(data.client_ids):
        rows = np.arange(s * 200, (s + 1) * 200)
        shares.append(1 - built.targets[rows, 1].mean().item())
        means.append(built.inputs[rows].mean(0).numpy())
        test = np.asarray(built.splits[cid]["test"])
        x, t, e = built.inputs[test].double().numpy(), built.targets[test, 0].numpy(), built.targets[test, 1].numpy()
        truth = brute_force_c_index(x @ beta, t, e)
        assert truth > 0.7
        assert built.details["sites"][cid]["true_risk_test_c_index"] == pytest.approx(truth)
        assert built.details["sites"][cid]["censoring_share"] == pytest.approx(shares[-1])
    # censoring shares spread over [0.2, 0.6] (within sampling noise of 200 patients), feature means apart
    assert sorted(shares) == pytest.approx([0.2, 0.2 + 0.4 / 3, 0.2 + 0.8 / 3, 0.6], abs=0.05)
    assert max(shares) - min(shares) > 0.25
    assert min(np.linalg.norm(a - b) for i, a in enumerate(means) for b in means[i + 1 :]) > 0.5
    for cid in data.client_ids:  # stratified by the event flag: every split has events
        for split in ("train", "val", "test"):
            rows = torch.as_tensor(built.splits[cid][split])
            assert built.targets[rows, 1].sum() > 0


def test_same_seed_same_data_and_bad_settings_name_the_option():
    a, b = SyntheticSurvival(seed=1).data, SyntheticSurvival(seed=1).data
    assert torch.equal(a.inputs, b.inputs) and torch.equal(a.targets, b.targets)
    assert not torch.equal(a.targets, SyntheticSurvival(seed=2).data.targets)
    with pytest.raises(ValueError, match=r"data.init_args.censoring must be \[low, high\].*got \[0.5, 0.2\]"):
        SyntheticSurvival(censoring=(0.5, 0.2))
    with pytest.raises(ValueError, match="data.init_args.baseline_hazard must be > 0"):
        SyntheticSurvival(baseline_hazard=0.0)


class Pool(FederatedDataModule):
    """One client over a given pool, for the set-up checks."""

    def __init__(self, task: str, targets: torch.Tensor, finite_targets: bool = True) -> None:
        super().__init__()
        self.pool = (task, targets, finite_targets)

    def build(self) -> PartitionedData:
        task, targets, finite = self.pool
        n = len(targets)
        splits = {"c": {"train": np.arange(n - 1), "val": np.arange(0), "test": np.array([n - 1])}}
        return PartitionedData(
            name="pool",
            task=task,
            num_classes=0,
            inputs=torch.zeros(n, 2),
            targets=targets,
            splits=splits,
            partitioner="natural",
            finite_targets=finite,
        )


def test_targets_of_other_tasks_are_accepted_with_any_shape_and_have_no_class_counts():
    regression = Pool("regression", torch.randn(4, 3, 2))
    regression.setup()
    assert regression.class_counts() is None
    survival = Pool("survival", torch.tensor([[1.0, 1.0], [0.0, 0.0], [2.5, 1.0]]))
    survival.setup()
    assert survival.class_counts() is None
    missing = torch.tensor([1.0, float("nan"), 2.0])
    Pool("regression", missing, finite_targets=False).setup()  # the task masks NaN labels itself
    with pytest.raises(DataError, match=r"target of sample 1 holds nan"):
        Pool("regression", missing).setup()


@pytest.mark.parametrize(
    ("targets", "expected"),
    [
        (
            torch.tensor([1.0, 2.0, 3.0]),
            r"survival targets must be a float tensor of shape \(N, 2\).*got torch.float32 "
            r"of shape \(3,\)",
        ),
        (torch.tensor([[1, 1], [2, 0]]), r"got torch.int64 of shape \(2, 2\)"),
        (torch.tensor([[1.0, 1.0], [-2.0, 0.0]]), r"target of sample 1 is \[-2.0, 0.0\]; column 0 must be a time >= 0"),
        (torch.tensor([[1.0, 2.0], [2.0, 0.0]]), r"target of sample 0 is \[1.0, 2.0\]; column 1 must be an event 0"),
        (torch.tensor([[1.0, 1.0], [float("inf"), 0.0]]), r"target of sample 1 holds inf"),
    ],
)
def test_bad_survival_targets_are_refused(targets, expected):
    with pytest.raises(DataError, match=expected):
        Pool("survival", targets).setup()
