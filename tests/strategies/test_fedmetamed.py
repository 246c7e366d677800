"""FedMetaMed = PRR-FL (Chen et al., MICCAI 2021): the Fourier aggregation against numpy, the L schedule, the stage
switch and the KL directions by hand, one personal step against plain autograd, two rounds end to end (unlike
FedAvg) and exact resume from the round-1 checkpoint."""

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from lightning.fabric import Fabric
from safetensors.torch import load_file
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch import nn

from fedlit.commands.export import export_federation
from fedlit.commands.fit import build_parser
from fedlit.core.errors import ConfigError
from fedlit.core.roles import ParameterRoles
from fedlit.engine.loop.settings import LocalSettings
from fedlit.module import FederatedModule
from fedlit.strategies import ClientUpdate, FedAvg, FedMetaMed
from fedlit.strategies.fedmetamed.equations import (
    cumulative_fourier_average,
    distillation_kl,
    fourier_matrix,
    fourier_ratio,
    fourier_unmatrix,
    prr_losses,
    prr_stage,
)
from tests.conftest import _equal, make_federation

ROOT = Path(__file__).resolve().parents[2]


def numpy_mix(mats, weights, ratio):
    """The aggregation written out with numpy's fft on 2-D arrays (box rows/cols [c - b, c + b), c = size // 2)."""
    w = np.asarray(weights, dtype=float) / np.sum(weights)
    spectra = [np.fft.fft2(m) for m in mats]
    amps = [np.fft.fftshift(np.abs(s)) for s in spectra]
    mean = sum(wi * a for wi, a in zip(w, amps, strict=True))
    h, wd = mean.shape
    bh, bw = int(np.floor(h * ratio / 2)), int(np.floor(wd * ratio / 2))
    out = []
    for s, a in zip(spectra, amps, strict=True):
        a = a.copy()
        a[h // 2 - bh : h // 2 + bh, wd // 2 - bw : wd // 2 + bw] = mean[
            h // 2 - bh : h // 2 + bh, wd // 2 - bw : wd // 2 + bw
        ]
        out.append(np.real(np.fft.ifft2(np.fft.ifftshift(a) * np.exp(1j * np.angle(s)))))
    return out


A = np.array([[1.0, -2.0, 0.5, 3.0], [0.0, 1.5, -1.0, 2.0]])
B = np.array([[2.0, 0.0, -1.0, 1.0], [4.0, -3.0, 0.5, 0.0]])


def test_a_box_covering_everything_averages_every_amplitude():
    out = cumulative_fourier_average([torch.tensor(A), torch.tensor(B)], [1.0, 3.0], 1.0)
    # by hand: |F| = 0.25 |fft2(A)| + 0.75 |fft2(B)| everywhere, each client's own phase
    fa, fb = np.fft.fft2(A), np.fft.fft2(B)
    mean = 0.25 * np.abs(fa) + 0.75 * np.abs(fb)
    for got, own in zip(out, (fa, fb), strict=True):
        assert got.numpy() == pytest.approx(np.real(np.fft.ifft2(mean * np.exp(1j * np.angle(own)))), abs=1e-12)
    assert not np.allclose(out[0].numpy(), A) and not np.allclose(out[0].numpy(), 0.25 * A + 0.75 * B)  # not FedAvg


def test_a_partial_box_mixes_only_the_centre_of_the_shifted_spectrum():
    rng = np.random.default_rng(0)
    mats = [rng.normal(size=(6, 8)) for _ in range(3)]
    out = cumulative_fourier_average([torch.tensor(m, dtype=torch.float32) for m in mats], [1, 1, 1], 0.55)
    expected = numpy_mix(mats, [1, 1, 1], 0.55)  # box 2 x 2 around (3, 4): rows [2, 4), cols [2, 6)
    for got, want in zip(out, expected, strict=True):
        assert got.dtype == torch.float32 and got.numpy() == pytest.approx(want, abs=1e-5)
    # the amplitudes outside the box are each client's own
    shifted = [np.fft.fftshift(np.abs(np.fft.fft2(o.double().numpy()))) for o in out]
    own = np.fft.fftshift(np.abs(np.fft.fft2(mats[1])))
    assert shifted[1][0] == pytest.approx(own[0], abs=1e-4)


