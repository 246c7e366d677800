"""Harrell's C-index and the Cox loss against maintained libraries, on random data with tied times, tied risks and
censoring: lifelines (the C-index FLamby's Fed-TCGA-BRCA benchmark reports, and its Cox fit) and torchsurv (a
Cox partial likelihood with Breslow's ties, which lifelines does not offer: its Cox model uses Efron's).

Conventions: lifelines' ``concordance_index`` takes a predicted survival time (higher = later event), so it is
given -risk, as FLamby does; torchsurv's ``neg_partial_log_likelihood`` takes (log hazard, event, time).
"""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
import pytest
import torch
from lifelines import CoxPHFitter
from lifelines.utils import concordance_index as lifelines_concordance_index
from torchsurv.loss.cox import neg_partial_log_likelihood

from fedlit.tasks import concordance_index, cox_loss


def _random_survival(seed: int, n: int = 80) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Risks on a coarse grid (ties), integer times 1..10 (ties, among events too), 30% to 85% censored."""
    generator = torch.Generator().manual_seed(seed)
    risk = torch.randint(-4, 5, (n,), generator=generator).double() / 2
    time = torch.randint(1, 11, (n,), generator=generator).double()
    censoring = 0.3 + 0.55 * seed / 7
    event = (torch.rand(n, generator=generator) >= censoring).double()
    return risk, time, event


@pytest.mark.parametrize("seed", range(8))
def test_c_index_matches_lifelines_with_tied_times_tied_risks_and_censoring(seed):
    risk, time, event = _random_survival(seed)
    expected = lifelines_concordance_index(time.numpy(), -risk.numpy(), event.numpy())
    assert concordance_index(risk, time, event) == pytest.approx(expected, abs=1e-12)
    assert concordance_index(risk, time, event, block=7) == pytest.approx(expected, abs=1e-12)


@pytest.mark.parametrize("seed", range(8))
def test_cox_loss_matches_torchsurv_breslow_with_tied_event_times(seed):
    risk, time, event = _random_survival(seed)
    events = event.sum().item()
    assert len(time[event > 0].unique()) < events  # tied event times: Breslow's and Efron's differ here
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torchsurv warns that it found ties
        total = neg_partial_log_likelihood(risk, event.bool(), time, ties_method="breslow", reduction="sum").item()
        per_time = neg_partial_log_likelihood(risk, event.bool(), time, ties_method="breslow").item()
    assert cox_loss(risk, time, event).item() == pytest.approx(total / events, rel=1e-5)
    assert cox_loss(risk, time, event, "samples").item() == pytest.approx(total / len(time), rel=1e-5)
    # torchsurv's "mean" averages over the distinct event times, not the events: only equal without ties
    assert per_time == pytest.approx(total / len(time[event > 0].unique()), rel=1e-5)


@pytest.mark.parametrize("seed", range(3))
def test_lifelines_cox_fit_maximizes_our_partial_likelihood_without_ties(seed):
    # continuous times (no ties: Efron's = Breslow's): lifelines' log-likelihood at its fit is -events x our loss,
    # and our loss's gradient there is 0 (the same function, at its optimum)
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(150, 3))
    event_time = rng.exponential(1 / np.exp(x @ np.array([1.0, -0.5, 0.0])))
    censor_time = rng.exponential(1.0, size=150)
    frame = pd.DataFrame(x, columns=["a", "b", "c"])
    frame["time"], frame["event"] = np.minimum(event_time, censor_time), (event_time <= censor_time).astype(float)
    fitter = CoxPHFitter().fit(frame, duration_col="time", event_col="event")
    beta = torch.tensor(fitter.params_[["a", "b", "c"]].to_numpy(), requires_grad=True)
    time, event = torch.tensor(frame["time"].to_numpy()), torch.tensor(frame["event"].to_numpy())
    loss = cox_loss(torch.tensor(x) @ beta, time, event)
    loss.backward()
    assert loss.item() == pytest.approx(-fitter.log_likelihood_ / event.sum().item(), rel=1e-5)
    assert beta.grad.abs().max().item() < 1e-4
