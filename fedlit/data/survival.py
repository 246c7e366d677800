"""A generated, censored survival data set from sites that differ, with a known true hazard."""

from __future__ import annotations

import numpy as np
import torch
from typing_extensions import override

from fedlit.core.errors import ConfigError
from fedlit.core.metrics import concordance_index
from fedlit.data.common.datamodule import FederatedDataModule, is_int
from fedlit.data.common.pool import PartitionedData
from fedlit.data.common.splits import check_split_fractions, split_clients


class SyntheticSurvival(FederatedDataModule):
    """Tabular patients with a time to event from a known proportional-hazards model, censored per site.

    Source: generated in code from ``seed`` (no files, no download); license: part of fedlit (Apache-2.0).

    Protocol: a true coefficient vector beta (``num_features`` values drawn once, scaled to norm ``signal``) is
    shared by every site. Site s draws its patients' features as x = mu_s + scale_s * z, z ~ N(0, I), with its
    own mean mu_s ~ N(0, covariate_shift^2 I) and scale spread over [0.7, 1.3] (covariate shift). The event time
    is exponential with hazard ``baseline_hazard * exp(x . beta)``, so the true risk score is x . beta.
    Each site is censored at an exponential time whose rate gives it a censoring share spread evenly over
    ``censoring`` (low, high) in a seeded order: sites differ in how much follow-up they lose. A patient's
    target is (min(event, censoring time), 1 if the event came first else 0), float32 (N, 2); splits are
    stratified by the event flag, so every split holds events. The manifest's ``details`` give beta and per site
    the mean shift, scale, censoring rate and share, and the C-index of the true risk on its test split (the
    ceiling a model can reach there: 0.78 to 0.92 with the defaults).

    Args:
        num_clients: number of sites; client ids are ``site_0``, ``site_1``, ...
        samples_per_client: patients per site.
        num_features: features per patient.
        signal: norm of beta (larger = risk easier to rank, a higher true C-index).
        covariate_shift: standard deviation of the sites' feature means.
        censoring: (low, high) censoring shares of the sites, each in [0, 0.95].
        baseline_hazard: hazard of a patient whose risk score is 0 (events per unit of time).
        split_fractions: (train, val, test) fractions of every site; val may be 0 (no validation split).
        batch_size: training batch size (the Cox loss's risk sets are those within a batch).
        eval_batch_size: val/test batch size (default ``batch_size``).
        num_workers: DataLoader worker processes.
        seed: seed of the coefficients, patients, censoring and splits.
    """

    task = "survival"

    def __init__(
        self,
        *,
        num_clients: int = 4,
        samples_per_client: int = 300,
        num_features: int = 8,
        signal: float = 2.0,
        covariate_shift: float = 1.0,
        censoring: tuple[float, float] = (0.2, 0.6),
        baseline_hazard: float = 0.1,
        split_fractions: tuple[float, float, float] = (0.6, 0.2, 0.2),
        batch_size: int = 64,
        eval_batch_size: int | None = None,
        num_workers: int = 0,
        seed: int = 0,
    ) -> None:
        super().__init__(batch_size=batch_size, eval_batch_size=eval_batch_size, num_workers=num_workers, seed=seed)
        check_split_fractions(split_fractions)
        problems = []
        for name, value, low in (
            ("num_clients", num_clients, 1),
            ("num_features", num_features, 1),
            ("samples_per_client", samples_per_client, 10),
        ):
            if not is_int(value) or value < low:
                problems.append(f"data.init_args.{name} must be an integer >= {low}, got {value!r}")
        for name, number in (("signal", signal), ("covariate_shift", covariate_shift)):
            if not number >= 0:
                problems.append(f"data.init_args.{name} must be >= 0, got {number!r}")
        if not baseline_hazard > 0:
            problems.append(f"data.init_args.baseline_hazard must be > 0, got {baseline_hazard!r}")
        if len(censoring) != 2 or not 0 <= censoring[0] <= censoring[1] <= 0.95:
            problems.append(
                f"data.init_args.censoring must be [low, high] with 0 <= low <= high <= 0.95, got "
                f"{list(censoring)!r}: e.g. [0.2, 0.6]"
            )
        if problems:
            raise ConfigError("; ".join(problems))
        self.num_clients, self.samples_per_client, self.num_features = num_clients, samples_per_client, num_features
        self.signal, self.covariate_shift = float(signal), float(covariate_shift)
        self.censoring = (float(censoring[0]), float(censoring[1]))
        self.baseline_hazard = float(baseline_hazard)
        self.split_fractions = tuple(float(f) for f in split_fractions)

    @override
    @property
    def num_classes(self) -> int:
        """0: survival targets have no classes."""
        return 0

    @override
    def build(self) -> PartitionedData:
        data_rng, split_rng = np.random.default_rng(self.seed).spawn(2)
        n_sites, n, d = self.num_clients, self.samples_per_client, self.num_features
        beta = data_rng.standard_normal(d)
        beta *= self.signal / max(float(np.linalg.norm(beta)), 1e-12)
        means = data_rng.normal(0.0, self.covariate_shift, (n_sites, d))
        order = data_rng.permutation(n_sites)

        def spread(low: float, high: float) -> np.ndarray:
            # Evenly spaced values in a seeded order: sites always differ, whatever the seed.
            return np.linspace(low, high, n_sites)[order] if n_sites > 1 else np.array([(low + high) / 2])

        scales, shares = spread(0.7, 1.3), spread(*self.censoring)
        features, targets, sites_info = [], [], {}
        client_ids = [f"site_{s}" for s in range(n_sites)]
        for s, cid in enumerate(client_ids):
            x = means[s] + scales[s] * data_rng.standard_normal((n, d))
            hazard = self.baseline_hazard * np.exp(x @ beta)
            event_time = data_rng.exponential(1.0 / hazard)
            rate = _censoring_rate(hazard, shares[s])
            censor_time = data_rng.exponential(1.0 / rate, n) if rate > 0 else np.full(n, np.inf)
            event = event_time <= censor_time
            features.append(x)
            targets.append(np.stack([np.where(event, event_time, censor_time), event], axis=1))
            sites_info[cid] = {
                "mean_shift_norm": float(np.linalg.norm(means[s])),
                "scale": float(scales[s]),
                "censoring_rate": float(rate),
                "censoring_share": float(1 - event.mean()),
            }
        inputs = torch.from_numpy(np.concatenate(features).astype(np.float32))
        target = torch.from_numpy(np.concatenate(targets).astype(np.float32))
        parts = [np.arange(s * n, (s + 1) * n) for s in range(n_sites)]
        splits = split_clients(
            parts, target[:, 1].numpy().astype(np.int64), self.split_fractions, split_rng, client_ids
        )
        true_risk = inputs.double() @ torch.from_numpy(beta)
        for cid in client_ids:
            test = torch.as_tensor(splits[cid]["test"], dtype=torch.int64)
            sites_info[cid]["true_risk_test_c_index"] = concordance_index(
                true_risk[test], target[test, 0], target[test, 1]
            )
        return PartitionedData(
            name="synthetic_survival",
            task="survival",
            num_classes=0,
            inputs=inputs,
            targets=target,
            splits=splits,
            partitioner="Natural()",
            details={
                "beta": beta.tolist(),
                "baseline_hazard": self.baseline_hazard,
                "pool": f"site s holds pool rows [s * {n}, (s + 1) * {n})",
                "split_fractions": list(self.split_fractions),
                "sites": sites_info,
            },
        )


def _censoring_rate(hazard: np.ndarray, share: float) -> float:
    """The rate c of an exponential censoring time that censors ``share`` of the patients in expectation.

    A patient with event hazard h is censored first with probability c / (c + h); the mean over patients
    grows with c, so c is found by bisection (on a log scale).
    """
    if share <= 0:
        return 0.0
    low, high = 1e-12, 1e12
    for _ in range(200):
        mid = (low * high) ** 0.5
        if np.mean(mid / (mid + hazard)) < share:
            low = mid
        else:
            high = mid
    return float((low * high) ** 0.5)
