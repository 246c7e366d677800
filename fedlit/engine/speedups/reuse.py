"""Evaluations reused when nothing they depend on changed (``federation.reuse_evaluations``, on by default).

With ``clients_per_round`` below 1, most clients of a personalized federation do not train in a round; when what
the server sends a client for evaluation did not change either (a Local run; a client whose shared part the round
left as it was), evaluating it again would recompute the metrics of the round before. So before each evaluation the
loop takes a fingerprint of everything a client's evaluation reads: what ``configure_evaluate`` and
``global_model_state`` send it, its entry in the client store (its personal tensors and the strategies' and
callbacks' ``client_state``), the module's frozen buffers, and the task (splits, pictures). A client whose
fingerprint equals that of its last evaluation is given that evaluation's metrics again, without loading or running
anything. The metrics are those a new evaluation would compute, since an evaluation in eval mode is a function of
those inputs; its download is counted as before (what is sent for evaluation is the protocol's, and the traffic a
run reports, or a resumed run, does not depend on this setting); ``system/eval_reused`` counts the clients reused
per evaluated round.

The loop does not reuse (and evaluates every client, as with the setting off) where the fingerprint could miss an
input: a callback or strategy that implements ``on_client_evaluate_start`` (it may read server-side state: APFL's
mix, APPLE's weights), a task that fine-tunes before it evaluates (its steps are seeded by the round), an executor
whose clients' states live elsewhere (several processes, a Flower deployment), or a client's state holding a value
that cannot be fingerprinted (an object other than tensors, arrays, numbers, strings and their containers). Nothing
is kept in checkpoints: the first evaluation after a resume evaluates every client.
"""

from __future__ import annotations

import hashlib
import os
from typing import TYPE_CHECKING

from lightning.pytorch import Callback

from fedlit.core.errors import broken
from fedlit.core.tensors import DigestMemo, digest
from fedlit.engine.loop.executor import LocalExecutor
from fedlit.engine.loop.tasks import EvaluateResult, EvaluateTask
from fedlit.strategies.base import Strategy

if TYPE_CHECKING:
    from fedlit.engine.loop.run import Run

#: Hook whose implementations may read state the fingerprint does not cover.
HOOK = "on_client_evaluate_start"


def reuse_problems(run: Run) -> list[str]:
    """Why ``run`` evaluates every client every time whatever ``reuse_evaluations`` says; [] if it can reuse."""
    problems = []
    if not isinstance(run.executor, LocalExecutor) or run.fabric.world_size > 1:
        problems.append("the clients' states are not all in this process")
    defaults = (getattr(Callback, HOOK, None), Strategy.on_client_evaluate_start)
    owners = [type(c).__name__ for c in run.callbacks if getattr(type(c), HOOK, None) not in defaults]
    if owners:
        problems.append(f"{', '.join(owners)} implements {HOOK}")
    return problems


class EvaluationReuse:
    """Each client's last evaluation and the fingerprint of its inputs."""

    def __init__(self) -> None:
        self.kept: dict[str, tuple[bytes, EvaluateResult]] = {}
        #: Tensors' digests for the whole run: the frozen buffers and every tensor a round left unchanged (the store
        #: entries of clients that did not train) are hashed once. ``FEDLIT_DIGEST_MEMO=0`` keeps them for one
        #: evaluation only (every tensor hashed every round: the behaviour to compare with).
        self.memo = DigestMemo()

    def evaluate(self, run: Run, server_round: int, tasks: list[EvaluateTask]) -> tuple[list[EvaluateResult], int]:
        """Each task's result, in order, and how many were reused: the executor evaluates the others."""
        memo = self.memo if os.environ.get("FEDLIT_DIGEST_MEMO", "1") != "0" else DigestMemo()
        roles = run.module.parameter_roles()
        frozen = digest({n: b for n, b in run.module.named_buffers() if roles.get(n) == "frozen"}, memo)
        if not (frozen is not None):  # a dict of tensors always has a digest
            raise broken("a dict of tensors always has a digest")
        keys = [None if task.finetune_steps else _task_key(run, task, frozen, memo) for task in tasks]
        stale = [
            i
            for i, (task, key) in enumerate(zip(tasks, keys, strict=True))
            if key is None or self.kept.get(task.client_id, (None,))[0] != key
        ]
        if not (run.executor is not None):
            raise broken("attach() runs after the executor is chosen")
        fresh = run.executor.evaluate(run, server_round, [tasks[i] for i in stale])
        results: list[EvaluateResult | None] = [None] * len(tasks)
        for i, result in zip(stale, fresh, strict=True):
            results[i] = result
            client_id, key = tasks[i].client_id, keys[i]
            if key is None:
                self.kept.pop(client_id, None)
            else:
                self.kept[client_id] = (key, result)
        reused = [
            result if result is not None else self.kept[task.client_id][1]
            for task, result in zip(tasks, results, strict=True)
        ]
        return reused, len(tasks) - len(stale)


def _task_key(run: Run, task: EvaluateTask, frozen: bytes, memo: DigestMemo) -> bytes | None:
    """The fingerprint of what ``task``'s evaluation reads; None when part of it cannot be fingerprinted."""
    store = run.store
    parts = [
        digest(task.received, memo),
        digest(task.global_state, memo),
        digest(store.tensors(task.client_id), memo),
        digest(store.client_state(task.client_id)["extra"], memo),
    ]
    known = [p for p in parts if p is not None]
    if len(known) < len(parts):
        return None
    return hashlib.blake2b(
        b"".join([frozen, *known, repr((task.splits, task.images)).encode()]), digest_size=16
    ).digest()
