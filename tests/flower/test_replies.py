"""The server checks every node's reply (fedlit.flower.replies) and treats a bad one as a failed node.

First the pure checks on hand-made replies, then deployments in process (fedlit.flower.inprocess) where one node's
reply is tampered with in round 2: the run goes on without that client (its fault recorded with the reason, the
global model the honest clients' alone) under ``on_client_error: skip``, or stops naming it under ``raise``.
"""

from __future__ import annotations

import json
import math
import warnings

import pytest
import torch

pytest.importorskip("flwr.app", reason="flwr is not installed (pip install 'fedlit[flower]'): no Flower deployment")

from flwr.app import ConfigRecord, RecordDict  # noqa: E402

from fedlit import strategies as S  # noqa: E402
from fedlit.core.errors import FedlitError  # noqa: E402
from fedlit.engine.loop.client import ClientTurn  # noqa: E402
from fedlit.engine.loop.tasks import EvaluateResult, EvaluateTask, FitTask  # noqa: E402
from fedlit.flower import codec  # noqa: E402
from fedlit.flower.client import encode_turn  # noqa: E402
from fedlit.flower.inprocess import InProcessTransport, deploy  # noqa: E402
from fedlit.flower.replies import evaluate_reply, train_reply  # noqa: E402
from fedlit.strategies.base import ClientUpdate  # noqa: E402
from tests.conftest import make_federation  # noqa: E402

NAN = float("nan")


# --- the checks, on hand-made replies -------------------------------------------------------------------------------


def _sent() -> dict[str, torch.Tensor]:
    return {"head.weight": torch.zeros(3, 8), "head.bias": torch.zeros(3), "bn.num_batches_tracked": torch.tensor(0)}


TASK = FitTask("site_1", _sent())


def _reply(state=None, *, client_id="site_1", num_examples=15, metrics=None, extras=None, problem=None):
    """A train reply as a node encodes it, from an honest upload with the given fields replaced."""
    state = (
        {"head.weight": torch.ones(3, 8), "head.bias": torch.ones(3), "bn.num_batches_tracked": torch.tensor(4)}
        if state is None
        else state
    )
    metrics = {"loss": 0.5, "steps": 4.0} if metrics is None else metrics
    update = ClientUpdate(client_id, num_examples, state, metrics, extras or {})
    return encode_turn(ClientTurn(update, 999, problem))


def _check(reply, expected=("head.weight", "head.bias", "bn.num_batches_tracked")):
    return train_reply(reply, TASK, expected=list(expected), train_size=15, download_bytes=123)


def test_an_honest_reply_becomes_its_turn_with_the_servers_download_count():
    turn = _check(_reply())
    assert isinstance(turn, ClientTurn) and turn.problem is None
    assert turn.download_bytes == 123  # counted by the server from what it sent, not the reply's 999
    assert turn.update.client_id == "site_1" and turn.update.num_examples == 15
    assert turn.update.metrics == {"loss": 0.5, "steps": 4.0}
    assert torch.equal(turn.update.state["head.weight"], torch.ones(3, 8))


def test_a_quarantined_reply_may_carry_nan():
    state = {**_sent(), "head.weight": torch.full((3, 8), NAN)}
    turn = _check(_reply(state, metrics={"loss": NAN, "steps": 0.0}, problem="training loss nan at step 1"))
    assert isinstance(turn, ClientTurn) and turn.problem == "training loss nan at step 1"


def _replace(**kw):
    return {
        **{"head.weight": torch.ones(3, 8), "head.bias": torch.ones(3), "bn.num_batches_tracked": torch.tensor(4)},
        **kw,
    }


def _without(name):
    state = _replace()
    del state[name]
    return state


