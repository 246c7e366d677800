"""Every strategy fedlit ships resumes exactly: 2 rounds straight == 1 round, a checkpoint, a resume to round 2.

The strategies are discovered, not listed (as timm tests every registered model): every concrete
:class:`~fedlit.strategies.base.Strategy` subclass defined in a module of :mod:`fedlit.strategies`, so a strategy
added later is run here with no new test code. It runs on the tiny federation of ``tests/conftest.py`` (3 clients,
a few samples) with its default arguments and a 2-layer MLP, unless :data:`NEEDS` gives it other arguments or a
tiny model it needs (LoRA, adapters). A strategy that cannot run on what it is given fails here with what to add:
it is never skipped.

After the straight run and the resumed one (fresh objects, another global RNG state), these must be equal, exactly
(``==`` and ``torch.equal``): the results (per-client metrics of the last and best rounds, the global model's when
the strategy has one, the communication totals), the whole client store (each client's tensors, its optimizer
state, its strategy state such as SCAFFOLD's ``c_i``, APPLE's ``p_i``, FedMetaMed's personal model, APFL's ``v``
and ``a``, FedALA's ``W``) and the strategy's ``state_dict()``. Every strategy runs with
``optimizer_state="reset"`` and all clients; those in :data:`PERSIST` also with ``optimizer_state="persist"`` (each
client's optimizer state kept in the store) and 2 of the 3 clients per round (the sampling stream and clients that
sit a round out must resume too).

Each case runs on the CPU and, under the ``gpu`` marker (``make test-gpu``), on CUDA (the ``accelerator`` fixture of
``tests/conftest.py``). Equal also means on the same device: every tensor of the store and of the strategy's state
lies where :mod:`fedlit.engine.loop.placement` says (the store's device, the CPU), in the straight run and after
the resume, and on CUDA the store's tensors are in pinned host memory.
"""

from __future__ import annotations

import importlib
import inspect
import math
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch

import fedlit.strategies
from fedlit import Federation, RoleRule
from fedlit.core.errors import ConfigError
from fedlit.core.tensors import tensors
from fedlit.data import FederatedDataModule
from fedlit.models import Backbone
from fedlit.module import FederatedModule
from fedlit.strategies.base import Strategy
from fedlit.tasks import ClassificationModule
from tests.conftest import TinyMLP, TinyTabular
from tests.strategies.test_epfl import LORA_ROLES, LoRAMLP
from tests.strategies.test_fedsa import LoRANet
from tests.strategies.test_fedsca import ADAPTER_ROLES, AdapterNet
from tests.strategies.test_pfedmoap import tiny_image_sites, tiny_moap_module


def shipped_strategies() -> dict[str, type[Strategy]]:
    """Every concrete Strategy subclass defined in a module of the fedlit.strategies package, by class name."""
    found = {}
    for info in pkgutil.iter_modules(fedlit.strategies.__path__):
        module = importlib.import_module(f"fedlit.strategies.{info.name}")
        for name, obj in vars(module).items():
            if (
                inspect.isclass(obj)
                and issubclass(obj, Strategy)
                and obj.__module__ == module.__name__
                and not inspect.isabstract(obj)
            ):
                found[name] = obj
    return dict(sorted(found.items()))


@dataclass
class Needs:
    """What a strategy needs beyond its defaults and the tiny MLP: constructor arguments, a backbone, roles."""

    kwargs: dict[str, Any] = field(default_factory=dict)
    backbone: Callable[[], Backbone] = TinyMLP
    roles: list[RoleRule] | None = None  # None: every backbone tensor shared
    module: Callable[[], FederatedModule] | None = None  # a whole module instead of a ClassificationModule
    data: Callable[[], FederatedDataModule] | None = None  # other data than the tiny tabular clients


LORA_SHARED = [RoleRule("backbone.*", "frozen"), RoleRule("*lora_*", "shared")]

