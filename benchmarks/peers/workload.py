"""What the floor and the Flower simulation share with fedlit: the recipe's objects and one client's local training.

Both build the model, the data and the settings from the very recipe (and overrides) fedlit runs, through fedlit's
own parser (:func:`fedlit.cli.prepare`), so the three train the same model on the same clients' data, with the same
batch size, optimizer and step count. The local training below is the plain PyTorch loop: no Fabric, no hooks, no
client store; the shared tensors are loaded into the one model before a client's turn and read back after it.
On a GPU (``--federation.accelerator cuda``) the plain loop runs there too, with the recipe's precision (``32-true``
under ``federation.matmul_precision``, or ``bf16-mixed``: the forward under autocast, as Fabric does it).
"""

from __future__ import annotations

import contextlib
import tempfile
import warnings
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor


@dataclass
class Objects:
    """The recipe's model, data and loop settings (rounds, clients per round, local steps or epochs, seed)."""

    module: Any
    data: Any
    settings: Any
    device: torch.device = torch.device("cpu")
    samples: int = 0  # train samples the loop has stepped on so far

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        """The forward pass's precision: autocast to bfloat16 under ``bf16-mixed``, nothing under ``32-true``."""
        if self.settings.precision == "bf16-mixed":
            return torch.autocast(self.device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def to_device(self, batch: Any) -> Any:
        return [t.to(self.device, non_blocking=True) for t in batch] if self.device.type != "cpu" else batch

    @property
    def trainable(self) -> dict[str, Tensor]:
        """The tensors FedAvg averages (the recipe's shared and personal roles: LoRA and the head)."""
        return {n: p for n, p in self.module.named_parameters() if p.requires_grad}


def build(recipe: str, overrides: list[str]) -> Objects:
    """Parse ``recipe`` with ``overrides`` as ``fedlit fit`` does and build its objects (data generated, roles set,
    ``torch.set_num_threads(federation.threads)``)."""
    from fedlit.cli import prepare

    warnings.simplefilter("ignore")  # the randomly initialized backbone's warning, once per process
    out = tempfile.mkdtemp(prefix="peers-")
    federation = prepare(["fit", "--config", recipe, *overrides, "--out_dir", f"{out}/run"]).federation
    settings = federation.settings
    torch.set_num_threads(settings.threads or 2)
    torch.manual_seed(settings.seed)
    module, data = federation.module, federation.datamodule
    data.setup()
    module.set_parameter_roles(module.parameter_roles())  # requires_grad from the roles: the backbone frozen
    if settings.precision not in ("32-true", "bf16-mixed"):
        raise SystemExit(f"the floor runs 32-true and bf16-mixed, not federation.precision={settings.precision!r}")
    if settings.matmul_precision is not None:
        torch.set_float32_matmul_precision(settings.matmul_precision)
    device = torch.device("cuda" if settings.accelerator in ("cuda", "gpu") else "cpu")
    return Objects(module.to(device), data, settings, device)


def local_train(objects: Objects, client_id: str, server_round: int) -> int:
    """One client's turn in the plain loop: a fresh optimizer, ``local_steps`` steps (cycling through the data) or
    ``local_epochs`` epochs over its train split; returns the client's train examples (FedAvg's weight)."""
    module, settings = objects.module, objects.settings
    optimizer = module.configure_optimizers()
    optimizer = optimizer["optimizer"] if isinstance(optimizer, dict) else optimizer
    module.train()
    loader = objects.data.train_dataloader(client_id, torch.Generator().manual_seed(server_round))
    steps = settings.local_steps or settings.local_epochs * len(loader)
    done = 0
    while done < steps:
        for batch_idx, batch in enumerate(loader):
            batch = objects.to_device(batch)
            with objects.autocast():
                loss = module.training_step(batch, batch_idx)["loss"]
            loss.backward()
            objects.samples += len(batch[-1])
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            done += 1
            if done == steps:
                break
    return objects.data.num_examples(client_id, "train")


def num_clients(objects: Objects) -> int:
    """How many clients train a round: all, or ``federation.clients_per_round`` of them."""
    from fedlit.core.seeding import num_selected

    return num_selected(objects.settings.clients_per_round, len(objects.data.train_client_ids))


def selected(objects: Objects, server_round: int) -> list[str]:
    """The clients of ``server_round``: all, or ``federation.clients_per_round`` of them drawn at random."""
    clients = objects.data.train_client_ids
    order = torch.randperm(len(clients), generator=torch.Generator().manual_seed(server_round))
    return [clients[i] for i in sorted(order[: num_clients(objects)].tolist())]


def flops_per_sample(objects: Objects, client_id: str) -> float:
    """FLOPs of one training step's forward and backward (as :func:`local_train` does them: the frozen backbone's
    input gradients, the trainable tensors' gradients) on ``client_id``'s first train batch, counted by
    ``torch.utils.flop_counter.FlopCounterMode``, per sample of that batch; the gradients are dropped after."""
    from torch.utils.flop_counter import FlopCounterMode

    module = objects.module
    module.train()
    batch = objects.to_device(next(iter(objects.data.train_dataloader(client_id, torch.Generator().manual_seed(0)))))
    with FlopCounterMode(display=False) as counter:
        with objects.autocast():
            loss = module.training_step(batch, 0)["loss"]
        loss.backward()
    module.zero_grad(set_to_none=True)
    return counter.get_total_flops() / len(batch[-1])
