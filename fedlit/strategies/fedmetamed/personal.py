"""FedMetaMed's personal model on the live module: running the module's steps with the personal tensors in place of
the live ones, its macro-F1, its optimizer (a mirror of the loop's) and copies of that optimizer's state.

Chen, Zhu, Yang, Yuan. "Personalized Retrogress-Resilient Framework for Real-World Medical Federated Learning."
MICCAI 2021. How the two models share one module is in :mod:`fedlit.strategies.fedmetamed`, whose strategy calls
these; they are apart from it only to keep that file under 400 lines.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn
from torch.func import functional_call
from typing_extensions import override

from fedlit.core.contexts import ClientContext
from fedlit.core.errors import ConfigError
from fedlit.module import FederatedModule


class MethodCall(nn.Module):
    """Calls ``module.<method>`` as its ``forward``, so ``functional_call`` can run a training or validation step
    with other tensors in place of the module's (names prefixed ``module.``)."""

    def __init__(self, module: nn.Module, method: str) -> None:
        super().__init__()
        self.module, self.method = module, method

    @override
    def forward(self, *args: Any) -> Any:
        return getattr(self.module, self.method)(*args)


def detached_to(obj: Any, device: torch.device) -> Any:
    """``obj`` (tensors, nested in dicts, lists and tuples) with every tensor detached and copied to ``device``."""
    if isinstance(obj, Tensor):
        return obj.detach().to(device, copy=True)
    if isinstance(obj, dict):
        return {k: detached_to(v, device) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(detached_to(v, device) for v in obj)
    return obj


def macro_f1(
    pl_module: FederatedModule, client: ClientContext, loader: Any, personal: dict[str, Tensor] | None
) -> float:
    """Macro-F1 over ``loader`` of the live module (the deputy; ``personal`` None) or, with ``personal`` (the
    personal tensors, names prefixed ``module.``), of the personal model; the module is left in train mode."""
    step = MethodCall(pl_module, "validation_step")
    pl_module.eval()
    pl_module.reset_metrics()
    with torch.no_grad():
        for batch_idx, batch in enumerate(loader):
            batch = client.prepare_batch(batch)
            with client.autocast():
                if personal is not None:
                    functional_call(step, personal, (batch, batch_idx))
                else:
                    pl_module.validation_step(batch, batch_idx)
    f1 = pl_module.compute_metrics().get("f1", float("nan"))
    pl_module.set_train_mode()
    return f1


def mirror_optimizer(
    pl_module: FederatedModule,
    inner: torch.optim.Optimizer,
    personal: dict[str, Tensor],
    state: dict[str, Any] | None,
) -> torch.optim.Optimizer:
    """An optimizer of ``inner``'s class and hyperparameters (per parameter group) over the personal tensors, with
    ``state`` (a persisted state of it) loaded when given."""
    names = {id(p): n for n, p in pl_module.named_parameters()}
    groups = [
        {**{k: v for k, v in g.items() if k != "params"}, "params": [personal[names[id(p)]] for p in g["params"]]}
        for g in inner.param_groups
    ]
    try:
        mirror = type(inner)(groups, **inner.defaults)
    except (TypeError, ValueError) as err:
        raise ConfigError(
            f"FedMetaMed builds the personal model's optimizer as the local one, but "
            f"{type(inner).__name__}(params, **defaults) failed ({err}): use a torch.optim "
            "optimizer in model.init_args.optimizer."
        ) from err
    if state is not None:
        mirror.load_state_dict(state)
    return mirror
