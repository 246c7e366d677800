"""Differential tests: fedlit's strategies against Flower's (flwr 1.41) on the same client tensors and weights.

Both sides get identical float32 client arrays (several tensors of different shapes, several clients with
different ``num_examples``) over 3 rounds; in each round the clients start from the server model both sides agree
on. The Flower settings that make the two identical are spelled out in each test:

- FedAvg()                                   == flwr FedAvg()
- FedAdam(eta, tau, b1, b2, bias_correction=True) == flwr FedAdam(initial_parameters=x0, eta, tau, beta_1, beta_2)
- FedAdagrad(eta, tau, beta_1=0)             == flwr FedAdagrad(initial_parameters=x0, eta, tau)
- FedYogi(eta, tau, b1, b2)                  == flwr FedYogi(initial_parameters=x0, eta, tau, beta_1, beta_2)
- FedMedian()                                == flwr FedMedian()
- FedTrimmedAvg(beta=b)                      == flwr FedTrimmedAvg(beta=b)
- Krum(num_malicious=f)                      == flwr Krum(num_malicious_clients=f, num_clients_to_keep=0)
- Krum(num_malicious=f, num_selected=m > 1)  == flwr Krum(num_malicious_clients=f, num_clients_to_keep=m)

and, for every pair, in three more settings:

- uniform weighting: ``weighting="uniform"`` with the clients' real ``num_examples`` == Flower with every client
  reporting ``num_examples = 1`` (Flower has no uniform option: its clients report equal counts);
- integer buffers (BatchNorm's int64 ``num_batches_tracked``): fedlit keeps int64 and rounds to the nearest
  integer (half to even) what Flower returns as float64. FedAvg is compared with ``flwr FedAvg(inplace=False)``:
  Flower's default in-place average casts each client's weight to the array's dtype, which truncates the
  weights of an int64 array to 0 and returns 0. FedOpt only averages integer buffers (a documented deviation:
  they count steps), so there they equal Flower's weighted mean ``flwr.server.strategy.aggregate.aggregate``;
- partial participation: each round only a subset of the clients uploads (the others keep their state).
"""

import numpy as np
import pytest
import torch

FLWR_MISSING = (
    "flwr is not installed: fedlit's strategies are not compared with Flower's (`make install` "
    "installs it with the dev extra; these tests were written against flwr 1.41.0)"
)
flwr_common = pytest.importorskip("flwr.common", reason=FLWR_MISSING)
flwr_strategy = pytest.importorskip("flwr.server.strategy", reason=FLWR_MISSING)
flwr_aggregate = pytest.importorskip("flwr.server.strategy.aggregate", reason=FLWR_MISSING)

from fedlit.strategies import (  # noqa: E402
    ClientUpdate,
    FedAdagrad,
    FedAdam,
    FedAvg,
    FedMedian,
    FedTrimmedAvg,
    FedYogi,
    Krum,
)

SHAPES = {"conv.weight": (3, 2, 2), "conv.bias": (3,), "fc.weight": (4, 5), "fc.bias": (1,)}
STEPS = "bn.num_batches_tracked"  # an int64 buffer, added where a test asks for it
NUM_EXAMPLES = [12, 30, 7, 51, 20]
ROUNDS = 3
TOL = {"rtol": 1e-5, "atol": 1e-6}


def initial_state(seed: int = 0, int_buffer: bool = False) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    state = {k: torch.randn(s, generator=g) for k, s in SHAPES.items()}
    if int_buffer:
        state[STEPS] = torch.tensor(41)
    return state


def client_states(
    server, server_round: int, num_clients: int, spread: float = 0.1, outlier: bool = False, equal_steps: bool = False
):
    """Each client = server model + its own random step; with ``outlier`` the last client is far away. An integer
    buffer advances by a different number of steps per client (odd gaps, so even-count medians end in .5), or by
    the same number with ``equal_steps``."""
    g = torch.Generator().manual_seed(100 + server_round)
    states = []
    for i in range(num_clients):
        steps = 5 if equal_steps else 3 * i + 2 * server_round + 1
        states.append(
            {
                k: t + spread * torch.randn(t.shape, generator=g) if t.is_floating_point() else t + steps
                for k, t in server.items()
            }
        )
    if outlier:
        states[-1] = {k: t + 5.0 if t.is_floating_point() else t for k, t in states[-1].items()}
    return states


def to_fitres(states, num_examples):
    """Flower's ``aggregate_fit`` input: (ClientProxy, FitRes) pairs (the proxy is unused by these strategies)."""
    ok = flwr_common.Status(code=flwr_common.Code.OK, message="")
    return [
        (
            None,
            flwr_common.FitRes(
                status=ok,
                num_examples=n,
                metrics={},
                parameters=flwr_common.ndarrays_to_parameters([t.numpy() for t in s.values()]),
            ),
        )
        for s, n in zip(states, num_examples, strict=True)
    ]


