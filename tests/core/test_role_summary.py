"""The start-of-fit summary of parameter roles, the warning for a role rule that matches nothing, the progress
bar's per-step postfix, and the default accelerator."""

from __future__ import annotations

import io
import warnings
from pathlib import Path

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch import nn
from tqdm import tqdm

from fedlit import FedBN, RoleRule
from fedlit.cli import prepare
from fedlit.core.roles import ParameterRoles, role_summary
from fedlit.engine.records.progress import Progress
from fedlit.tasks import ClassificationModule
from tests.conftest import TinyMLP, make_federation


def test_role_summary_counts_tensors_parameters_and_megabytes_per_role():
    net = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Linear(8, 3))
    roles = ParameterRoles.from_module(net, [RoleRule("0.*", "frozen"), RoleRule("1.*", "personal")])
    rows = {r["role"]: r for r in role_summary(net, roles)}
    # frozen: 0.weight (32) + 0.bias (8); personal: BN weight, bias (8 + 8) + running_mean, running_var (8 + 8,
    # float32) + num_batches_tracked (1, int64); shared (the default): 2.weight (24) + 2.bias (3)
    assert (rows["frozen"]["tensors"], rows["frozen"]["parameters"]) == (2, 40)
    assert (rows["personal"]["tensors"], rows["personal"]["parameters"]) == (5, 16)
    assert (rows["shared"]["tensors"], rows["shared"]["parameters"]) == (2, 27)
    assert rows["personal"]["mb"] == pytest.approx((32 * 4 + 8) / 2**20)
    assert (rows["total"]["tensors"], rows["total"]["parameters"]) == (9, 83)
    assert rows["total"]["mb"] == pytest.approx(((40 + 16 + 27 + 16) * 4 + 8) / 2**20)


def test_a_role_rule_that_matches_nothing_warns_with_the_pattern_and_the_option():
    module = ClassificationModule(
        backbone=TinyMLP(),
        num_classes=3,
        roles=[RoleRule("backbone.*", "shared"), RoleRule("backbone.*lora_*", "shared")],
    )
    with pytest.warns(
        UserWarning,
        match=r"model.init_args.roles\[1\]: role rule pattern 'backbone.\*lora_\*' "
        r"\(-> shared\) matches no parameter or buffer of ClassificationModule",
    ):
        module.parameter_roles()
    quiet = ClassificationModule(backbone=TinyMLP(), num_classes=3, roles=[RoleRule("head.*", "personal")])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        quiet.parameter_roles()  # every rule matches, defaults included


def test_fit_prints_the_role_summary_once_and_logs_it_to_tensorboard(tmp_path, capsys):
    torch.manual_seed(0)
    federation = make_federation(tmp_path, FedBN(), rounds=1)
    federation.fit()
    out = capsys.readouterr().out
    assert out.count("parameter roles (FedBN") == 1
    # TinyMLP (Linear 4->8, BatchNorm1d(8)) + head Linear 8->3, backbone shared; FedBN makes the BatchNorm
    # personal: shared = 32 + 8 + 24 + 3 = 67 parameters in 4 tensors; personal = 16 parameters in 5 tensors
    # (weight, bias, running_mean, running_var, num_batches_tracked).
    assert "| shared | 4 | 67 | 0.00 |" in out
    assert "| personal | 5 | 16 | 0.00 |" in out
    assert "| frozen | 0 | 0 | 0.00 |" in out
    events = EventAccumulator(str(tmp_path / "tensorboard")).Reload()
    assert "model/roles/text_summary" in events.Tags()["tensors"]


def test_the_progress_bar_shows_the_client_step_and_running_loss(tmp_path, monkeypatch):
    federation = make_federation(tmp_path, FedBN(), rounds=1)
    progress = Progress(enabled=True)
    progress._bar = tqdm(file=io.StringIO(), total=1)
    progress.client("client c1 (2/3)")
    progress.step(7, 0.123456)
    assert progress._bar.postfix == "client c1 (2/3) step 7 loss 0.1235"
    progress.step(8, 0.5)  # within half a second: not shown
    assert progress._bar.postfix.endswith("step 7 loss 0.1235")

    shown = []
    monkeypatch.setattr(Progress, "step", lambda self, step, loss: shown.append((step, loss)))
    federation.settings.progress_bar = True
    federation.settings.local_steps = 3
    federation.fit()
    # 3 clients x 3 steps, one call per step; the running loss is the mean of the step losses so far, so after
    # a client's last step it is that client's logged mean training loss
    assert [s for s, _ in shown] == [1, 2, 3] * 3
    events = EventAccumulator(str(tmp_path / "tensorboard")).Reload()
    logged = [events.Scalars(f"client/{c}/train/loss")[0].value for c in federation.client_ids]
    assert [loss for _, loss in shown[2::3]] == pytest.approx(logged, rel=1e-6)


def test_the_accelerator_defaults_to_auto_in_the_cli_and_the_api(tmp_path):
    recipe = Path(__file__).resolve().parents[2] / "recipes" / "quickstart.yaml"
    job = prepare(["fit", "--config", str(recipe), "--out_dir", str(tmp_path / "cli")])
    assert job.federation.config["federation"]["accelerator"] == "auto"
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert job.federation.fabric.device.type == expected
    api = make_federation(tmp_path / "api", FedBN(), accelerator="auto")
    assert api.fabric.device.type == expected