@pytest.mark.parametrize("ratio", [0.0, 0.1])
def test_an_empty_box_returns_each_clients_own_tensor(ratio):
    # 0.1: floor(2 * 0.1 / 2) = 0 rows, so the box is empty as with L = 0
    tensors = [torch.tensor(A, dtype=torch.float32), torch.tensor(B, dtype=torch.float32)]
    for got, own in zip(cumulative_fourier_average(tensors, [1.0, 1.0], ratio), tensors, strict=True):
        assert torch.allclose(got, own, atol=1e-6)


def test_a_conv_weight_round_trips_through_its_matrix():
    weight = torch.arange(2 * 3 * 2 * 2, dtype=torch.float32).reshape(2, 3, 2, 2)  # (O, C, k1, k2)
    matrix = fourier_matrix(weight)
    assert matrix.shape == (3 * 2, 2 * 2)  # (C k1, k2 O)
    # W[o, c, i, j] sits at row c k1 + i, column j O + o
    assert matrix[1 * 2 + 1, 0 * 2 + 1] == weight[1, 1, 1, 0] and matrix[2 * 2 + 0, 1 * 2 + 0] == weight[0, 2, 0, 1]
    assert torch.equal(fourier_unmatrix(matrix, weight.shape), weight)
    other = torch.randn(2, 3, 2, 2, generator=torch.Generator().manual_seed(1))
    got = cumulative_fourier_average([weight, other], [1.0, 1.0], 1.0)
    want = numpy_mix([fourier_matrix(weight).double().numpy(), fourier_matrix(other).double().numpy()], [1, 1], 1.0)
    assert got[0].shape == weight.shape
    assert fourier_matrix(got[0]).numpy() == pytest.approx(want[0], abs=1e-4)
    one = cumulative_fourier_average([other], [5.0], 0.8)[0]
    assert torch.allclose(one, other, atol=1e-6)  # one client: its own weight


def test_identical_clients_get_their_own_weight_back_and_order_does_not_matter():
    rng = torch.Generator().manual_seed(3)
    mats = [torch.randn(4, 6, generator=rng, dtype=torch.float64) for _ in range(3)]
    same = cumulative_fourier_average([mats[0]] * 3, [1.0, 2.0, 3.0], 0.9)
    assert all(torch.allclose(t, mats[0], atol=1e-12) for t in same)
    forward = cumulative_fourier_average(mats, [1.0, 2.0, 3.0], 0.9)
    backward = cumulative_fourier_average(mats[::-1], [3.0, 2.0, 1.0], 0.9)
    assert all(torch.allclose(a, b, atol=1e-12) for a, b in zip(forward, backward[::-1], strict=True))
    scaled = cumulative_fourier_average(mats, [10.0, 20.0, 30.0], 0.9)
    assert all(torch.allclose(a, b, atol=1e-12) for a, b in zip(forward, scaled, strict=True))


def test_the_ratio_grows_linearly_over_rounds():
    assert fourier_ratio(1, 10, 0.26, 0.55) == pytest.approx(0.26)
    assert fourier_ratio(6, 10, 0.26, 0.55) == pytest.approx(0.26 + 0.5 * 0.29)
    assert fourier_ratio(10, 10, 0.7, 0.95) == pytest.approx(0.7 + 0.9 * 0.25)  # the code's l_rate schedule
    assert FedMetaMed(schedule_rounds=4).ratio(3) == pytest.approx(0.26 + 0.5 * 0.29)
    with pytest.raises(ConfigError, match="schedule_rounds"):
        FedMetaMed().ratio(1)


