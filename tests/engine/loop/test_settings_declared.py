"""Each federation setting declared once: the help text, the checks, the resume rule and the docs' table come from
its declaration; the run's progress is one RunState, the run's settings are ``run.settings`` only."""

from __future__ import annotations

import math
from dataclasses import fields
from pathlib import Path

import docstring_parser
import pytest
import torch

from fedlit.core.errors import ConfigError
from fedlit.engine.loop.run import Run
from fedlit.engine.loop.settings import RESUMABLE, Settings, settings_table
from fedlit.engine.records.state import RunState
from fedlit.strategies import FedAvg
from tests.conftest import make_federation

ROOT = Path(__file__).resolve().parents[3]
START, END = "<!-- federation-settings:", "<!-- /federation-settings -->"


def _problems(**values):
    return Settings.problems({f.name: f.default for f in fields(Settings)} | values)


def test_the_docs_table_is_the_generated_one():
    text = (ROOT / "docs" / "runs.md").read_text()
    assert text.count(START) == 1 and text.count(END) == 1, "docs/runs.md: the settings table's markers"
    documented = text.split(START)[1].split("\n", 1)[1].split(END)[0]
    assert documented == settings_table(), (
        "docs/runs.md's federation settings differ from their declaration: "
        "put the output of fedlit.engine.loop.settings.settings_table() there"
    )
    assert "| `rounds` | `10` | may change | Number of server rounds R. |" in documented.splitlines()
    assert "| `seed` | `0` | fixed | Seed of client sampling and local training. |" in documented.splitlines()


def test_the_docstring_jsonargparse_reads_is_generated_from_each_declaration():
    parsed = {p.arg_name: " ".join(p.description.split()) for p in docstring_parser.parse(Settings.__doc__).params}
    assert parsed == {f.name: " ".join(f.metadata["doc"].split()) for f in fields(Settings)}
    assert parsed["rounds"] == "Number of server rounds R."


def test_the_settings_a_resume_may_change_are_those_declared_resumable():
    assert RESUMABLE == {
        "rounds",
        "eval_every",
        "checkpoint_every",
        "progress_bar",
        "accelerator",
        "devices",
        "num_nodes",
        "store_device",
        "on_client_error",
        "min_clients",
        "loggers",
        "client_timeout",
        "max_update_norm",
        "max_update_ratio",
        "max_update_norm_vs_median",
        "update_norm_action",
        "max_client_weight",
        "divergence",
        "allow_dropped_callbacks",
        "threads",
        "cache_features",
        "fused_clients",
        "reuse_evaluations",
        "pooled_metrics",
        "matmul_precision",
    }


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ({"rounds": 0}, "federation.rounds=0 must be >= 1"),
        ({"rounds": None}, "federation.rounds=None must be >= 1"),  # not nullable: None is no way around the bound
        ({"eval_every": math.nan}, "federation.eval_every=nan must be >= 1"),
        ({"unseen_finetune_steps": -1}, "federation.unseen_finetune_steps=-1 must be >= 0"),
        ({"local_steps": 0}, "federation.local_steps=0 must be >= 1 (or null for local_epochs)"),
        ({"threads": 0}, "federation.threads=0 must be >= 1 (or null: PyTorch's default)"),
        ({"client_timeout": 0}, "federation.client_timeout=0 must be > 0 seconds (or null: no limit)"),
        ({"max_update_ratio": -1.0}, "federation.max_update_ratio=-1.0 must be > 0 (or null: no bound)"),
        (
            {"max_update_norm_vs_median": 0.5},
            "federation.max_update_norm_vs_median=0.5 must be >= 1 (or null: no bound)",
        ),
        ({"max_client_weight": 0}, "federation.max_client_weight=0 must be > 0 (or null: no cap)"),
        ({"max_client_weight": 1.5}, "federation.max_client_weight=1.5 must be a share in (0, 1] (or null: no cap)"),
        ({"update_norm_action": "scale"}, "federation.update_norm_action='scale' is not one of ['reject', 'clip']"),
        ({"fused_clients": True}, "federation.fused_clients=True must be an integer >= 1 (1: one client at a time)"),
        ({"fused_clients": 2.0}, "federation.fused_clients=2.0 must be an integer >= 1 (1: one client at a time)"),
        ({"optimizer_state": "keep"}, "federation.optimizer_state='keep' is not one of ['reset', 'persist']"),
        ({"cache_features": "gpu"}, "federation.cache_features='gpu' is not one of ['off', 'memory', 'disk']"),
    ],
)
def test_declared_bounds_and_choices_are_checked(values, expected):
    assert _problems(**values) == [expected]