@pytest.mark.parametrize(
    ("reply", "reason"),
    [
        (
            _reply(_replace(**{"head.weight": torch.ones(1)})),
            "client 'site_1' replied a state whose 'head.weight' has shape (1,), not (3, 8) as sent",
        ),
        (
            _reply(_replace(**{"head.bias": torch.ones(3, dtype=torch.float64)})),
            "client 'site_1' replied a state whose 'head.bias' is float64, not float32 as sent",
        ),
        (_reply(_without("head.bias")), "client 'site_1' replied a state without 'head.bias' (2 tensors, 3 expected)"),
        (
            _reply(_replace(extra=torch.ones(2))),
            "client 'site_1' replied a state with 'extra', which the server did not send or does not expect back",
        ),
        (
            _reply(_replace(**{"head.weight": [1.0, 2.0]})),
            "client 'site_1' replied a state whose 'head.weight' is a list, not a tensor",
        ),
        (
            _reply(_replace(**{"head.bias": torch.tensor([0.0, math.inf, 0.0])})),
            "client 'site_1' replied a state whose 'head.bias' is not finite, with no problem reported",
        ),
        (_reply(client_id="site_0"), "client 'site_1' replied as client 'site_0' (the task was for 'site_1')"),
        (
            _reply(num_examples=10**12),
            "client 'site_1' replied num_examples=1000000000000, not 15 (the train size its node declared when the "
            "run started: a client's weight is fixed for the run)",
        ),
        (_reply(num_examples=-5), "client 'site_1' replied num_examples=-5, not 15"),
        (_reply(num_examples=0), "client 'site_1' replied num_examples=0, not 15"),
        # a size that changes after the query, even to a smaller one, is refused
        (_reply(num_examples=14), "client 'site_1' replied num_examples=14, not 15 (the train size its node declared"),
        (_reply(num_examples=16), "client 'site_1' replied num_examples=16, not 15"),
        (
            _reply(metrics={"loss": NAN, "steps": 4.0}),
            "client 'site_1' replied a metric 'loss' = nan with no problem reported",
        ),
        (
            _reply(metrics={"loss": 0.5, "steps": 4.0, "dp": math.inf}),
            "client 'site_1' replied a metric 'dp' = inf with no problem reported",
        ),
        (
            _reply(metrics={"loss": math.inf, "steps": 4.0}, problem="quarantined"),
            "client 'site_1' replied a metric 'loss' = inf",
        ),
        (_reply(metrics={"loss": 0.5}), "client 'site_1' replied metrics without 'steps'"),
        (_reply(metrics={"loss": 0.5, "steps": -1.0}), "client 'site_1' replied a metric 'steps' = -1.0, below 0"),
        (
            _reply(metrics={"loss": True, "steps": 4.0}),
            "client 'site_1' replied a metric 'loss' of type bool, not a number",
        ),
        (
            _reply(metrics={"loss": torch.tensor(0.5), "steps": 4.0}),
            "client 'site_1' replied a metric 'loss' of type Tensor, not a number",
        ),
        (
            _reply(extras={"delta": {"w": torch.full((2,), NAN)}}),
            "client 'site_1' replied an extra whose 'delta.w' is not finite, with no problem reported",
        ),
        (_reply(problem=7), "client 'site_1' replied a problem of type int, not a string or null"),
        (RecordDict(), "client 'site_1' sent a train reply the server cannot read (KeyError"),
    ],
)
def test_a_bad_reply_is_refused_with_a_reason_naming_the_client(reply, reason):
    why = _check(reply)
    assert isinstance(why, str) and why.startswith(reason) and "\n" not in why


def test_num_examples_as_a_float_is_refused():
    reply = _reply()
    reply.config_records["turn"]["num-examples"] = 1e12
    assert _check(reply).startswith("client 'site_1' replied num_examples=1000000000000.0, not 15")


def test_a_strategy_that_expects_fewer_tensors_back_refuses_the_others():
    state = {"head.weight": torch.ones(3, 8)}
    assert isinstance(_check(_reply(state), expected=["head.weight"]), ClientTurn)
    assert _check(_reply(), expected=["head.weight"]).startswith("client 'site_1' replied a state with 'head.bias'")


EVAL = EvaluateTask("site_1", _sent(), splits=("val", "test"))


def _evaluation(metrics, *, client_id="site_1", download=40, image=None):
    reply = RecordDict({"evaluation": ConfigRecord({"client-id": client_id, "download-bytes": download})})
    codec.put_tree(reply, "metrics", metrics)
    codec.put_tree(reply, "image", image)
    return reply


