"""Differential privacy: DP-FedAvg's clipping and noise, DP-SGD's per-sample clipping, the accountants, refusals."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml
from lightning.pytorch import Callback
from opacus.accountants import RDPAccountant
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch import nn

from fedlit import FedAvg, FedBN, Federation, FedProx, Local, RoleRule
from fedlit.cli import main, prepare, run
from fedlit.core.errors import CheckpointError, ConfigError
from fedlit.federation import derive_seed
from fedlit.models import Backbone
from fedlit.privacy import ClientLevelDP, SampleLevelDP, clip_and_noise, clip_update, gaussian_noise
from fedlit.strategies import ClientUpdate
from fedlit.strategies.common.aggregators import MedianAggregator
from fedlit.tasks import ClassificationModule
from tests.conftest import TinyTabular, make_federation


def _epsilon(steps: int, q: float, sigma: float, delta: float) -> float:
    """Opacus's RDP accountant, stepped here independently of fedlit."""
    accountant = RDPAccountant()
    for _ in range(steps):
        accountant.step(noise_multiplier=sigma, sample_rate=q)
    return accountant.get_epsilon(delta)


# ------------------------------------------------------------------------------------------------- client level
def test_clip_update_scales_a_delta_of_norm_5_to_norm_1_over_all_tensors_jointly():
    reference = {"a": torch.tensor([1.0]), "b": torch.tensor([2.0, 0.0]), "buf": torch.tensor([7.0])}
    state = {"a": torch.tensor([4.0]), "b": torch.tensor([6.0, 0.0]), "buf": torch.tensor([9.0])}  # delta (3, 4, 0)
    norm = clip_update(state, reference, ["a", "b"], clip_norm=1.0)
    assert norm == pytest.approx(5.0)
    assert torch.allclose(state["a"], torch.tensor([1.6]))  # 1 + 3/5
    assert torch.allclose(state["b"], torch.tensor([2.8, 0.0]))  # 2 + 4/5
    assert torch.equal(state["buf"], torch.tensor([9.0]))  # not among the names: untouched
    small = {"a": torch.tensor([1.3]), "b": torch.tensor([2.4, 0.0])}  # norm 0.5 <= 1: unchanged
    clip_update(small, reference, ["a", "b"], clip_norm=1.0)
    assert torch.equal(small["a"], torch.tensor([1.3])) and torch.equal(small["b"], torch.tensor([2.4, 0.0]))


def test_gaussian_noise_is_torch_normal_with_the_seeded_generator_and_has_the_right_std():
    noise = gaussian_noise({"w": torch.Size([2, 3]), "b": torch.Size([3])}, std=0.25, seed=11)
    generator = torch.Generator().manual_seed(11)
    assert torch.equal(noise["w"], torch.normal(0.0, 0.25, size=(2, 3), generator=generator))
    assert torch.equal(noise["b"], torch.normal(0.0, 0.25, size=(3,), generator=generator))
    many = gaussian_noise({"x": torch.Size([200_000])}, std=0.25, seed=3)["x"]
    assert many.std().item() == pytest.approx(0.25, rel=0.01) and abs(many.mean().item()) < 0.005


class Snapshot(Callback):
    """Records the uploads before aggregation and the server state after it (where it stands in the list)."""

    def __init__(self) -> None:
        self.uploads: dict[int, dict[str, dict[str, torch.Tensor]]] = {}
        self.states: dict[int, dict[str, torch.Tensor]] = {}
        self.before: dict[int, dict[str, torch.Tensor]] = {}

    def on_round_start(self, trainer, server_round) -> None:
        self.before[server_round] = {n: t.clone() for n, t in trainer.strategy.global_state.items()}

    def on_before_aggregate(self, server_round, updates) -> None:
        self.uploads[server_round] = {u.client_id: {n: t.clone() for n, t in u.state.items()} for u in updates}

    def on_after_aggregate(self, trainer, server_round) -> None:
        self.states[server_round] = {n: t.clone() for n, t in trainer.strategy.global_state.items()}


