"""A linear module with a squared loss and a stand-in for a client's ``ClientContext``, for the hand-worked steps of
the personalized strategies (Ditto, pFedMe, Per-FedAvg)."""

import contextlib
from types import SimpleNamespace

from torch import nn

from fedlit.core.roles import RoleRule
from fedlit.module import FederatedModule

W = "shared.weight"


class Lin(FederatedModule):
    """y ~ shared(x), squared error (mean over the batch)."""

    def __init__(self):
        super().__init__(roles=[RoleRule("shared.*", "shared")])
        self.shared = nn.Linear(2, 1, bias=False)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return {"loss": (self.shared(x).squeeze(-1) - y).pow(2).mean()}


def fake_client(batches=(), optimizer_state="reset"):
    """What the strategies read of a ``ClientContext``; its train split yields ``batches``, every pass."""
    return SimpleNamespace(
        autocast=contextlib.nullcontext,
        convert_output=lambda out: out,
        scaler=None,
        local=SimpleNamespace(optimizer_state=optimizer_state),
        store=SimpleNamespace(device="cpu"),
        derive_seed=lambda *parts: 0,
        train_dataloader=lambda *stream, generator=None: list(batches),
        prepare_batch=lambda batch: batch,
    )