def from_parameters(parameters, keys) -> dict[str, np.ndarray]:
    return dict(zip(keys, flwr_common.parameters_to_ndarrays(parameters), strict=True))


def flower_weighted_mean(states, num_examples) -> dict[str, np.ndarray]:
    """Flower's weighted mean (``aggregate``, float64 for integer arrays)."""
    arrays = flwr_aggregate.aggregate(
        [([t.numpy() for t in s.values()], n) for s, n in zip(states, num_examples, strict=True)]
    )
    return dict(zip(states[0], arrays, strict=True))


def run_both(
    ours,
    theirs,
    outlier: bool = False,
    num_examples=tuple(NUM_EXAMPLES),
    flower_num_examples=None,
    participants=None,
    int_buffer: bool = False,
    equal_steps: bool = False,
    steps_from_mean: bool = False,
):
    """Three rounds on both sides; asserts equality after every round and returns the last server models.

    Args:
        flower_num_examples: What the clients report to Flower (default: ``num_examples``).
        participants: The clients that upload, round by round (default: all).
        int_buffer: Add the int64 buffer ``STEPS``: fedlit's value must equal Flower's rounded.
        steps_from_mean: Compare the int64 buffer with Flower's weighted mean instead of ``theirs`` (FedOpt).
    """
    num_clients = len(num_examples)
    flower_num_examples = list(flower_num_examples or num_examples)
    participants = participants or [list(range(num_clients))] * ROUNDS
    x0 = initial_state(int_buffer=int_buffer)
    ours.initialize(x0, [str(i) for i in range(num_clients)])
    server = x0
    for server_round, chosen in enumerate(participants, start=1):
        states = client_states(server, server_round, num_clients, outlier=outlier, equal_steps=equal_steps)
        states = [states[i] for i in chosen]
        updates = [
            ClientUpdate(client_id=str(i), num_examples=num_examples[i], state=s)
            for i, s in zip(chosen, states, strict=True)
        ]
        mine = ours.global_state = ours.aggregate(server_round, updates)  # as the loop stores it
        reported = [flower_num_examples[i] for i in chosen]
        parameters, _ = theirs.aggregate_fit(server_round, to_fitres(states, reported), [])
        flower = from_parameters(parameters, list(x0))
        if int_buffer and steps_from_mean:
            flower[STEPS] = flower_weighted_mean(states, reported)[STEPS]
        for k in SHAPES:
            assert mine[k].dtype == torch.float32
            assert torch.allclose(mine[k].double(), torch.from_numpy(np.asarray(flower[k], np.float64)), **TOL), (
                server_round,
                k,
            )
        if int_buffer:
            assert mine[STEPS].dtype == torch.int64
            assert mine[STEPS].item() == int(np.round(flower[STEPS])), (server_round, flower[STEPS])
        server = {k: t.clone() for k, t in mine.items()}
    # the rounds moved the model: the comparison is not between two unchanged copies
    assert not torch.allclose(server["fc.weight"], x0["fc.weight"])
    return server


def initial_parameters(int_buffer: bool = False):
    return flwr_common.ndarrays_to_parameters([t.numpy() for t in initial_state(int_buffer=int_buffer).values()])


def test_fedavg_equals_flower_fedavg():
    run_both(FedAvg(), flwr_strategy.FedAvg())


def test_fedadam_with_bias_correction_equals_flower_fedadam():
    run_both(
        FedAdam(eta=0.05, tau=0.01, beta_1=0.9, beta_2=0.99, bias_correction=True),
        flwr_strategy.FedAdam(initial_parameters=initial_parameters(), eta=0.05, tau=0.01, beta_1=0.9, beta_2=0.99),
    )


def test_fedadam_without_bias_correction_differs_from_flower_by_its_step_size():
    # Same m, v: our default step is eta (Reddi et al.'s Algorithm 2), Flower's eta sqrt(1 - b2^(t+1)) / (1 - b1^(t+1)).
    ours = FedAdam(eta=0.05, tau=0.01)
    flower_like = FedAdam(eta=0.05, tau=0.01, bias_correction=True)
    assert ours.step_size(1) == 0.05
    assert flower_like.step_size(1) == pytest.approx(0.05 * (1 - 0.99**2) ** 0.5 / (1 - 0.9**2))
    x_ours = run_both(FedAdam(eta=0.05, tau=0.01), _NoBiasFlowerFedAdam())
    x_flower = run_both(flower_like, flwr_strategy.FedAdam(initial_parameters=initial_parameters(), eta=0.05, tau=0.01))
    assert not torch.allclose(x_ours["fc.weight"], x_flower["fc.weight"], **TOL)