def test_client_level_dp_clips_each_delta_and_adds_the_seeded_noise_to_the_mean(tmp_path):
    raw, clipped_view = Snapshot(), Snapshot()  # before and after ClientLevelDP in the callback order
    dp = ClientLevelDP(noise_multiplier=0.8, clip_norm=0.05)
    fed = make_federation(tmp_path, FedBN(weighting="uniform"), rounds=1, callbacks=[raw, dp, clipped_view])
    fed.fit()
    names = fed.strategy.shared_parameter_names()
    before = raw.before[1]
    for client, state in raw.uploads[1].items():
        delta = torch.cat([(state[n] - before[n]).reshape(-1) for n in names])
        clipped = torch.cat([(clipped_view.uploads[1][client][n] - before[n]).reshape(-1) for n in names])
        assert delta.norm() > 0.05  # the local step moves further than C
        assert torch.allclose(clipped, delta * 0.05 / delta.norm(), atol=1e-6)
    m = 3
    mean = {n: sum(clipped_view.uploads[1][c][n] for c in raw.uploads[1]) / m for n in names}
    assert all(torch.allclose(raw.states[1][n], mean[n], atol=1e-6) for n in names)  # FedBN's plain mean
    generator = torch.Generator().manual_seed(derive_seed(0, "dp-noise", 1))  # federation.seed = 0
    for n in names:  # noise N(0, (z C / m)^2), drawn in the order of the shared parameters
        expected = torch.normal(0.0, 0.8 * 0.05 / m, size=tuple(mean[n].shape), generator=generator)
        assert torch.allclose(clipped_view.states[1][n] - raw.states[1][n], expected, atol=1e-7)


def test_client_level_dp_reports_opacus_epsilon_in_the_logs_csv_and_results(tmp_path):
    dp = ClientLevelDP(noise_multiplier=1.1, clip_norm=0.01, delta=1e-4)
    fed = make_federation(tmp_path, FedBN(weighting="uniform"), rounds=2, clients_per_round=2, callbacks=[dp])
    results = fed.fit()
    q = 2 / 3
    expected = [_epsilon(r, q, 1.1, 1e-4) for r in (1, 2)]
    assert expected[1] > expected[0] > 0 and expected[1] != pytest.approx(_epsilon(2, 1.0, 1.1, 1e-4))
    block = json.loads((tmp_path / "results.json").read_text())["privacy"]["client_level"]
    assert block["epsilon"] == pytest.approx(expected[1], rel=1e-9) and results["privacy"] == {"client_level": block}
    assert block["delta"] == 1e-4 and block["clip_norm"] == 0.01 and block["noise_multiplier"] == 1.1
    assert block["accountant"] == "opacus.accountants.RDPAccountant" and block["sample_rate"] == pytest.approx(q)
    with open(tmp_path / "metrics.csv") as file:
        rows = [r for r in csv.DictReader(file) if r["split"] == "privacy"]
    epsilons = [float(r["value"]) for r in rows if r["metric"] == "epsilon"]
    assert epsilons == pytest.approx(expected, rel=1e-6)
    assert {r["metric"] for r in rows} >= {"epsilon", "delta", "clip_norm", "noise_multiplier", "clipped_fraction"}
    events = EventAccumulator(str(tmp_path / "tensorboard")).Reload()
    assert [e.value for e in events.Scalars("privacy/epsilon")] == pytest.approx(expected, rel=1e-6)
    assert [e.value for e in events.Scalars("privacy/clipped_fraction")] == [1.0, 1.0]  # C = 0.01 < every delta


def test_client_level_dp_resumes_with_the_same_epsilon_and_state(tmp_path):
    def run(folder, rounds, ckpt_path=None):
        dp = ClientLevelDP(noise_multiplier=1.0, clip_norm=0.1)
        fed = make_federation(tmp_path / folder, FedBN(weighting="uniform"), rounds=rounds, callbacks=[dp])
        return fed, dp, fed.fit(ckpt_path=ckpt_path)

    straight, straight_dp, straight_results = run("straight", 3)
    run("resumed", 2)
    torch.manual_seed(1234)
    resumed, resumed_dp, resumed_results = run("resumed", 3, tmp_path / "resumed" / "checkpoints" / "last.ckpt")
    assert resumed_dp.history == straight_dp.history == [[1.0, 1.0, 3]]
    assert resumed_results["privacy"] == straight_results["privacy"]
    assert resumed_dp.epsilon() == pytest.approx(_epsilon(3, 1.0, 1.0, 1e-5))
    state, again = straight.strategy.global_state, resumed.strategy.global_state
    assert all(torch.equal(state[n], again[n]) for n in state)  # the same noise in round 3
    assert resumed_results["last"] == straight_results["last"]