@pytest.mark.parametrize(
    ("previous", "f1_deputy", "stage"),
    [
        (0, 0.95, 1),  # the first epoch of a round: Retrieve whatever the scores
        (1, 0.59, 1),
        (1, 0.6, 2),
        (1, 0.95, 2),  # never 1 -> 3 at once
        (2, 0.79, 2),
        (2, 0.8, 3),
        (3, 0.9, 3),
        (3, 0.7, 2),
        (3, 0.5, 1),
        (2, 0.3, 1),  # back when the deputy drops
    ],
)
def test_the_stage_switch_on_hand_scores(previous, f1_deputy, stage):
    assert prr_stage(previous, f1_deputy, 1.0, 0.6, 0.8) == stage


def test_the_kl_terms_point_from_the_teacher_to_the_student():
    student = torch.tensor([[0.0, 0.0], [0.0, 0.0]], requires_grad=True)  # p = (1/2, 1/2)
    teacher = torch.tensor([[np.log(3.0), 0.0]] * 2, requires_grad=True)  # p = (3/4, 1/4)
    forward = 0.75 * np.log(0.75 / 0.5) + 0.25 * np.log(0.25 / 0.5)  # KL(teacher || student), per sample
    reverse = 0.5 * np.log(0.5 / 0.75) + 0.5 * np.log(0.5 / 0.25)
    kl = distillation_kl(student, teacher)
    assert kl.item() == pytest.approx(forward) and abs(forward - reverse) > 0.01  # batch mean of two equal rows
    kl.backward()
    assert teacher.grad is None and student.grad is not None  # the teacher is detached
    ce_p, ce_d = torch.tensor(1.0), torch.tensor(2.0)
    per, dep = teacher.detach(), student.detach()  # personal p = (3/4, 1/4), deputy (1/2, 1/2)
    cases = {1: (1.0, 2.0 + forward), 2: (1.0 + reverse, 2.0 + forward), 3: (1.0 + reverse, 2.0)}
    for stage, (want_personal, want_deputy) in cases.items():
        personal, deputy = prr_losses(stage, ce_p, ce_d, per, dep)
        assert (personal.item(), deputy.item()) == pytest.approx((want_personal, want_deputy))
    with pytest.raises(ValueError, match="stage=0"):
        prr_losses(0, ce_p, ce_d, per, dep)


def test_the_server_sends_each_client_its_own_mix():
    conv, bias = torch.randn(2, 1, 2, 2, generator=torch.Generator().manual_seed(0)), torch.tensor([1.0, 5.0])
    strategy = FedMetaMed(schedule_rounds=2, l_start=1.0, l_end=1.0)
    strategy.initialize(
        {"conv.weight": conv, "conv.bias": bias},
        ["a", "b", "c"],
        roles=ParameterRoles({"conv.weight": "shared", "conv.bias": "shared"}),
    )
    assert strategy.fourier_names == ["conv.weight"]
    ups = [
        ClientUpdate("a", 1, {"conv.weight": conv, "conv.bias": bias}),
        ClientUpdate("b", 3, {"conv.weight": -2 * conv.flip(0), "conv.bias": -bias}),
    ]
    strategy.global_state = strategy.aggregate(1, ups)  # as the loop stores it
    want = cumulative_fourier_average([conv, -2 * conv.flip(0)], [1, 1], 1.0)
    for client, mix in zip("ab", want, strict=True):
        sent = strategy.configure_client(2, client)
        assert torch.equal(sent["conv.weight"], mix) and torch.equal(sent["conv.bias"], torch.zeros(2))  # uniform
        assert torch.equal(strategy.deputy_state(client)["conv.weight"], mix)
    assert not torch.allclose(want[0], want[1])
    assert torch.equal(strategy.configure_client(2, "c")["conv.weight"], (conv - 2 * conv.flip(0)) / 2)
    weighted = FedMetaMed(schedule_rounds=2, weighting="num_examples")
    weighted.initialize({"conv.weight": conv, "conv.bias": bias}, ["a", "b"])
    weighted.global_state = weighted.aggregate(1, ups)
    assert torch.allclose(weighted.global_state["conv.bias"], torch.tensor([-0.5, -2.5]))  # 1/4 b + 3/4 (-b)


