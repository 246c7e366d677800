"""The ClientApp's message handling as a SuperNode's per-message process runs it: the node's client built from the
run config's recipe and the node config, its state kept under ``state-dir`` between messages."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("flwr.app", reason="flwr is not installed (pip install 'fedlit[flower]'): no Flower deployment")

from flwr.app import ConfigRecord, Context, Message, RecordDict  # noqa: E402
from flwr.supercore.task_identity import TaskIdentity  # noqa: E402

from fedlit.flower import codec  # noqa: E402
from fedlit.flower.client import handle_message  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
# 2 sites of 20 images: train/val/test = 12/4/4 each (fractions 0.6/0.2/0.2)
OVERRIDES = (
    "--data.init_args.num_clients 2 --data.init_args.samples_per_client 20 --data.init_args.image_size 8 "
    "--model.init_args.backbone.init_args.width 4 --federation.rounds 1"
)


@pytest.fixture
def context(tmp_path, monkeypatch):
    for attr, value in (("_run_id", 9), ("_node_id", 0), ("_task_id", 0)):  # what a ServerApp process has
        monkeypatch.setattr(TaskIdentity, attr, value)
    run_config = {
        "recipe": (ROOT / "recipes" / "quickstart.yaml").read_text(),
        "overrides": OVERRIDES,
        "out-dir": str(tmp_path / "server_run"),
    }
    return Context(
        run_id=9,
        node_id=42,
        node_config={"client-id": "site_1", "state-dir": str(tmp_path / "state")},
        state=RecordDict(),
        run_config=run_config,
    )


def _ask(context, message_type, content):
    reply = handle_message(Message(content, 42, message_type, group_id="1"), context)
    assert "error" not in reply.content.config_records, reply.content.config_records.get("error")
    return reply.content


def test_query_train_evaluate_with_state_in_files(context, tmp_path):
    answer = _ask(context, "query", RecordDict())["query"]
    assert answer["client-id"] == "site_1" and answer["position"] == 1 and answer["trains"]
    assert json.loads(answer["num-examples"]) == {"train": 12, "val": 4, "test": 4}
    assert sum(json.loads(answer["class-counts"])["train"]) == 12
    assert list(json.loads(answer["manifest"])["clients"]) == ["site_1"]  # only the node's client

    # what the server sends: every shared tensor (FedBN: all but the normalization layers), here zeros
    from fedlit.cli import prepare

    shared = prepare(
        [
            "fit",
            "--config",
            str(ROOT / "recipes" / "quickstart.yaml"),
            *OVERRIDES.split(),
            "--out_dir",
            str(tmp_path / "probe"),
        ]
    ).federation
    shared.setup()
    received = {n: t.detach().clone().zero_() for n, t in shared.module.named_tensors("shared").items()}
    content = RecordDict({"task": ConfigRecord({"client-id": "site_1", "round": 1, "checkpointed": 0})})
    for name, tree in (("received", received), ("extras", {}), ("schedule", None)):
        codec.put_tree(content, name, tree)
    reply = _ask(context, "train", content)
    assert reply["turn"]["num-examples"] == 12 and json.loads(reply["turn"]["problem"]) is None
    state = codec.get_tree(reply, "state")
    assert set(state) == set(received) and any(bool((t != 0).any()) for t in state.values())  # it trained
    assert codec.get_tree(reply, "metrics")["steps"] == 3.0  # 12 samples in 1 batch of 32, 3 local epochs
    snapshots = sorted(p.relative_to(tmp_path / "state").parts[1:] for p in (tmp_path / "state").rglob("*.pt"))
    assert snapshots == [("site_1", "round_1.pt")]

    content = RecordDict(
        {
            "task": ConfigRecord(
                {
                    "client-id": "site_1",
                    "round": 1,
                    "checkpointed": 0,
                    "splits": json.dumps(["val", "test"]),
                    "images": False,
                }
            )
        }
    )
    codec.put_tree(content, "received", state)
    codec.put_tree(content, "global", None)
    reply = _ask(context, "evaluate", content)
    metrics = codec.get_tree(reply, "metrics")
    assert set(metrics) == {"val", "test"} and 0.0 <= metrics["test"]["accuracy"] <= 1.0


def test_a_node_without_client_id_answers_why(context):
    context.node_config = {}
    reply = handle_message(Message(RecordDict(), 42, "query", group_id="q"), context)
    assert "client-id" in reply.content["error"]["detail"]


def test_a_node_whose_client_id_is_a_path_answers_why_and_writes_nothing(context, tmp_path):
    context.node_config = {**context.node_config, "client-id": "../../outside"}
    reply = handle_message(Message(RecordDict(), 42, "query", group_id="q"), context)
    assert reply.content["error"]["detail"] == (
        "DataError: --node-config client-id of this SuperNode: client ids that are not safe as file names: "
        "'../../outside' holds a path separator. Client ids become folders (fedlit export), TensorBoard tags and "
        "metrics.csv rows. Give the node the id of its site as the data names it, and rename sites whose names are "
        "not file names."
    )
    assert not (tmp_path / "state").exists() and not (tmp_path / "outside").exists()


def test_a_recipe_with_a_key_given_twice_is_refused_on_the_node_as_in_simulation(context):
    # Plain YAML would keep the second `federation:` block (rounds 7) without a word; fedlit fit refuses it.
    recipe = context.run_config["recipe"]
    context.run_config = {**context.run_config, "recipe": recipe + "federation:\n  rounds: 7\n"}
    first = 1 + recipe.splitlines().index("federation:")
    second = 1 + len(recipe.splitlines())
    reply = handle_message(Message(RecordDict(), 42, "query", group_id="q"), context)
    assert reply.content["error"]["detail"] == (
        f"ConfigError: the run config's recipe: key 'federation' is given twice (line {first} and line {second}); "
        "YAML would silently keep the last one. Merge the two into one."
    )