def test_an_honest_evaluation_reply_may_report_an_undefined_metric_as_nan():
    metrics = {"val": {"loss": 0.7, "auroc": NAN}, "test": {"loss": 0.8, "accuracy": 1}}
    result = evaluate_reply(_evaluation(metrics), EVAL, sent_bytes=108)
    assert isinstance(result, EvaluateResult) and result.download_bytes == 40
    assert result.metrics["test"] == {"loss": 0.8, "accuracy": 1} and math.isnan(result.metrics["val"]["auroc"])
    with_global = EvaluateTask("site_1", _sent(), _sent(), ("val",))
    both = evaluate_reply(_evaluation({"val": {"loss": 0.7}, "global/val": {"loss": 0.9}}), with_global, sent_bytes=216)
    assert isinstance(both, EvaluateResult) and both.metrics["global/val"] == {"loss": 0.9}


@pytest.mark.parametrize(
    ("reply", "reason"),
    [
        (
            _evaluation({"val": {"loss": 0.7}}, client_id="site_0"),
            "client 'site_1' replied as client 'site_0' (the task was for 'site_1')",
        ),
        (_evaluation({"val": {"loss": math.inf}}), "client 'site_1' replied an evaluation metric val/loss = inf"),
        (
            _evaluation({"val": {"loss": "low"}}),
            "client 'site_1' replied an evaluation metric val/loss of type str, not a number",
        ),
        (
            _evaluation({"train": {"loss": 0.7}}),
            "client 'site_1' replied evaluation metrics for 'train', which the server did not ask for",
        ),
        (
            _evaluation({"global/val": {"loss": 0.7}}),
            "client 'site_1' replied evaluation metrics for 'global/val', which the server did not ask for",
        ),
        (
            _evaluation({"val": [0.7]}),
            "client 'site_1' replied evaluation metrics for 'val' of type list, not a dict of numbers",
        ),
        (
            _evaluation({"val": {"loss": 0.7}}, download=10**9),
            "client 'site_1' replied download bytes 1000000000, not an int in 0..108",
        ),
        (
            _evaluation({"val": {"loss": 0.7}}, image=[1]),
            "client 'site_1' replied a validation image of type list, not a tensor",
        ),
        (
            RecordDict({"evaluation": ConfigRecord({"download-bytes": 0})}),
            "client 'site_1' sent an evaluation reply the server cannot read (KeyError",
        ),
    ],
)
def test_a_bad_evaluation_reply_is_refused_with_a_reason_naming_the_client(reply, reason):
    why = evaluate_reply(reply, EVAL, sent_bytes=108)
    assert isinstance(why, str) and why.startswith(reason) and "\n" not in why


# --- a tampered reply in a deployment -------------------------------------------------------------------------------

CLIENTS = ["c0", "c1", "c2"]


class Tampering(InProcessTransport):
    """Nodes in this process; ``tamper(reply)`` edits client c1's reply to the message ``kind`` of round 2."""

    def __init__(self, builders, tamper, kind="train", **kwargs):
        super().__init__(builders, **kwargs)
        self.tamper, self.kind = tamper, kind

    def exchange(self, messages, group, timeout):
        replies = super().exchange(messages, group, timeout)
        if group == ("2" if self.kind == "train" else "2-evaluate"):
            for (node, message_type, _), reply in zip(messages, replies, strict=True):
                if self.clients[node] == "c1" and message_type == self.kind:
                    self.tamper(reply)
        return replies


def _state(edit):
    def tamper(reply):
        state = codec.get_tree(reply, "state")
        edit(state)
        codec.put_tree(reply, "state", state)

    return tamper


def _turn(key, value):
    def tamper(reply):
        reply.config_records["turn"][key] = value

    return tamper


def _loss_nan(reply):
    metrics = codec.get_tree(reply, "metrics")
    codec.put_tree(reply, "metrics", {**metrics, "loss": NAN})


