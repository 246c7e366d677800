"""The Flower Grid side of the server: replies matched to nodes; a failed node and a silent one become the error
strings the loop leaves out of the round (or stops on, with on_client_error=raise)."""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest

pytest.importorskip("flwr.app", reason="flwr is not installed (pip install 'fedlit[flower]'): no Flower deployment")

from flwr.app import ConfigRecord, Error, RecordDict  # noqa: E402
from flwr.common.constant import ErrorCode  # noqa: E402
from flwr.server.superlink.linkstate.utils import NODE_UNAVAILABLE_ERROR_REASON  # noqa: E402
from flwr.supercore.task_identity import TaskIdentity  # noqa: E402

from fedlit.flower.server import GridTransport  # noqa: E402


class FakeGrid:
    """Node 1 answers, node 2 fails (its ClientApp process died), node 3 never answers; with ``gone``, the
    SuperLink answers for node 3 (its error reply carries the SuperLink's id 0 as sender, as Flower's does).

    Like Flower's grids, it gives each message its id when it pushes it; replies name the id they answer."""

    def __init__(self, gone: bool = False) -> None:
        self.sent, self.timeout, self.gone = [], None, gone

    def get_node_ids(self):
        return [1, 2, 3]

    def send_and_receive(self, messages, *, timeout=None):
        self.sent, self.timeout = list(messages), timeout
        for i, message in enumerate(self.sent):
            message.metadata.__dict__["_message_id"] = f"m{i}"

        def reply(to: int, sender: int, **fields):
            return SimpleNamespace(metadata=SimpleNamespace(src_node_id=sender, reply_to_message_id=f"m{to}"), **fields)

        ok = reply(0, 1, has_error=lambda: False, content=RecordDict({"turn": ConfigRecord({"n": 1})}))
        failed = reply(
            1,
            2,
            has_error=lambda: True,
            error=Error(ErrorCode.CLIENT_APP_RAISED_EXCEPTION, "<class 'MemoryError'>:<'oom'>"),
        )
        unavailable = reply(
            2, 0, has_error=lambda: True, error=Error(ErrorCode.NODE_UNAVAILABLE, NODE_UNAVAILABLE_ERROR_REASON)
        )
        return [failed, *([unavailable] if self.gone else []), ok]  # in any order, node 3 missing or gone


@pytest.fixture(autouse=True)
def _server_app_identity(monkeypatch):
    for attr, value in (("_run_id", 5), ("_node_id", 0), ("_task_id", 0)):  # what a ServerApp process has
        monkeypatch.setattr(TaskIdentity, attr, value)


def test_replies_are_matched_to_nodes_and_failures_described():
    grid = FakeGrid()
    replies = GridTransport(grid).exchange([(n, "train", RecordDict()) for n in (1, 2, 3)], "4", 30.0)
    assert [m.metadata.dst_node_id for m in grid.sent] == [1, 2, 3]
    assert {(m.metadata.message_type, m.metadata.group_id) for m in grid.sent} == {("train", "4")}
    assert grid.timeout == 30.0
    assert replies[0]["turn"]["n"] == 1
    assert re.fullmatch(
        r"node 2 failed after \d+ s: Flower error CLIENT_APP_RAISED_EXCEPTION \(code 2\): "
        r"<class 'MemoryError'>:<'oom'>",
        replies[1],
    )
    assert re.fullmatch(
        r"no reply from node 3 after \d+ s \(client timeout 30.0 s: timed out, or the node is "
        r"gone\)",
        replies[2],
    )


def test_the_superlinks_error_for_a_gone_node_is_that_nodes_failure_with_flowers_reason():
    # The error reply for node 3 comes from the SuperLink (sender 0): matched by the message it answers.
    replies = GridTransport(FakeGrid(gone=True)).exchange([(n, "train", RecordDict()) for n in (1, 2, 3)], "4", 3600.0)
    assert replies[0]["turn"]["n"] == 1 and replies[1].startswith("node 2 failed after ")
    assert re.fullmatch(
        r"node 3 failed after \d+ s: Flower error NODE_UNAVAILABLE \(code 5\): Error: Node "
        r"Unavailable — The destination node failed to report a heartbeat within .*",
        replies[2],
    )
