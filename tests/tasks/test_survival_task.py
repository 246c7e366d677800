"""Survival: the Cox loss and Harrell's C-index against hand-worked values, the Cox module, and the survival recipe
through the ``fedlit`` command."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from fedlit.cli import run
from fedlit.core.errors import ConfigError
from fedlit.core.roles import RoleRule, role_summary_table
from fedlit.models import Identity, SmallCNN
from fedlit.tasks import CoxModule, concordance_index, cox_loss

ROOT = Path(__file__).resolve().parents[2]


def test_cox_loss_by_hand_with_tied_events_and_a_censored_sample():
    # times 1, 2, 2, 3; events at 1 and at 2 (twice: a tie), the sample at 3 censored; exp(risk) = 1, 2, 1, 3.
    # Breslow: the risk set at t = 1 is everyone (1 + 2 + 1 + 3 = 7); at t = 2 both tied events keep the full set
    # {t >= 2} (2 + 1 + 3 = 6). log PL = (0 - ln 7) + (ln 2 - ln 6) + (0 - ln 6); loss = -log PL / 3 events
    #   = (ln 7 - ln 2 + 2 ln 6) / 3 = ln(126) / 3.
    # (Efron's correction would give the second tied event 6 - (2 + 1) / 2 = 4.5 instead, and another value.)
    risk = torch.tensor([0.0, math.log(2.0), 0.0, math.log(3.0)])
    time, event = torch.tensor([1.0, 2.0, 2.0, 3.0]), torch.tensor([1.0, 1.0, 1.0, 0.0])
    assert cox_loss(risk, time, event).item() == pytest.approx(math.log(126.0) / 3, rel=1e-6)
    # the order of the samples does not matter
    perm = torch.tensor([3, 1, 0, 2])
    assert cox_loss(risk[perm], time[perm], event[perm]).item() == pytest.approx(math.log(126.0) / 3, rel=1e-6)


def test_cox_loss_normalized_by_events_or_by_samples_by_hand():
    # times 1, 2, 3, 4, only the sample at 2 has its event, every risk 0: the one term of the partial likelihood is
    # r_2 - ln(e^0 + e^0 + e^0) (risk set {2, 3, 4}), so -log PL = ln 3. Divided by 1 event: ln 3; by 4 samples
    # (FLamby's Fed-TCGA-BRCA loss): ln(3) / 4. Gradients of ln 3 - r_2 + ln(sum_{j>=2} e^r_j): sample 1 0 (never
    # at risk of another event), sample 2 -1 + 1/3, samples 3 and 4 +1/3 each; "samples" divides them by 4.
    time, event = torch.tensor([1.0, 2.0, 3.0, 4.0]), torch.tensor([0.0, 1.0, 0.0, 0.0])
    for normalization, divisor in (("events", 1.0), ("samples", 4.0)):
        risk = torch.zeros(4, requires_grad=True)
        loss = cox_loss(risk, time, event, normalization)
        loss.backward()
        assert loss.item() == pytest.approx(math.log(3.0) / divisor, rel=1e-6)
        assert risk.grad.tolist() == pytest.approx([0.0, -2 / 3 / divisor, 1 / 3 / divisor, 1 / 3 / divisor])
    # the tied example above: 3 events of 4 samples, ln(126) / 3 by events, ln(126) / 4 by samples
    risk = torch.tensor([0.0, math.log(2.0), 0.0, math.log(3.0)])
    tied_time, tied_event = torch.tensor([1.0, 2.0, 2.0, 3.0]), torch.tensor([1.0, 1.0, 1.0, 0.0])
    assert cox_loss(risk, tied_time, tied_event, "samples").item() == pytest.approx(math.log(126.0) / 4, rel=1e-6)
    with pytest.raises(ValueError, match="cox_loss: normalization must be 'events' or 'samples', got 'mean'"):
        cox_loss(risk, tied_time, tied_event, "mean")


def test_cox_module_trains_and_reports_the_loss_with_its_normalization():
    inputs = torch.tensor([[0.0], [0.0], [0.0], [0.0]])
    targets = torch.tensor([[1.0, 0.0], [2.0, 1.0], [3.0, 0.0], [4.0, 0.0]])  # the example above: ln 3 over 1 or 4
    for normalization, divisor in (("events", 1.0), ("samples", 4.0)):
        module = CoxModule(backbone=Identity(num_features=1), loss_normalization=normalization)
        assert module.training_step((inputs, targets), 0)["loss"].item() == pytest.approx(math.log(3.0) / divisor)
        module.reset_metrics()
        module.validation_step((inputs, targets), 0)
        assert module.compute_metrics()["loss"] == pytest.approx(math.log(3.0) / divisor)
    with pytest.raises(
        ConfigError, match="model.init_args.loss_normalization must be 'events' or 'samples', got 'batch'"
    ):
        CoxModule(backbone=Identity(num_features=1), loss_normalization="batch")


def test_cox_roles_over_identity_report_no_default_rule_as_unmatched_but_keep_the_users():
    # Identity has no tensor: a default "backbone.* -> frozen" rule would be listed as matching nothing
    module = CoxModule(backbone=Identity(num_features=3))
    rules = [*module.default_role_rules(), *module.role_rules]
    assert "match no tensor" not in role_summary_table(module, module.parameter_roles(), rules)
    assert module.parameter_roles()["head.weight"] == "shared"
    mistyped = CoxModule(backbone=Identity(num_features=3), roles=[RoleRule("backbone.fc.*", "personal")])
    with pytest.warns(UserWarning, match="model.init_args.roles\\[0\\]: role rule pattern 'backbone.fc.\\*'"):
        roles = mistyped.parameter_roles()
    table = role_summary_table(mistyped, roles, [*mistyped.default_role_rules(), *mistyped.role_rules])
    assert table.endswith("Role rules that match no tensor: 'backbone.fc.*' -> personal")
    # a backbone with tensors is still frozen by default
    cnn = CoxModule(backbone=SmallCNN())
    assert {r for n, r in cnn.parameter_roles().items() if n.startswith("backbone.")} == {"frozen"}
    assert "match no tensor" not in role_summary_table(cnn, cnn.parameter_roles(), cnn.default_role_rules())


def test_cox_loss_matches_the_definition_on_random_data_with_ties():
    generator = torch.Generator().manual_seed(0)
    risk = torch.randn(40, generator=generator, dtype=torch.float64)
    time = torch.randint(1, 8, (40,), generator=generator).double()  # many ties
    event = (torch.rand(40, generator=generator) < 0.6).double()
    terms = [
        float(risk[i]) - math.log(sum(math.exp(risk[j]) for j in range(40) if time[j] >= time[i]))
        for i in range(40)
        if event[i] == 1
    ]
    assert cox_loss(risk, time, event).item() == pytest.approx(-sum(terms) / len(terms), rel=1e-5)


def test_cox_loss_without_events_is_zero_with_a_zero_gradient():
    risk = torch.tensor([0.3, -1.0], requires_grad=True)
    loss = cox_loss(risk, torch.tensor([1.0, 2.0]), torch.tensor([0.0, 0.0]))
    loss.backward()
    assert loss.item() == 0.0 and risk.grad.tolist() == [0.0, 0.0]


def test_c_index_by_hand_with_tied_times_tied_risks_and_censoring():
    # (time, event, risk): (1, 1, 5), (2, 1, 3), (2, 0, 4), (3, 1, 3), (4, 0, 1). Comparable pairs (i has its event
    # first, or at j's time when j is censored then): i=0 with 1, 2, 3, 4 -> 4 concordant (5 beats all);
    # i=1 with 2 (tied time, 2 censored), 3, 4 -> 3 < 4 discordant, 3 = 3 a tie (1/2), 3 > 1 concordant;
    # i=3 with 4 -> concordant. C = (4 + 1.5 + 1) / 8 = 0.8125 (without the tied-time pair: 6.5 / 7).
    time = torch.tensor([1.0, 2.0, 2.0, 3.0, 4.0])
    event = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.0])
    risk = torch.tensor([5.0, 3.0, 4.0, 3.0, 1.0])
    assert concordance_index(risk, time, event) == pytest.approx(0.8125)
    assert concordance_index(-risk, time, event) == pytest.approx(1 - 0.8125)  # reversed, the tie still 1/2
    assert concordance_index(risk, time, event, block=2) == pytest.approx(0.8125)
    # two events at the same time are not comparable, and censored samples alone give no pair
    assert math.isnan(concordance_index(torch.tensor([1.0, 2.0]), torch.tensor([3.0, 3.0]), torch.tensor([1.0, 1.0])))
    assert math.isnan(concordance_index(torch.tensor([1.0, 2.0]), torch.tensor([1.0, 3.0]), torch.tensor([0.0, 0.0])))


def test_cox_module_metrics_cover_the_whole_split():
    torch.manual_seed(0)
    module = CoxModule(backbone=Identity(num_features=2))
    with torch.no_grad():
        module.head.weight.copy_(torch.tensor([[1.0, 0.0]]))
    inputs = torch.tensor([[5.0, 9.0], [3.0, 9.0], [4.0, 9.0], [3.0, 9.0], [1.0, 9.0]])  # risk = first feature
    targets = torch.tensor([[1.0, 1.0], [2.0, 1.0], [2.0, 0.0], [3.0, 1.0], [4.0, 0.0]])
    module.reset_metrics()
    module.validation_step((inputs[:2], targets[:2]), 0)  # two batches: pairs across them count too
    module.validation_step((inputs[2:], targets[2:]), 1)
    metrics = module.compute_metrics()
    assert metrics["c_index"] == pytest.approx(0.8125)
    assert metrics["loss"] == pytest.approx(cox_loss(inputs[:, 0], targets[:, 0], targets[:, 1]).item())
    assert module.higher_is_better == {"c_index": True, "loss": False}
    assert module.default_selection_metric == "c_index"
    assert [n for n, _ in module.named_parameters()] == ["head.weight"]  # no bias: the partial likelihood ignores it
    module.reset_metrics()
    module.validation_step((inputs[2:3], targets[2:3]), 0)
    only_censored = module.compute_metrics()
    assert math.isnan(only_censored["loss"]) and math.isnan(only_censored["c_index"])


def test_survival_recipe_trains_through_the_cli_and_reports_the_c_index_per_client(tmp_path, capsys):
    results = run(
        [
            "fit",
            "--config",
            str(ROOT / "recipes" / "survival_cox.yaml"),
            "--out_dir",
            str(tmp_path),
            "--federation.progress_bar",
            "false",
        ]
    )
    printed = capsys.readouterr().out
    assert results["selection_metric"] == "c_index"
    c_index = {c: v["c_index"] for c, v in results["last"]["clients"].items()}
    # pinned (seed 0, 5 rounds); the true risk reaches 0.921 / 0.783 / 0.807 / 0.878 on these test splits, an
    # untrained or sign-flipped model is near or below 0.5
    assert c_index == pytest.approx({"site_0": 0.9137, "site_1": 0.7838, "site_2": 0.7991, "site_3": 0.8764}, abs=0.01)
    assert min(c_index.values()) > 0.6
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["last"]["summary"]["c_index_mean"] == pytest.approx(sum(c_index.values()) / 4)
    assert "| site_1 | 0.78" in (tmp_path / "results.md").read_text()
    # a survival data set has no classes: no class table printed, no class_counts.json
    assert not (tmp_path / "class_counts.json").exists() and "per class" not in printed
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["task"] == "survival"
    ceiling = {c: v["true_risk_test_c_index"] for c, v in manifest["details"]["sites"].items()}
    assert ceiling == pytest.approx({"site_0": 0.921, "site_1": 0.783, "site_2": 0.807, "site_3": 0.878}, abs=0.001)
