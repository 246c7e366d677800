"""A sampled round costs in proportion to its sampled clients: it reads the data and the store of those only."""

from __future__ import annotations

from lightning.pytorch import Callback

from fedlit import FedAvg
from fedlit.core.store import ClientStore
from tests.conftest import TinyTabular, make_federation

_DATA = ("train_dataloader", "val_dataloader", "test_dataloader", "num_examples")
_STORE = (
    "tensors",
    "load_into",
    "save_from",
    "optimizer_state",
    "set_optimizer_state",
    "extra",
    "client_state",
    "nbytes",
)


class _Spy(Callback):
    """Records, in round 2 only, every client whose data or store entry is read, and the round's selection."""

    def __init__(self, monkeypatch) -> None:
        self.active, self.touched, self.selected = False, set(), []
        for owner, names in ((TinyTabular, _DATA), (ClientStore, _STORE)):
            for name in names:
                monkeypatch.setattr(owner, name, self._wrap(getattr(owner, name)))

    def _wrap(self, method):
        def spied(obj, *args, **kwargs):
            if self.active and args and args[0] is not None:  # the client's id (nbytes() is the whole store)
                self.touched.add(args[0])
            return method(obj, *args, **kwargs)

        return spied

    def on_round_start(self, trainer, pl_module, server_round) -> None:
        self.active = server_round == 2

    def on_before_aggregate(self, trainer, pl_module, server_round, updates) -> None:
        if server_round == 2:
            self.selected = [u.client_id for u in updates]

    def on_round_end(self, trainer, pl_module, server_round, metrics) -> None:
        self.active = False


def test_a_sampled_round_reads_the_data_and_store_of_its_clients_only(tmp_path, monkeypatch):
    spy = _Spy(monkeypatch)
    federation = make_federation(
        tmp_path,
        FedAvg(),
        rounds=3,
        num_clients=12,
        clients_per_round=3,
        local_steps=1,
        eval_every=10,
        checkpoint_every=10,
        callbacks=[spy],
    )
    federation.fit()
    assert len(spy.selected) == 3
    assert spy.touched == set(spy.selected)