class Net(FederatedModule):
    """Linear -> BatchNorm -> Linear, 2 classes."""

    def __init__(self):
        super().__init__(lr=0.5)
        self.fc, self.bn, self.out = nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 2)

    def training_step(self, batch, batch_idx):
        x, y = batch
        logits = self.out(self.bn(self.fc(x)))
        return {"loss": nn.functional.cross_entropy(logits, y), "logits": logits}


def test_one_local_step_trains_both_models_apart():
    torch.manual_seed(0)
    module = Net()
    strategy = FedMetaMed()
    module.set_parameter_roles(strategy.configure_roles(ParameterRoles.from_module(module, [])))
    assert module.parameter_roles()["bn.weight"] == "personal" and module.parameter_roles()["fc.weight"] == "shared"
    reference = Net()  # the personal model as a separate network, trained by plain autograd
    reference.load_state_dict(module.state_dict())
    with torch.no_grad():
        reference.out.weight.mul_(-1)
    personal = {n: t.detach().clone() for n, t in reference.state_dict().items()}
    fabric = Fabric(accelerator="cpu", devices=1)
    trainer = SimpleNamespace(
        rounds=10,
        local=LocalSettings(local_epochs=3),
        store=SimpleNamespace(device=torch.device("cpu")),
        autocast=fabric.autocast,
        convert_output=lambda out: out,
        prepare_batch=fabric.to_device,
    )  # as ``client``
    state = {"personal": personal, "stage": 3}
    strategy.on_client_fit_start(client=trainer, pl_module=module, client_id="a", client_state=state)
    strategy._turn["stage"] = 3  # Refine: personal CE + KL(p_dep || p_per), deputy CE only
    batch = (torch.randn(6, 3), torch.tensor([0, 1, 1, 0, 1, 0]))
    module.train()
    out = module.training_step(batch, 0)
    total = strategy.training_loss(module, out["loss"], batch, out)
    optimizer = torch.optim.SGD(module.parameters(), lr=0.5)
    total.backward()
    strategy.on_before_optimizer_step(pl_module=module, optimizer=optimizer)
    # the deputy's gradient is its CE's alone (the loop's optimizer has not stepped yet)
    grads = torch.autograd.grad(module.training_step(batch, 0)["loss"], list(module.parameters()))
    for (name, param), grad in zip(module.named_parameters(), grads, strict=True):
        assert torch.allclose(param.grad, grad, atol=1e-6), name
    # the personal model took one SGD step (lr 0.5) on CE + KL toward the detached deputy
    reference.train()
    logits = reference.out(reference.bn(reference.fc(batch[0])))
    loss = nn.functional.cross_entropy(logits, batch[1]) + distillation_kl(logits, out["logits"])
    grads = torch.autograd.grad(loss, list(reference.parameters()))
    stepped = strategy._turn["personal"]
    for (name, param), grad in zip(reference.named_parameters(), grads, strict=True):
        assert torch.allclose(stepped[name], param - 0.5 * grad, atol=1e-6), name
    assert torch.allclose(stepped["bn.running_mean"], reference.bn.running_mean)  # its own statistics moved
    assert int(stepped["bn.num_batches_tracked"]) == 1
    strategy.on_client_fit_end(client=trainer, update=ClientUpdate("a", 6, {}), client_state=state)
    assert torch.equal(state["personal"]["out.weight"], stepped["out.weight"].detach())
    assert state["stage"] == 3 and strategy._turn == {}


def _losses(out_dir):
    events = EventAccumulator(str(out_dir / "tensorboard")).Reload()
    return [e.value for e in events.Scalars("server/train/loss_mean")] + [
        events.Scalars("server/val/loss_mean")[-1].value
    ]


# Seed 0, 3 clients, 3 local epochs, 2 rounds, the code's L (0.7 -> 0.95; the paper's 0.26 leaves the tiny 8 x 4 and
# 3 x 8 weights' boxes empty): the deputies' mean train loss per round and the mean validation loss of the personal
# models after round 2. FedAvg on the same federation: [0.932225, 0.630849, 1.033164]. Round 1 is FedAvg's: both
# models start equal, so every KL term is 0 with a zero gradient and the deputy trains as FedAvg's client does.
PINNED = [0.932225, 0.606035, 1.007056]


