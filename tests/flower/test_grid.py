"""The Flower Grid side of the server: replies matched to nodes; a failed node and a silent one become the error
strings the loop leaves out of the round (or stops on, with on_client_error=raise)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

pytest.importorskip("flwr.app", reason="flwr is not installed (pip install 'fedlit[flower]'): no Flower deployment")

from flwr.app import ConfigRecord, RecordDict  # noqa: E402
from flwr.supercore.task_identity import TaskIdentity  # noqa: E402

from fedlit.flower.server import GridTransport  # noqa: E402


class FakeGrid:
    """Node 1 answers, node 2 fails (its ClientApp process died), node 3 never answers."""

    def __init__(self) -> None:
        self.sent, self.timeout = [], None

    def get_node_ids(self):
        return [1, 2, 3]

    def send_and_receive(self, messages, *, timeout=None):
        self.sent, self.timeout = list(messages), timeout
        ok = SimpleNamespace(metadata=SimpleNamespace(src_node_id=1), has_error=lambda: False,
                             content=RecordDict({"turn": ConfigRecord({"n": 1})}))
        failed = SimpleNamespace(metadata=SimpleNamespace(src_node_id=2), has_error=lambda: True,
                                 error=SimpleNamespace(reason="<class 'MemoryError'>:<'oom'>"))
        return [failed, ok]  # in any order, node 3 missing


def test_replies_are_matched_to_nodes_and_failures_described(monkeypatch):
    for attr, value in (("_run_id", 5), ("_node_id", 0), ("_task_id", 0)):  # what a ServerApp process has
        monkeypatch.setattr(TaskIdentity, attr, value)
    grid = FakeGrid()
    replies = GridTransport(grid).exchange([(n, "train", RecordDict()) for n in (1, 2, 3)], "4", 30.0)
    assert [m.metadata.dst_node_id for m in grid.sent] == [1, 2, 3]
    assert {(m.metadata.message_type, m.metadata.group_id) for m in grid.sent} == {("train", "4")}
    assert grid.timeout == 30.0
    assert replies[0]["turn"]["n"] == 1
    assert replies[1] == "node 2 failed: <class 'MemoryError'>:<'oom'>"
    assert replies[2] == "no reply from node 3 within 30.0 s (timed out, or the node is gone)"