class _NoBiasFlowerFedAdam:
    """Flower's FedAdam with its step-size correction undone through ``eta``: equal to our default FedAdam, so
    the bias correction is the only difference between the two."""

    def __init__(self):
        self.inner = flwr_strategy.FedAdam(initial_parameters=initial_parameters(), eta=0.05, tau=0.01)

    def aggregate_fit(self, server_round, results, failures):
        # Flower uses eta_norm = eta sqrt(1 - b2^(t+1)) / (1 - b1^(t+1)); dividing eta by that factor undoes it.
        factor = (1 - 0.99 ** (server_round + 1.0)) ** 0.5 / (1 - 0.9 ** (server_round + 1.0))
        self.inner.eta = 0.05 / factor
        return self.inner.aggregate_fit(server_round, results, failures)


def test_fedadagrad_without_momentum_equals_flower_fedadagrad():
    # Flower's FedAdagrad fixes beta_1 = 0; ours defaults to Algorithm 2's momentum 0.9.
    run_both(
        FedAdagrad(eta=0.05, tau=0.01, beta_1=0.0),
        flwr_strategy.FedAdagrad(initial_parameters=initial_parameters(), eta=0.05, tau=0.01),
    )


def test_fedyogi_equals_flower_fedyogi():
    run_both(
        FedYogi(eta=0.05, tau=0.01, beta_1=0.9, beta_2=0.99),
        flwr_strategy.FedYogi(initial_parameters=initial_parameters(), eta=0.05, tau=0.01, beta_1=0.9, beta_2=0.99),
    )


def test_fedmedian_equals_flower_fedmedian_odd_and_even_client_counts():
    run_both(FedMedian(), flwr_strategy.FedMedian(), outlier=True)
    # 4 clients: the two middle values are averaged (numpy.median), not the lower one taken (torch.median)
    run_both(FedMedian(), flwr_strategy.FedMedian(), outlier=True, num_examples=NUM_EXAMPLES[:4])


@pytest.mark.parametrize("beta", [0.0, 0.2, 0.45])
def test_fedtrimmedavg_equals_flower_fedtrimmedavg(beta):
    run_both(FedTrimmedAvg(beta=beta), flwr_strategy.FedTrimmedAvg(beta=beta), outlier=True)


@pytest.mark.parametrize(("num_malicious", "num_selected"), [(0, 1), (1, 1), (1, 2), (1, 3), (0, 5)])
def test_krum_and_multikrum_equal_flower_krum(num_malicious, num_selected):
    keep = 0 if num_selected == 1 else num_selected  # Flower: 0 means Krum
    run_both(
        Krum(num_malicious=num_malicious, num_selected=num_selected),
        flwr_strategy.Krum(num_malicious_clients=num_malicious, num_clients_to_keep=keep),
        outlier=True,
    )


def test_krum_warns_when_too_few_clients_for_its_guarantee():
    x0 = initial_state()
    krum = Krum(num_malicious=2)
    krum.initialize(x0, [])
    states = client_states(x0, 1, 5)
    with pytest.warns(UserWarning, match="more than 6 updates"):
        krum.aggregate(1, [ClientUpdate(client_id=str(i), num_examples=1, state=s) for i, s in enumerate(states)])


def test_krum_never_keeps_the_outlier():
    x0 = initial_state()
    krum = Krum(num_malicious=1, num_selected=1)
    krum.initialize(x0, [])
    states = client_states(x0, 1, len(NUM_EXAMPLES), outlier=True)
    updates = [
        ClientUpdate(client_id=str(i), num_examples=n, state=s)
        for i, (s, n) in enumerate(zip(states, NUM_EXAMPLES, strict=True))
    ]
    out = krum.aggregate(1, updates)
    kept = [i for i, s in enumerate(states) if all(torch.equal(out[k], s[k]) for k in SHAPES)]
    assert len(kept) == 1 and kept[0] != len(states) - 1


# ------------------------------------------------------------- uniform weighting, integer buffers, partial rounds
ETA, TAU = 0.05, 0.01
WEIGHTED = ["FedAvg", "FedAdam", "FedAdagrad", "FedYogi", "MultiKrum"]
UNWEIGHTED = ["FedMedian", "FedTrimmedAvg"]
FEDOPT = {"FedAdam", "FedAdagrad", "FedYogi"}
PARTICIPANTS = [[0, 1, 3], [1, 2, 4], [0, 2, 3, 4]]  # round by round, a subset of the 5 clients