#: Strategies whose defaults do not fit the tiny federation (or would leave the test trivial), by class name.
NEEDS = {
    "APPLE": Needs({"lr_p": 0.1, "decay_rounds": 2}),  # coef(r) > 0 in both rounds, whatever the run's R
    "EPFL": Needs(backbone=LoRAMLP, roles=LORA_ROLES),
    "FedAdam": Needs({"eta": 0.05, "beta_2": 0.5}),
    "FedAdagrad": Needs({"eta": 0.05}),
    "FedDBE": Needs({"kappa": 0.5}),  # the mean regularizer in round 2, after the warm-up
    "FedDyn": Needs({"alpha": 0.1}),
    "FedMetaMed": Needs({"schedule_rounds": 2}),  # the L schedule of the 2-round run, also in its 1-round leg
    "FedProx": Needs({"mu": 0.5}),
    "FedPxN": Needs({"mu": 0.5}),
    "FedRep": Needs({"head_steps": 1}),  # 1 head step, then 1 body step of the 2-step turn
    "FedRA": Needs({"block_counts": [1, 2], "seed": 3}, backbone=AdapterNet, roles=ADAPTER_ROLES),  # 1 or 2 of 3
    "FedSA": Needs(backbone=LoRANet, roles=LORA_SHARED),
    "FedSCA": Needs({"num_shared_adapters": 3, "alpha": 1.0, "beta": 0.5}, backbone=AdapterNet, roles=ADAPTER_ROLES),
    "FedTrimmedAvg": Needs({"beta": 0.34}),  # trims one of 3 clients at each end
    "FedYogi": Needs({"eta": 0.05, "beta_2": 0.5}),
    "Krum": Needs({"num_selected": 2}),
    "PerFedAvg": Needs({"alpha": 0.1}),  # an adaptation step that moves the tiny model
    # a tiny random CLIP with the gate on 3 synthetic image sites; K = 2: one peer's prompt from round 2 on
    "pFedMoAP": Needs({"num_experts": 2}, module=tiny_moap_module, data=tiny_image_sites),
    # no warm-up, R = 2 also in the 1-round leg: c0's ring hop, then every client personalizes (flags set: distils)
    "MetaFed": Needs({"warmup_rounds": 0, "rounds": 2, "threshold": 0.0}),
}

#: Strategies also run with per-client optimizer state and partial participation: those that keep state per client
#: (in the store or on the server) or whose clients train more than the module's parameters.
PERSIST = [
    "APFL",
    "APPLE",
    "Ditto",
    "EPFL",
    "FedALA",
    "FedAvg",
    "FedDBE",
    "FedDyn",
    "FedFomo",
    "FedHEAL",
    "FedMetaMed",
    "FedRA",
    "FedRep",
    "FedRoD",
    "FML",
    "PGFedMo",
    "SCAFFOLD",
    "pFedMe",
    "pFedMoAP",
    "MetaFed",
]

STRATEGIES = shipped_strategies()
SETTINGS = {"reset": {"optimizer_state": "reset"}, "persist": {"optimizer_state": "persist", "clients_per_round": 2}}
CASES = [(name, "reset") for name in STRATEGIES] + [(name, "persist") for name in PERSIST]


def federation(out_dir, name: str, setting: str, rounds: int, accelerator: str = "cpu") -> Federation:
    """A fresh federation of strategy ``name`` on 3 tiny clients, 2 local steps per turn."""
    needs = NEEDS.get(name, Needs())
    torch.manual_seed(0)
    if needs.module is not None:
        module = needs.module()
    else:
        module = ClassificationModule(
            backbone=needs.backbone(),
            num_classes=3,
            lr=0.1,
            momentum=0.9,
            roles=(needs.roles if needs.roles is not None else [RoleRule("backbone.*", "shared")]),
        )
    data = needs.data() if needs.data is not None else TinyTabular(num_clients=3)
    return Federation(
        module,
        data,
        STRATEGIES[name](**needs.kwargs),
        rounds=rounds,
        local_steps=2,
        out_dir=out_dir,
        progress_bar=False,
        seed=0,
        accelerator=accelerator,
        **SETTINGS[setting],
    )


