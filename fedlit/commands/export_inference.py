"""What ``fedlit export`` writes for inference without fedlit: each client's whole model as one state dict, and
what its inputs and outputs are.

``inference.safetensors`` is the client's complete model, frozen tensors included, with LoRA merged into the
weights it adapts: ``W + (alpha / r) B A`` stored as ``<layer>.weight`` where the module holds
``<layer>.base_layer.weight`` and the adapters. Its names are those of the model the recipe builds *without*
LoRA, so for a classifier on a timm backbone they are ``backbone.<timm's own names>`` and ``head.weight``,
``head.bias``, and ``torch.nn.Sequential(OrderedDict(backbone=timm.create_model(name, num_classes=0, **model_args),
head=torch.nn.Linear(num_features, num_classes)))`` loads it with ``strict=True``: no peft, no fedlit, no
pretrained weight file (the frozen tensors are in it). fedlit's own backbones (``SmallCNN``, ``Identity``...) are
rebuilt by their spec's ``build()``; the head's shape (and whether it has a bias: a Cox model's has none) is that of
``head.weight`` in the file (docs/runs.md, "Inference in plain PyTorch").

``preprocessing.json`` is the data module's
:meth:`~fedlit.data.common.datamodule.FederatedDataModule.preprocessing` for that client: task, class names, the input
as the model receives it (kind, shape, channels, size), the normalization its loader applies.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

INFERENCE = "inference.safetensors"
PREPROCESSING = "preprocessing.json"


def _adapted(module: nn.Module) -> dict[str, nn.Module]:
    """The layers that carry LoRA (peft's LoRA layers and :class:`~fedlit.models.lora.FusedQVLoRA`): a
    ``base_layer`` beside parameters named ``lora_*``, by qualified name, outermost first."""
    found: dict[str, nn.Module] = {}
    for name, layer in module.named_modules():
        if any(name.startswith(f"{outer}.") for outer in found):
            continue
        if isinstance(getattr(layer, "base_layer", None), nn.Module) and any(
            n.startswith("lora_") for n, _ in layer.named_parameters()
        ):
            found[name] = layer
    return found


def merged_state_dict(module: nn.Module) -> dict[str, Tensor]:
    """``module``'s state dict (CPU copies) with every LoRA layer merged into its base layer's weight.

    The merged weight is read off the layer itself in eval mode, ``layer(I) - bias`` transposed, so any update
    the layer's forward adds to a Linear (peft's LoRA, fedlit's q/v-slice LoRA) is merged exactly as computed.

    Raises:
        TypeError: If a LoRA layer wraps something other than a Linear (a convolution, an embedding): its update
            cannot be merged this way.
    """
    state = {k: v.detach().cpu().clone() for k, v in module.state_dict().items()}
    for name, layer in _adapted(module).items():
        base = layer.base_layer
        if not isinstance(base, nn.Linear):
            raise TypeError(f"{name}: LoRA on a {type(base).__name__} cannot be merged into a plain layer")
        training = layer.training
        layer.eval()
        with torch.no_grad():
            eye = torch.eye(base.in_features, dtype=base.weight.dtype, device=base.weight.device)
            out = layer(eye)
        layer.train(training)
        weight = (out - base.bias if base.bias is not None else out).T
        prefix = f"{name}."
        for key in [k for k in state if k.startswith(prefix)]:
            value = state.pop(key)
            rest = key[len(prefix) :]
            if rest.startswith("base_layer."):
                state[prefix + rest[len("base_layer.") :]] = value
        state[f"{prefix}weight"] = weight.detach().cpu().contiguous()
    return state


def preprocessing(datamodule: Any, client_id: str) -> dict[str, Any] | None:
    """The data module's record of what an input is (None for a data source without the hook)."""
    hook = getattr(datamodule, "preprocessing", None)
    return hook(client_id) if callable(hook) else None
