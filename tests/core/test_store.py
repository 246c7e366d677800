import copy

import torch

from fedlit.core.store import ClientStore


def test_clients_start_from_the_template_and_keep_their_own_state():
    store = ClientStore()
    live = {"w": torch.zeros(3), "b": torch.zeros(1)}
    store.set_initial({"w": torch.ones(3), "b": torch.full((1,), 2.0)})
    store.load_into("a", live)
    assert live["w"].tolist() == [1, 1, 1] and live["b"].item() == 2
    live["w"] += 5
    store.save_from("a", live)
    live["w"].zero_()
    store.load_into("b", live)  # never trained: the template
    assert live["w"].tolist() == [1, 1, 1]
    store.load_into("a", live)
    assert live["w"].tolist() == [6, 6, 6]
    assert store.client_ids == ["a"]


def test_load_is_in_place_and_save_copies():
    store = ClientStore()
    param = torch.nn.Parameter(torch.zeros(2))
    store.set_initial({"p": torch.ones(2)})
    ptr = param.data_ptr()
    store.load_into("a", {"p": param})
    assert param.data_ptr() == ptr and param.tolist() == [1, 1]
    store.save_from("a", {"p": param})
    with torch.no_grad():
        param.add_(1)
    assert store.tensors("a")["p"].tolist() == [1, 1]


def test_memory_grows_by_one_client_state_per_trained_client():
    store = ClientStore()
    state = {"w": torch.zeros(1000)}
    store.set_initial(state)
    base = store.nbytes()
    for i in range(5):
        store.save_from(str(i), state)
    assert store.nbytes() - base == 5 * 4000
    assert store.nbytes("3") == 4000
    # a strategy's per-client state (APPLE's p_i and personalized model...) and optimizer state count too
    store.extra("3", "APPLE").update({"p": torch.zeros(5), "model": {"w": torch.zeros(10, dtype=torch.float64)}})
    store.set_optimizer_state("3", {"state": {0: {"momentum_buffer": torch.zeros(7)}}, "param_groups": [{"lr": 0.1}]})
    store.extra("9", "APPLE")["p"] = torch.zeros(3)  # state without stored tensors
    assert store.nbytes("3") == 4000 + 5 * 4 + 10 * 8 + 7 * 4
    assert store.nbytes() - base == 5 * 4000 + 5 * 4 + 10 * 8 + 7 * 4 + 3 * 4


def test_state_dict_round_trip_with_optimizer_and_extras():
    store = ClientStore()
    store.set_initial({"w": torch.zeros(2)})
    store.save_from("a", {"w": torch.ones(2)})
    store.set_optimizer_state("a", {"state": {0: {"momentum_buffer": torch.ones(2)}}, "param_groups": []})
    store.extra("a", "SCAFFOLD")["c_i"] = torch.full((2,), 3.0)
    other = ClientStore()
    other.load_state_dict(store.state_dict())
    assert other.tensors("a")["w"].tolist() == [1, 1]
    assert other.optimizer_state("a")["state"][0]["momentum_buffer"].tolist() == [1, 1]
    assert other.extra("a", "SCAFFOLD")["c_i"].tolist() == [3, 3]


def test_a_federation_stores_only_personal_tensors_per_client(tmp_path):
    from fedlit import FedAvg, RoleRule
    from tests.conftest import make_federation

    # backbone shared, head personal: the store must hold N x head, never a copy of the shared backbone
    federation = make_federation(
        tmp_path, FedAvg(), rounds=1, roles=[RoleRule("backbone.*", "shared"), RoleRule("head.*", "personal")]
    )
    federation.fit()
    head_bytes = (3 * 8 + 3) * 4  # TinyMLP's 8 features -> 3 classes: weight 3x8 + bias 3, float32
    for client in ("c0", "c1", "c2"):
        assert set(federation.store.tensors(client)) == {"head.weight", "head.bias"}
        assert federation.store.nbytes(client) == head_bytes
    assert federation.store.nbytes() == 4 * head_bytes  # 3 clients + the template of untrained clients


def test_nbytes_follows_reallocation_retain_and_loading():
    store = ClientStore()
    store.set_initial({"w": torch.zeros(10)})
    store.save_from("a", {"w": torch.zeros(10)})
    store.save_from("b", {"w": torch.zeros(10)})
    store.save_from("a", {"w": torch.zeros(10), "v": torch.zeros(5, dtype=torch.float64)})  # other names: new entry
    store.set_optimizer_state("b", {"state": {0: {"exp_avg": torch.zeros(3)}}, "param_groups": []})
    assert (store.nbytes("a"), store.nbytes("b"), store.nbytes()) == (80, 52, 40 + 80 + 52)
    saved = copy.deepcopy(store.state_dict())  # state_dict() holds the live entries
    store.load_client_state("b", {"tensors": None, "optimizer": None, "extra": None})
    assert (store.nbytes("b"), store.nbytes()) == (0, 40 + 80)
    store.load_client_state("b", {"tensors": {"w": torch.zeros(2)}, "optimizer": None, "extra": None})
    assert store.nbytes("b") == 8
    restored = ClientStore()
    restored.load_state_dict(saved)
    assert (restored.nbytes("a"), restored.nbytes("b"), restored.nbytes()) == (80, 52, 172)
    restored.retain({"b"})
    assert (restored.nbytes("a"), restored.nbytes()) == (0, 40 + 52)


def test_nbytes_of_the_store_walks_no_client_s_tensors(monkeypatch):
    """The store's size is logged every round: with 1,000 clients, walking every entry costs in proportion to the
    clients, not to the round's work."""
    import fedlit.core.store as store_module

    store = ClientStore()
    store.set_initial({"w": torch.zeros(4)})
    for i in range(3):
        store.save_from(str(i), {"w": torch.zeros(4)})
    walked = []
    real = store_module.nbytes
    monkeypatch.setattr(store_module, "nbytes", lambda tree: walked.append(tree) or real(tree))
    assert store.nbytes() == 4 * 16
    assert not any(tree is store.tensors(str(i)) for tree in walked for i in range(3))