def pair(name, weighting="num_examples", int_buffer=False):
    """fedlit's strategy and Flower's, with the settings that make them equal (the module docstring's table)."""
    start = initial_parameters(int_buffer)
    adam_like = {"eta": ETA, "tau": TAU, "beta_1": 0.9, "beta_2": 0.99}
    if name == "FedAvg":
        return FedAvg(weighting=weighting), flwr_strategy.FedAvg(inplace=not int_buffer)
    if name == "FedAdam":
        return (
            FedAdam(**adam_like, bias_correction=True, weighting=weighting),
            flwr_strategy.FedAdam(initial_parameters=start, **adam_like),
        )
    if name == "FedAdagrad":
        return (
            FedAdagrad(eta=ETA, tau=TAU, beta_1=0.0, weighting=weighting),
            flwr_strategy.FedAdagrad(initial_parameters=start, eta=ETA, tau=TAU),
        )
    if name == "FedYogi":
        return (FedYogi(**adam_like, weighting=weighting), flwr_strategy.FedYogi(initial_parameters=start, **adam_like))
    if name == "MultiKrum":
        return (
            Krum(num_malicious=0, num_selected=2, weighting=weighting),
            flwr_strategy.Krum(num_malicious_clients=0, num_clients_to_keep=2),
        )
    if name == "FedMedian":
        return FedMedian(), flwr_strategy.FedMedian()
    # beta = 0.34 trims one client at each end of 3, 4 or 5
    return FedTrimmedAvg(beta=0.34), flwr_strategy.FedTrimmedAvg(beta=0.34)


@pytest.mark.parametrize("name", WEIGHTED)
def test_uniform_weighting_equals_flower_with_equal_client_counts(name):
    uniform = run_both(*pair(name, weighting="uniform"), flower_num_examples=[1] * len(NUM_EXAMPLES))
    weighted = run_both(*pair(name))
    # the clients' counts differ (7 to 51): weighing them equally gives another model
    assert not torch.allclose(uniform["fc.weight"], weighted["fc.weight"], **TOL)


@pytest.mark.parametrize("name", WEIGHTED + UNWEIGHTED + ["FedAvg-uniform", "FedMedian-even"])
def test_integer_buffers_are_flowers_values_rounded_and_stay_int64(name):
    base, _, variant = name.partition("-")
    kwargs = {"int_buffer": True}
    if variant == "uniform":
        kwargs["flower_num_examples"] = [1] * len(NUM_EXAMPLES)
    if variant == "even":  # 4 clients: the median of the steps falls between two integers
        kwargs["num_examples"] = NUM_EXAMPLES[:4]
    # Krum's distances leave integer tensors out (a documented deviation), Flower's do not: with equal step
    # counts the two measure the same distances
    kwargs["equal_steps"] = base == "MultiKrum"
    kwargs["steps_from_mean"] = base in FEDOPT
    run_both(*pair(base, weighting=variant or "num_examples", int_buffer=True), **kwargs)


def test_integer_buffer_rounding_is_exercised():
    # round 1 of the weighted mean: steps 41 + (3, 6, 9, 12, 15) = 44, 47, 50, 53, 56 weighted by 12, 30, 7, 51, 20
    # (sum 120): (528 + 1410 + 350 + 2703 + 1120) / 120 = 6111 / 120 = 50.925 -> 51 (truncation would give 50)
    states = client_states(initial_state(int_buffer=True), 1, len(NUM_EXAMPLES))
    assert [s[STEPS].item() for s in states] == [44, 47, 50, 53, 56]
    ours = FedAvg()
    ours.initialize(initial_state(int_buffer=True), [str(i) for i in range(5)])
    out = ours.aggregate(
        1,
        [
            ClientUpdate(client_id=str(i), num_examples=n, state=s)
            for i, (s, n) in enumerate(zip(states, NUM_EXAMPLES, strict=True))
        ],
    )
    assert out[STEPS].item() == 51
    # 4 clients: median of 44, 47, 50, 53 = 48.5 -> 48 (half to even, as numpy.round; half up would give 49)
    median = FedMedian()
    median.initialize(initial_state(int_buffer=True), [str(i) for i in range(4)])
    out = median.aggregate(
        1, [ClientUpdate(client_id=str(i), num_examples=1, state=s) for i, s in enumerate(states[:4])]
    )
    assert out[STEPS].item() == 48


@pytest.mark.parametrize("name", WEIGHTED + UNWEIGHTED)
def test_partial_participation_equals_flower_on_the_same_subsets(name):
    run_both(*pair(name), participants=PARTICIPANTS)