def test_two_rounds_then_an_exact_resume_from_round_one(tmp_path):
    def build(name, rounds):
        strategy = FedMetaMed(schedule_rounds=2, l_start=0.7, l_end=0.95)
        return make_federation(tmp_path / name, strategy, rounds=rounds, local_epochs=3)

    straight = build("straight", 2)
    results = straight.fit()
    key = straight.strategy.state_key
    states = {c: straight.store.extra(c, key) for c in straight.client_ids}
    assert all(s["stages"] == [1, 2, 3] for s in states.values())  # Retrieve first, then up as the deputy catches up
    assert all(set(s["personal"]) == set(straight.module.named_tensors("shared", "personal")) for s in states.values())
    ours = _losses(tmp_path / "straight")
    assert ours == pytest.approx(PINNED, abs=2e-5)
    make_federation(tmp_path / "fedavg", FedAvg(), rounds=2, local_epochs=3).fit()
    theirs = _losses(tmp_path / "fedavg")
    assert ours[0] == pytest.approx(theirs[0], abs=1e-6)
    assert all(abs(a - b) > 1e-2 for a, b in zip(ours[1:], theirs[1:], strict=True))
    build("resumed", 1).fit()
    torch.manual_seed(1234)
    second = build("resumed", 2)
    resumed = second.fit(ckpt_path=tmp_path / "resumed" / "checkpoints" / "last.ckpt")
    assert resumed["last"] == results["last"]
    for client in straight.client_ids:
        a, b = straight.store.tensors(client), second.store.tensors(client)
        assert all(torch.equal(a[n], b[n]) for n in a)
        assert _equal(straight.store.state_dict()["extra"][client], second.store.state_dict()["extra"][client])
    assert _equal(straight.strategy.state_dict(), second.strategy.state_dict())


def test_the_personal_model_is_what_a_client_is_evaluated_with(tmp_path):
    runs = {}
    for evaluate in ("personal", "deputy"):
        fed = make_federation(tmp_path / evaluate, FedMetaMed(schedule_rounds=1, evaluate=evaluate), rounds=1)
        fed.fit()
        runs[evaluate] = fed
    personal = runs["personal"]
    state = personal.store.extra("c0", personal.strategy.state_key)
    assert state["stages"] == [2]  # one local epoch: Reciprocate at every batch, as the authors' code
    got = personal.evaluate_client(1, "c0", "val")
    assert all(
        torch.equal(t, state["personal"][n]) for n, t in personal.module.named_tensors("shared", "personal").items()
    )
    deputy = runs["deputy"].evaluate_client(1, "c0", "val")
    assert got["loss"] != pytest.approx(deputy["loss"], abs=1e-4)
    exported = load_file(export_federation(personal, tmp_path / "export", ["c0"])["c0"] / "model.safetensors")
    assert exported.keys() == state["personal"].keys()
    assert all(torch.equal(t, state["personal"][n]) for n, t in exported.items())


def test_bad_options_are_named():
    with pytest.raises(ConfigError) as err:
        FedMetaMed(l_start=1.5, alpha1=0.9, alpha2=0.8, f1_split="test", schedule_rounds=0)
    for option in ("l_start=1.5", "alpha1=0.9", "f1_split='test'", "schedule_rounds=0"):
        assert option in str(err.value)
    assert repr(FedMetaMed()).startswith("FedMetaMed(l_start=0.26, l_end=0.55, schedule_rounds=None, alpha1=0.6")


def test_the_recipe_selects_the_strategy_by_name():
    cfg = build_parser().parse_args(["fit", "--config", str(ROOT / "recipes" / "fedmetamed_pneumoniamnist.yaml")]).fit
    assert cfg.strategy.class_path == "fedlit.strategies.FedMetaMed"
    assert cfg.strategy.init_args.alpha1 == 0.6 and cfg.strategy.init_args.l_end == 0.55