def test_none_passes_the_bounds_where_the_type_allows_it():
    assert (
        _problems(local_steps=None, threads=None, client_timeout=None, max_update_norm=None, max_update_ratio=None)
        == []
    )
    assert _problems(rounds=1, unseen_finetune_steps=0, client_timeout=0.5, fused_clients=4) == []


def test_local_epochs_beside_local_steps_is_refused_unless_it_is_the_default_1():
    assert _problems(local_epochs=5, local_steps=1) == [
        "federation.local_epochs=5 and federation.local_steps=1 conflict: a turn takes local_steps optimizer steps "
        "and would ignore local_epochs; give one of them (leave local_epochs out, or set local_steps: null)"
    ]
    assert _problems(local_epochs=1, local_steps=20) == []  # as the shipped recipes write it
    assert _problems(local_epochs=5, local_steps=None) == []
    with pytest.raises(ConfigError, match="federation.local_epochs=5 and federation.local_steps=1 conflict"):
        Settings.from_options({"local_epochs": 5, "local_steps": 1})


def test_run_has_no_forwarded_settings_and_keeps_its_progress_in_state(tmp_path):
    assert not [f.name for f in fields(Settings) if hasattr(Run, f.name)]
    federation = make_federation(tmp_path, FedAvg(), rounds=2)
    assert not hasattr(federation, "rounds") and federation.settings.rounds == 2
    federation.fit()
    assert federation.state.round == federation.server_round == 2
    assert federation.state.history is federation.history and sorted(federation.state.history.rounds) == [1, 2]
    # what the checkpoint saves of the run's progress is the state's
    payload = torch.load(tmp_path / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    state = federation.state
    assert payload["server_round"] == 2
    assert (payload["comm"], payload["compute"], payload["faults"]) == (state.comm, state.compute, state.faults)
    assert payload["identity"] == state.identity and payload["history"] == state.history.state_dict()
    assert state.comm["upload_bytes"] > 0 and state.stopped_early is None
    saved_progress = {"server_round", "comm", "compute", "faults", "identity", "dropped_callbacks", "timing", "history"}
    saved_progress |= {"divergence", "train_sizes"}
    assert saved_progress <= set(payload)
    assert payload["divergence"] == {"round": 1, "loss": state.divergence["loss"]}  # the reference, not "warned"
    assert {f.name for f in fields(RunState)} == (saved_progress - {"server_round"}) | {
        "round",
        "should_stop",
        "stop_reason",
        "stopped_early",
        "checkpointed",  # not saved: the checkpoint is that round's
    }


def test_a_setting_read_or_set_on_the_run_itself_names_run_settings():
    """``run.rounds`` / ``run.seed = 1`` (the old forwarded names) fail loudly instead of reading nothing or setting
    an attribute nothing reads."""
    from fedlit.engine.loop.run import Run

    run = Run.__new__(Run)  # no set-up needed: the guard is on the class
    with pytest.raises(AttributeError, match=r"run\.settings\.rounds"):
        run.rounds  # noqa: B018
    with pytest.raises(AttributeError, match=r"run\.settings\.seed"):
        run.seed = 1
    with pytest.raises(AttributeError, match="no attribute 'nothing_like_this'"):
        run.nothing_like_this  # noqa: B018