def difference(a: Any, b: Any, path: str = "") -> str | None:
    """Where ``a`` and ``b`` (nested dicts, lists, tensors, numbers) first differ, None where they are exactly equal
    (``torch.equal``, dtype and device for tensors, ``==`` and type otherwise); NaN equals NaN (a metric undefined on
    a tiny split is undefined in both runs)."""
    if isinstance(a, torch.Tensor):
        same = isinstance(b, torch.Tensor) and (a.dtype, a.device) == (b.dtype, b.device) and torch.equal(a, b)
        return None if same else f"{path}: {a!r} != {b!r}"
    if isinstance(a, dict):
        if not isinstance(b, dict) or a.keys() != b.keys():
            return f"{path}: keys {sorted(map(str, a))} != {sorted(map(str, b)) if isinstance(b, dict) else b!r}"
        return next((d for k in a if (d := difference(a[k], b[k], f"{path}.{k}"))), None)
    if isinstance(a, (list, tuple)):
        if not isinstance(b, (list, tuple)) or len(a) != len(b):
            return f"{path}: {a!r} != {b!r}"
        return next(
            (d for i, (x, y) in enumerate(zip(a, b, strict=True)) if (d := difference(x, y, f"{path}[{i}]"))), None
        )
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return None
    return None if type(a) is type(b) and a == b else f"{path}: {a!r} != {b!r}"


def results(fit: dict[str, Any]) -> dict[str, Any]:
    """What must not depend on the resume: metrics of the last and best rounds, the global model's, communication
    and the steps of fine-tuning before evaluation."""
    return {k: fit[k] for k in ("last", "best", "global", "comm", "compute", "checkpoints") if k in fit}


def test_every_shipped_strategy_is_discovered_and_exported():
    # the discovery finds the strategies (not an empty parametrization), and each one is importable by short name
    assert {"FedAvg", "SCAFFOLD", "APPLE", "FedMetaMed", "PGFedMo", "FedRA"} <= set(STRATEGIES)
    assert set(STRATEGIES) <= set(fedlit.strategies.__all__)
    assert not set(NEEDS) - set(STRATEGIES) and not set(PERSIST) - set(STRATEGIES)  # no stale names


@pytest.mark.parametrize(("name", "setting"), CASES, ids=[f"{n}-{s}" for n, s in CASES])
def test_one_round_checkpoint_and_resume_equals_two_rounds(tmp_path, name, setting, accelerator):
    try:
        straight = federation(tmp_path / "straight", name, setting, rounds=2, accelerator=accelerator)
        expected = straight.fit()
    except ConfigError as err:
        pytest.fail(
            f"{name} cannot run on the tiny federation ({err}): give it the arguments, backbone or roles it "
            f"needs in NEEDS of {__name__}."
        )
    federation(tmp_path / "resumed", name, setting, rounds=1, accelerator=accelerator).fit()
    torch.manual_seed(1234)  # the resumed run must not depend on the global RNG state it starts with
    resumed = federation(tmp_path / "resumed", name, setting, rounds=2, accelerator=accelerator)
    got = resumed.fit(ckpt_path=tmp_path / "resumed" / "checkpoints" / "last.ckpt")

    assert got["last"]["round"] == 2
    assert difference(results(got), results(expected), "results") is None
    store, resumed_store = straight.store.state_dict(), resumed.store.state_dict()
    if setting == "reset":  # every client trained every round: each has its entry in the store
        assert set(store["tensors"]) == set(straight.client_ids)
    assert difference(resumed_store, store, "store") is None  # tensors, optimizer state, strategy state per client
    assert difference(resumed.strategy.state_dict(), straight.strategy.state_dict(), "state_dict") is None
    if setting == "persist":
        assert store["optimizer"], f"{name}: optimizer_state='persist' stored no optimizer state"
    for run in (straight, resumed):  # where state lives: the store's device (the CPU), the same after a resume
        held = {"store": run.store.state_dict(), "strategy": run.strategy.state_dict()}
        assert {t.device for t in tensors(held)} <= {torch.device("cpu")}, f"{name}: state off the store's device"
        if accelerator == "cuda":  # copied to and from the GPU through pinned host memory
            assert all(t.is_pinned() for t in tensors(held["store"]["tensors"])), name