def test_weighted_mean_accounts_with_the_effective_noise_multiplier():
    dp = ClientLevelDP(noise_multiplier=1.5, clip_norm=1.0)
    strategy = FedAvg()  # weighting num_examples
    strategy.initialize({"w": torch.zeros(2)}, ["a", "b"])
    trainer = SimpleNamespace(
        strategy=strategy,
        train_client_ids=["a", "b"],
        settings=SimpleNamespace(clients_per_round=None),
        derive_seed=lambda *parts: derive_seed(0, *parts),
    )
    updates = [ClientUpdate("a", 10, {"w": torch.tensor([3.0, 4.0])}), ClientUpdate("b", 30, {"w": torch.zeros(2)})]
    dp.on_before_aggregate(trainer, None, 1, updates)
    log: dict[str, float] = {}
    dp.on_after_aggregate(trainer, None, 1, log)
    # largest weighted contribution 30/40 C, noise std z C / 2: z_eff = z * 40 / (2 * 30) = 1.0
    assert log["privacy/effective_noise_multiplier"] == pytest.approx(1.0)
    assert dp.history == [[pytest.approx(1.0), 1.0, 1]]
    assert log["privacy/clipped_fraction"] == 0.5  # a's delta (norm 5) clipped, b's (norm 0) not


@pytest.mark.parametrize(
    "strategy, roles, match",
    [
        (Local(), None, "Local"),
        (FedAvg(aggregator=MedianAggregator()), None, "weighted mean"),
        (FedAvg(weighting="uniform"), None, r"shares buffers \(\['backbone.1.running_mean'"),
    ],
)
def test_client_level_dp_refuses_what_it_does_not_cover(tmp_path, strategy, roles, match):
    fed = make_federation(tmp_path, strategy, rounds=1, roles=roles, callbacks=[ClientLevelDP(1.0, 1.0)])
    with pytest.raises(ConfigError, match=match):
        fed.fit()


def test_privacy_settings_are_validated():
    with pytest.raises(ConfigError, match=r"noise_multiplier=0 must be .* > 0.*clip_norm=-1.*delta=2"):
        ClientLevelDP(noise_multiplier=0, clip_norm=-1, delta=2)
    with pytest.raises(ConfigError, match=r"SampleLevelDP: max_grad_norm=0"):
        SampleLevelDP(noise_multiplier=1.0, max_grad_norm=0)


# ------------------------------------------------------------------------------------------------- sample level
def test_clip_and_noise_clips_each_sample_jointly_then_averages():
    # sample 1: (3 | 4), norm 5, clipped to 1 -> (0.6 | 0.8); sample 2: (0.3 | 0.4), norm 0.5, kept
    a, b = torch.tensor([[3.0], [0.3]]), torch.tensor([[4.0], [0.4]])
    grads, norms = clip_and_noise([a, b], max_grad_norm=1.0, noise_std=0.0)
    assert norms.tolist() == pytest.approx([5.0, 0.5])
    assert grads[0].tolist() == pytest.approx([0.45], abs=1e-6)  # (0.6 + 0.3) / 2
    assert grads[1].tolist() == pytest.approx([0.6], abs=1e-6)  # (0.8 + 0.4) / 2


class Negated(nn.Module):
    """loss = mean_i(-w . x_i): sample i's gradient is -x_i."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(2, 1, bias=False)
        nn.init.zeros_(self.layer.weight)


def _trainer(strategy=None):
    return SimpleNamespace(strategy=strategy or FedAvg(), scaler=None, server_round=1)


def _client():
    """What a client's turn gives the hooks as ``client``: 10 training samples in batches of 2."""
    return SimpleNamespace(derive_seed=lambda *parts: 123, batch_size=2, num_examples=lambda split: 10)