TAMPERS = {  # name: (tamper, the reason recorded)
    "shape (1,)": (
        _state(lambda s: s.update({"backbone.0.weight": torch.full((1,), 1000.0)})),
        "client 'c1' replied a state whose 'backbone.0.weight' has shape (1,), not (8, 4) as sent",
    ),
    "num_examples 1e12": (
        _turn("num-examples", 10**12),
        "client 'c1' replied num_examples=1000000000000, not 15 (the train size its node declared when the run "
        "started: a client's weight is fixed for the run)",
    ),
    "num_examples -5": (_turn("num-examples", -5), "client 'c1' replied num_examples=-5, not 15"),
    "missing key": (
        _state(lambda s: s.pop("backbone.0.bias")),
        "client 'c1' replied a state without 'backbone.0.bias'",
    ),
    "extra key": (
        _state(lambda s: s.update({"intruder": torch.zeros(2)})),
        "client 'c1' replied a state with 'intruder', which the server did not send",
    ),
    "another client's id": (_turn("client-id", "c0"), "client 'c1' replied as client 'c0' (the task was for 'c1')"),
    "NaN state, problem null": (
        _state(lambda s: s["backbone.0.weight"].fill_(NAN)),
        "client 'c1' replied a state whose 'backbone.0.weight' is not finite, with no problem reported",
    ),
    "NaN loss": (_loss_nan, "client 'c1' replied a metric 'loss' = nan with no problem reported"),
}


def _builder(path, **kwargs):
    return lambda: make_federation(path, S.FedAvg(), **kwargs)


@pytest.fixture(scope="module")
def honest_only(tmp_path_factory):
    """The global model of the run in which c1's node dies in round 2: the honest clients' aggregate."""

    def die(client_id, message_type, server_round):
        if (client_id, message_type, server_round) == ("c1", "train", 2):
            raise ConnectionError("node process killed")

    path = tmp_path_factory.mktemp("honest")
    server = _builder(path / "dep", on_client_error="skip")()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        deploy(server, InProcessTransport({c: _builder(path / "node") for c in CLIENTS}, fail=die))
    return server.strategy.global_state


@pytest.mark.parametrize("case", list(TAMPERS))
def test_a_tampered_reply_leaves_its_client_out_with_skip(tmp_path, honest_only, case):
    tamper, reason = TAMPERS[case]
    transport = Tampering({c: _builder(tmp_path / "node") for c in CLIENTS}, tamper)
    server = _builder(tmp_path / "dep", on_client_error="skip")()
    with pytest.warns(UserWarning, match=r"Round 2: client 'c1' \(Flower node 102\) failed: client 'c1' replied"):
        deploy(server, transport)
    faults = json.loads((tmp_path / "dep" / "results.json").read_text())["faults"]
    assert len(faults) == 1 and faults[0]["round"] == 2 and faults[0]["client"] == "c1"
    assert faults[0]["kind"] == "error" and faults[0]["detail"].startswith(reason)
    assert server.strategy.global_state.keys() == honest_only.keys()
    for name, tensor in honest_only.items():
        assert torch.equal(server.strategy.global_state[name], tensor), name


@pytest.mark.parametrize("case", ["shape (1,)", "another client's id"])
def test_a_tampered_reply_stops_the_run_naming_its_client_with_raise(tmp_path, case):
    tamper, reason = TAMPERS[case]
    transport = Tampering({c: _builder(tmp_path / "node") for c in CLIENTS}, tamper)
    with pytest.raises(FedlitError, match=r"Round 2: the turn of client 'c1' \(Flower node 102\) failed: ") as err:
        deploy(_builder(tmp_path / "dep")(), transport)
    assert reason in str(err.value) and "\n" not in str(err.value)


def test_a_tampered_evaluation_stops_the_run_naming_its_client_with_raise(tmp_path):
    def tamper(reply):
        codec.put_tree(reply, "metrics", {"val": {"loss": math.inf}})

    transport = Tampering({c: _builder(tmp_path / "node") for c in CLIENTS}, tamper, kind="evaluate")
    with pytest.raises(
        FedlitError,
        match=r"Round 2: the evaluation of client 'c1' \(Flower node 102\) failed: "
        r"client 'c1' replied an evaluation metric val/loss = inf",
    ):
        deploy(_builder(tmp_path / "dep")(), transport)
