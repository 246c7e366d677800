"""What hooks receive as ``trainer``: a read-only ServerContext on the server side, the turn's ClientContext in a
client's turn."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from lightning.pytorch import Callback

from fedlit import Federation, Local, RoleRule
from fedlit.core.contexts import ClientContext, ServerContext
from fedlit.models import Backbone
from fedlit.tasks import ClassificationModule
from tests.conftest import TinyTabular


class LinearOnly(Backbone):
    def build(self) -> torch.nn.Module:
        net = torch.nn.Linear(4, 8)
        net.num_features = 8
        return net


def _federation(out_dir, callbacks, rounds) -> Federation:
    torch.manual_seed(0)
    module = ClassificationModule(
        backbone=LinearOnly(), num_classes=3, lr=0.01, roles=[RoleRule("backbone.*", "shared")]
    )
    return Federation(
        module,
        TinyTabular(),
        Local(),
        rounds=rounds,
        out_dir=out_dir,
        progress_bar=False,
        accelerator="cpu",
        callbacks=callbacks,
    )


class ServerSide(Callback):
    """Records what the server hooks see, tries to change the run, and asks to stop after ``stop_at``."""

    def __init__(self, stop_at: int) -> None:
        self.stop_at, self.seen, self.refused = stop_at, [], []

    def on_fit_start(self, trainer) -> None:
        self.seen.append(("fit_start", type(trainer), trainer.server_round, trainer.settings.rounds))

    def on_round_start(self, trainer, server_round) -> None:
        self.seen.append(("round_start", server_round, trainer.server_round, trainer.client_ids))
        for change in (
            lambda: setattr(trainer, "server_round", 99),
            lambda: setattr(trainer.settings, "rounds", 1),
            lambda: setattr(trainer, "should_stop", True),
        ):
            with pytest.raises(AttributeError, match="read-only") as err:
                change()
            self.refused.append(str(err.value))

    def on_round_end(self, trainer, server_round) -> None:
        self.seen.append(("round_end", server_round, trainer.log["comm/clients"], trainer.should_stop))
        if server_round == self.stop_at:
            trainer.request_stop("enough")


def test_server_hooks_get_a_read_only_server_context_whose_stop_ends_the_run_after_the_round(tmp_path):
    watcher = ServerSide(stop_at=2)
    federation = _federation(tmp_path, [watcher], rounds=5)
    federation.fit()
    ids = ["c0", "c1", "c2"]
    assert watcher.seen == [
        ("fit_start", ServerContext, 0, 5),
        ("round_start", 1, 1, ids),
        ("round_end", 1, 3, False),
        ("round_start", 2, 2, ids),
        ("round_end", 2, 3, False),  # stopped after round 2 of 5: no round 3
    ]
    assert len(watcher.refused) == 6 and "request_stop" in watcher.refused[2]
    assert federation.server_round == 2 and federation.settings.rounds == 5
    assert federation.state.stopped_early == {"round": 2, "reason": "enough"}


def test_client_hooks_get_the_turn_context_as_trainer_in_a_simulation(tmp_path):
    class ClientSide(Callback):
        def __init__(self) -> None:
            self.turns = []

        def on_client_fit_start(self, trainer, client, server_round, client_id) -> None:
            self.turns.append(
                (
                    server_round,
                    client_id,
                    trainer is client,
                    isinstance(trainer, ClientContext),
                    trainer.client_id,
                    trainer.rounds,
                    trainer.num_examples("train"),
                )
            )

    watcher = ClientSide()
    federation = _federation(tmp_path, [watcher], rounds=2)
    federation.fit()
    # TinyTabular: 30 samples per client, the first half of them for training.
    assert watcher.turns == [(r, c, True, True, c, 2, 15) for r in (1, 2) for c in ("c0", "c1", "c2")]


def test_request_stop_keeps_the_first_reason_and_the_log_is_a_read_only_view():
    run = SimpleNamespace(should_stop=False, stop_reason=None)
    log = {"a": 1.0}
    context = ServerContext(run, log)
    context.request_stop("first")
    context.request_stop("second")
    assert (run.should_stop, run.stop_reason, context.stop_reason) == (True, "first", "first")
    log["b"] = 2.0  # the round's log grows: the view shows it, and cannot change it
    assert dict(context.log) == {"a": 1.0, "b": 2.0}
    with pytest.raises(TypeError):
        context.log["c"] = 3.0