def test_sample_level_dp_replaces_the_gradient_by_the_clipped_noisy_per_sample_mean():
    module = Negated()
    dp = SampleLevelDP(noise_multiplier=0.5, max_grad_norm=1.0, delta=1e-5)
    trainer = _trainer()
    dp.on_fit_start(trainer, module)
    dp.on_client_fit_start(pl_module=module, server_round=1, client_id="c0", client=_client())
    x = torch.tensor([[3.0, 4.0], [0.3, 0.4]])
    (-module.layer(x)).mean().backward()
    assert module.layer.weight.grad[0].tolist() == pytest.approx([-1.65, -2.2])  # the plain mean gradient
    dp.on_before_optimizer_step(trainer, module, None)
    # clipped: (-0.6, -0.8) + (-0.3, -0.4) = (-0.9, -1.2); plus N(0, (0.5 * 1)^2) from the seeded generator; / 2
    noise = torch.normal(0.0, 0.5, size=(1, 2), generator=torch.Generator().manual_seed(123))
    expected = (torch.tensor([[-0.9, -1.2]]) + noise) / 2
    assert torch.allclose(module.layer.weight.grad, expected, atol=1e-5)
    dp.on_before_zero_grad(trainer, module, None, stepped=True)
    update, state = ClientUpdate("c0", 10, {}), {}
    dp.on_client_fit_end(trainer, module, 1, "c0", update, state)
    assert state["history"] == [[0.5, 0.2, 1]]  # q = batch 2 / 10 samples, one step
    assert update.metrics["dp_sample_epsilon"] == pytest.approx(_epsilon(1, 0.2, 0.5, 1e-5))
    assert update.metrics["dp_sample_clipped_fraction"] == 0.5


class PlainMLP(Backbone):
    """Linear -> ReLU: no BatchNorm, so Opacus can compute per-sample gradients."""

    def build(self) -> nn.Module:
        net = nn.Sequential(nn.Linear(4, 8), nn.ReLU())
        net.num_features = 8
        return net


def test_sample_level_dp_two_rounds_reports_each_clients_epsilon(tmp_path):
    torch.manual_seed(0)
    module = ClassificationModule(backbone=PlainMLP(), num_classes=3, lr=0.1, roles=[RoleRule("backbone.*", "shared")])
    dp = SampleLevelDP(noise_multiplier=1.0, max_grad_norm=0.5, delta=1e-3)
    fed = Federation(
        module,
        TinyTabular(),
        FedAvg(),
        rounds=2,
        out_dir=tmp_path,
        progress_bar=False,
        accelerator="cpu",
        callbacks=[dp],
    )
    results = fed.fit()
    # 15 training samples per client in batches of 8: 2 steps a round at q = 8/15, 4 steps after 2 rounds
    expected = _epsilon(4, 8 / 15, 1.0, 1e-3)
    block = results["privacy"]["sample_level"]
    assert block["epsilon_per_client"] == pytest.approx({"c0": expected, "c1": expected, "c2": expected})
    assert block["epsilon_max"] == pytest.approx(expected)
    assert fed.store.extra("c1", "SampleLevelDP")["history"] == [[1.0, 8 / 15, 4]]
    events = EventAccumulator(str(tmp_path / "tensorboard")).Reload()
    assert [e.value for e in events.Scalars("privacy/sample_epsilon_max")] == pytest.approx(
        [_epsilon(2, 8 / 15, 1.0, 1e-3), expected], rel=1e-6
    )
    assert math.isfinite(results["last"]["summary"]["loss_mean"])


def test_sample_level_dp_refuses_batchnorm_and_gradient_changing_strategies(tmp_path):
    fed = make_federation(tmp_path / "bn", FedAvg(), rounds=1, callbacks=[SampleLevelDP(1.0, 1.0)])
    with pytest.raises(ConfigError, match=r"backbone\.1 \(BatchNorm1d: mixes the samples of a batch; use GroupNorm"):
        fed.fit()
    with pytest.raises(ConfigError, match=r"FedProx.*training_loss"):
        SampleLevelDP(1.0, 1.0).on_fit_start(_trainer(FedProx(mu=0.1)), Negated())


