"""Where a run's state lives (fedlit.engine.loop.placement): the server's state and the client store on the store's
device from the start, after a client's turn and after a resume. The ``meta`` device stands in for a device other
than the CPU the live module trains on (its tensors have shapes but no values); on CUDA the whole rule is checked by
tests/strategies/test_every_strategy_resumes.py under the ``gpu`` marker."""

from __future__ import annotations

import torch

from fedlit import FedAvg, RoleRule
from fedlit.core.checkpoint_io import load_checkpoint
from fedlit.core.store import ClientStore
from fedlit.core.tensors import tensors
from fedlit.engine.loop import placement, resume
from fedlit.strategies import FedAdam
from tests.conftest import make_federation

META = torch.device("meta")
#: TinyMLP's layers shared, the head personal: the store holds each client's head (and its optimizer state).
ROLES = [RoleRule("backbone.*", "shared"), RoleRule("head.*", "personal")]


def _devices(tree) -> set[str]:
    return {t.device.type for t in tensors(tree)}


def test_a_run_gives_its_strategy_the_initial_state_on_the_stores_device(tmp_path):
    fed = make_federation(tmp_path, FedAdam(eta=0.05), roles=ROLES, store_device="meta")
    fed.setup()
    assert _devices(dict(fed.module.named_parameters())) == {"cpu"}  # the live module trains on the run's device
    state = fed.strategy.state_dict()  # global_state and the moments made from it
    assert set(state) == {"global_state", "m", "v"} and _devices(state) == {"meta"}
    assert _devices(fed.store.state_dict()) == {"meta"} and set(fed.store.tensors("c0")) == {"head.weight", "head.bias"}
    # TinyMLP's Linear(4, 8) and BatchNorm1d(8): the shared tensors, with their shapes
    assert state["global_state"]["backbone.0.weight"].shape == (8, 4)


def test_a_resume_loads_the_server_state_and_the_store_onto_the_stores_device(tmp_path):
    make_federation(tmp_path / "run", FedAdam(eta=0.05), rounds=1, roles=ROLES, optimizer_state="persist").fit()
    path = tmp_path / "run" / "checkpoints" / "last.ckpt"
    payload = load_checkpoint(path)
    assert _devices(payload) == {"cpu"}  # the file is read onto the CPU
    fed = make_federation(tmp_path / "resumed", FedAdam(eta=0.05), roles=ROLES, optimizer_state="persist")
    fed.setup()
    fed.store.device = META  # as if the store lived on a device other than the CPU
    resume.restore(fed, payload, path)
    assert _devices(fed.strategy.state_dict()) == {"meta"} and _devices(fed.store.state_dict()) == {"meta"}
    assert set(fed.store.client_ids) == {"c0", "c1", "c2"} and fed.store.optimizer_state("c0")


def test_the_server_state_is_moved_only_when_a_tensor_is_elsewhere():
    strategy = FedAvg()
    strategy.initialize({"w": torch.ones(2, 3), "b": torch.zeros(3)}, ["c0"], None)
    loads = []
    original = strategy.load_state_dict
    strategy.load_state_dict = lambda state: loads.append(state) or original(state)
    placement.place_server_state(strategy, torch.device("cpu"))
    assert loads == []  # already there: nothing copied
    kept = strategy.global_state["w"]
    strategy.global_state["b"] = torch.zeros(3, device="meta")  # what a hook could leave on another device
    placement.place_server_state(strategy, META)
    assert len(loads) == 1 and _devices(strategy.state_dict()) == {"meta"}
    placement.place_server_state(strategy, META)
    assert len(loads) == 1  # all there now
    assert strategy.global_state["w"].shape == kept.shape == (2, 3)


def test_the_store_moves_what_a_turn_wrote_into_a_clients_extra_state_and_keeps_the_dicts():
    store = ClientStore(META)
    store.set_initial({"w": torch.zeros(2)})
    own = store.extra("c0", "SCAFFOLD")
    own["c_i"] = torch.ones(2)  # written on the live module's device during the turn
    own["history"] = [torch.ones(1), {"last": torch.ones(3)}]
    store.save_from("c0", {"w": torch.ones(2)})
    assert store.extra("c0", "SCAFFOLD") is own  # the strategy's dict, changed in place
    assert _devices(own) == {"meta"} and own["history"][1]["last"].shape == (3,)
    assert _devices(store.state_dict()) == {"meta"} and not store.pin_memory  # pinned only for a CUDA run