def test_the_cli_builds_the_privacy_callbacks_and_client_timeout_from_a_recipe(tmp_path):
    recipe = yaml.safe_load((Path(__file__).resolve().parents[2] / "recipes" / "quickstart.yaml").read_text())
    recipe["callbacks"] = [
        {"class_path": "fedlit.privacy.ClientLevelDP", "init_args": {"noise_multiplier": 1.0, "clip_norm": 0.5}}
    ]
    recipe["federation"]["client_timeout"] = 120
    (tmp_path / "dp.yaml").write_text(yaml.safe_dump(recipe))
    job = prepare(["fit", "--config", str(tmp_path / "dp.yaml"), "--out_dir", str(tmp_path / "a")])
    assert repr(job.federation.callbacks[1:]) == "[ClientLevelDP(noise_multiplier=1.0, clip_norm=0.5, delta=1e-05)]"
    assert job.federation.settings.client_timeout == 120.0


def test_sample_level_dp_goes_on_after_a_quarantined_turn(tmp_path):
    class Poisoned(FedAvg):
        def on_client_fit_start(self, server_round, client_id) -> None:
            self.poison = (server_round, client_id) == (1, "c1")

    torch.manual_seed(0)
    module = ClassificationModule(backbone=PlainMLP(), num_classes=3, lr=0.1, roles=[RoleRule("backbone.*", "shared")])
    original = module.training_step

    def training_step(batch, batch_idx):  # c1's first loss of round 1 is NaN: forward without backward
        out = original(batch, batch_idx)
        return {**out, "loss": out["loss"] * math.nan} if fed.strategy.poison else out

    module.training_step = training_step
    dp = SampleLevelDP(noise_multiplier=1.0, max_grad_norm=0.5)
    fed = Federation(
        module,
        TinyTabular(),
        Poisoned(),
        rounds=2,
        out_dir=tmp_path,
        progress_bar=False,
        accelerator="cpu",
        callbacks=[dp],
    )
    with pytest.warns(UserWarning, match="'c1' is quarantined"):
        results = fed.fit()
    per_client = results["privacy"]["sample_level"]["epsilon_per_client"]
    assert per_client["c1"] == pytest.approx(_epsilon(2, 8 / 15, 1.0, 1e-5))  # round 2 only: nothing released
    assert per_client["c0"] == pytest.approx(_epsilon(4, 8 / 15, 1.0, 1e-5))


def test_adding_client_level_dp_on_resume_warns_that_earlier_rounds_are_not_covered(tmp_path):
    make_federation(tmp_path, FedBN(weighting="uniform"), rounds=1).fit()
    dp = ClientLevelDP(noise_multiplier=1.0, clip_norm=0.1)
    fed = make_federation(tmp_path, FedBN(weighting="uniform"), rounds=2, callbacks=[dp])
    with pytest.warns(UserWarning, match=r"ClientLevelDP: the checkpoint's rounds 1..1 ran without it"):
        fed.fit(ckpt_path=tmp_path / "checkpoints" / "last.ckpt")
    assert dp.history == [[1.0, 1.0, 1]]


# ------------------------------------------------------------------------------------------------- dropped on resume
def test_a_resume_without_client_level_dp_is_refused_unless_allowed_and_then_says_what_epsilon_covers(tmp_path):
    def fed(rounds, *callbacks, **options):
        return make_federation(
            tmp_path, FedBN(weighting="uniform"), rounds=rounds, callbacks=list(callbacks), **options
        )

    fed(2, ClientLevelDP(noise_multiplier=1.0, clip_norm=0.1)).fit()
    ckpt = tmp_path / "checkpoints" / "last.ckpt"
    finished = (tmp_path / "results.json").read_text()
    with pytest.raises(
        CheckpointError,
        match=r"saved by a run with the callbacks ClientLevelDP, which this run lacks: "
        r"its rounds after 2 would run without them .*released without noise.*"
        r"set federation.allow_dropped_callbacks: true",
    ):
        fed(4).fit(ckpt_path=ckpt)
    assert (tmp_path / "results.json").read_text() == finished  # refused before any round
    assert fed(4).evaluate("test", ckpt)["round"] == 2  # evaluating the checkpoint releases nothing: not refused
    with pytest.warns(
        UserWarning,
        match=r"allow_dropped_callbacks: resuming .* without ClientLevelDP: the rounds "
        r"after 2 run without them",
    ):
        results = fed(4, allow_dropped_callbacks=True).fit(ckpt_path=ckpt)
    block = results["privacy"]["client_level"]
    assert block["epsilon"] == pytest.approx(_epsilon(2, 1.0, 1.0, 1e-5)) and block["rounds"] == 2
    assert block["dropped_after_round"] == 2 and "cover only the rounds it ran, up to round 2" in block["note"]
    assert "rounds 3..4 ran without it" in block["note"]
    assert results["dropped_callbacks"] == [{"callback": "ClientLevelDP", "after_round": 2}]
    assert json.loads((tmp_path / "results.json").read_text())["privacy"] == results["privacy"]
    assert "ClientLevelDP after round 2" in (tmp_path / "results.md").read_text()
    # later checkpoints carry the drop on (no second refusal); bringing the callback back goes on from its 2 rounds
    later = fed(5).fit(ckpt_path=ckpt)
    assert later["privacy"]["client_level"]["epsilon"] == block["epsilon"]
    assert "rounds 3..5 ran without it" in later["privacy"]["client_level"]["note"]
    back = ClientLevelDP(noise_multiplier=1.0, clip_norm=0.1)
    with pytest.warns(UserWarning, match=r"ClientLevelDP: the checkpoint's rounds 3..5 ran without it"):
        again = fed(6, back).fit(ckpt_path=ckpt)
    assert back.history == [[1.0, 1.0, 3]] and "note" not in again["privacy"]["client_level"]
    assert "dropped_callbacks" not in again


def test_a_resume_without_sample_level_dp_is_refused(tmp_path):
    def fed(*callbacks):
        torch.manual_seed(0)
        module = ClassificationModule(
            backbone=PlainMLP(), num_classes=3, lr=0.1, roles=[RoleRule("backbone.*", "shared")]
        )
        return Federation(
            module,
            TinyTabular(),
            FedAvg(),
            rounds=2,
            out_dir=tmp_path,
            progress_bar=False,
            accelerator="cpu",
            callbacks=list(callbacks),
        )

    fed(SampleLevelDP(noise_multiplier=1.0, max_grad_norm=0.5)).fit()
    fed(SampleLevelDP(noise_multiplier=1.0, max_grad_norm=0.5)).fit(ckpt_path=tmp_path / "checkpoints" / "last.ckpt")
    with pytest.raises(CheckpointError, match="the callbacks SampleLevelDP, which this run lacks"):
        fed().fit(ckpt_path=tmp_path / "checkpoints" / "last.ckpt")


def test_the_cli_refuses_to_drop_the_privacy_callback_in_one_line_and_records_an_allowed_drop(tmp_path, capsys):
    recipe = yaml.safe_load((Path(__file__).resolve().parents[2] / "recipes" / "quickstart.yaml").read_text())
    recipe["federation"] |= {"rounds": 1, "local_epochs": 1, "progress_bar": False}
    recipe["data"]["init_args"]["samples_per_client"] = 20
    (tmp_path / "plain.yaml").write_text(yaml.safe_dump(recipe))
    recipe["callbacks"] = [
        {"class_path": "fedlit.privacy.ClientLevelDP", "init_args": {"noise_multiplier": 1.0, "clip_norm": 0.5}}
    ]
    (tmp_path / "dp.yaml").write_text(yaml.safe_dump(recipe))
    out = ["--out_dir", str(tmp_path / "run")]
    run(["fit", "--config", str(tmp_path / "dp.yaml"), *out])
    resume = ["fit", "--config", str(tmp_path / "plain.yaml"), *out, "--federation.rounds", "2", "--ckpt_path", "last"]
    capsys.readouterr()  # what the first run printed (warnings too, when pytest does not capture them)
    with pytest.raises(SystemExit) as exit_info:
        main(resume)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.count("\n") == 1 and "Traceback" not in err
    assert "the callbacks ClientLevelDP, which this run lacks" in err and "--federation.allow_dropped_callbacks" in err
    with pytest.warns(UserWarning, match="without ClientLevelDP"):
        results = run([*resume, "--federation.allow_dropped_callbacks", "true"])
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert config["resumed"] == [
        {
            "from_round": 1,
            "dropped_callbacks": ["ClientLevelDP"],
            "changed": {
                "callbacks": [config["callbacks"], None],
                "ckpt_path": [None, "last"],
                "federation.allow_dropped_callbacks": [False, True],
                "federation.rounds": [1, 2],
            },
        }
    ]
    assert results["privacy"]["client_level"]["dropped_after_round"] == 1 and results["last"]["round"] == 2
