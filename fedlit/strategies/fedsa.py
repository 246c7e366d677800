"""FedSA: selective aggregation of low-rank adapters.

Guo, Zeng, Wang, Fan, Wang, Qu. "Selective Aggregation for Low-Rank Adaptation in Federated Learning."
ICLR 2025. https://arxiv.org/abs/2410.01463

The paper's finding: in LoRA ``W + B A``, the A matrices learn what the clients have in common, the B matrices
what is specific to each. FedSA-LoRA therefore uploads only A and keeps B on the client:

    server:  A^{t+1} = sum_{k in S_t} (n_k / n) A_k^t          client k:  B_k^{t+1} = B_k^t (never leaves k)

and every client trains its own ``W + B_k A``. For bottleneck adapters (``x + up(act(down(x)))``, as in
Medical-SAM-Adapter's ``D_fc1`` / ``D_fc2``), the down projection plays A's part and the up projection B's: the down
projection is shared, the up projection personal. The classification head stays personal too.

Symbols -> code: ``A_k`` -> ``update.state`` (everything still shared after :meth:`FedSA.configure_roles`); ``B_k``
and the head -> the client's ``personal`` tensors in the :class:`~fedlit.core.store.ClientStore`; ``n_k`` ->
``update.num_examples``; the mean -> :class:`~fedlit.strategies.fedavg.FedAvg`'s aggregator.

What stays personal is a list of name patterns (``personal_patterns``, fnmatch, or a regular expression after
``re:``) applied to the shared tensors, plus, with ``adapter_up_by_order``, the second of the two weight-bearing
layers of every bottleneck adapter whatever it is called (an adapter is the module path up to the first dotted
name component containing ``adapter``, any case: see :func:`fedlit.strategies.fedsca.adapter_prefixes`). Every
other shared tensor (LoRA A, adapter down projections, any other shared layer) is averaged as in FedAvg.

Deviation: the paper's experiments are language models whose classifier is trained and averaged by the baseline
code; here the head is personal by default (pattern ``head.*``), as personalized FL compares heads; drop the
pattern from ``personal_patterns`` to share it.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Sequence
from typing import Any, Literal

from typing_extensions import override

from fedlit.core.errors import ConfigError
from fedlit.core.roles import ParameterRoles
from fedlit.strategies.common.aggregators import Aggregator
from fedlit.strategies.fedavg import FedAvg
from fedlit.strategies.fedsca import _in_adapter, adapter_prefixes

#: LoRA B (of linear and convolution layers, and of embeddings), the up projections of bottleneck adapters by
#: their usual names, and the classification head.
DEFAULT_PERSONAL = (
    "*lora_B*",
    "*lora_embedding_B*",
    "*[Aa]dapter*.D_fc2.*",
    "*[Aa]dapter*.up.*",
    "*[Aa]dapter*.up_proj.*",
    "*[Aa]dapter*.fc2.*",
    "head.*",
)


def _matches(name: str, pattern: str) -> bool:
    if pattern.startswith("re:"):
        return re.search(pattern[3:], name) is not None
    return fnmatch.fnmatchcase(name, pattern)


def adapter_up_projections(names: Sequence[str]) -> list[str]:
    """The tensors of each bottleneck adapter's up projection among ``names``: in an adapter (see
    :func:`~fedlit.strategies.fedsca.adapter_prefixes`) whose tensors belong to exactly two layers holding a weight
    of two or more dimensions, those of the second layer in model order. Other adapters give nothing."""
    out: list[str] = []
    for prefix in adapter_prefixes(list(names)):
        members = [n for n in names if _in_adapter(n, prefix)]
        layers: list[str] = []
        for name in members:
            layer = name.rsplit(".", 1)[0]
            if name.endswith(".weight") and layer not in layers:
                layers.append(layer)
        if len(layers) == 2:
            out += [n for n in members if n.rsplit(".", 1)[0] == layers[1]]
    return out


class FedSA(FedAvg):
    """FedAvg on LoRA A (and adapter down projections); LoRA B, adapter up projections and the head personal.

    Args:
        personal_patterns: Shared tensors whose names match one of these (fnmatch, or ``re:`` + a regular
            expression) become personal. Default: LoRA B (``*lora_B*``, ``*lora_embedding_B*``), the up
            projections of adapters named ``D_fc2``, ``up``, ``up_proj`` or ``fc2``, and the head (``head.*``).
        adapter_up_by_order: Also make personal, in every adapter with exactly two weight-bearing layers, the second
            one (its up projection) whatever its name (default True).
        weighting: As in :class:`FedAvg` (``num_examples``: the paper's ``n_k / n``).
        aggregator: As in :class:`FedAvg` (default: the weighted mean).
    """

    fusable = True

    def __init__(
        self,
        *,
        personal_patterns: list[str] | None = None,
        adapter_up_by_order: bool = True,
        weighting: Literal["num_examples", "uniform"] = "num_examples",
        aggregator: Aggregator | None = None,
    ) -> None:
        super().__init__(weighting=weighting, aggregator=aggregator)
        patterns = list(DEFAULT_PERSONAL) if personal_patterns is None else personal_patterns
        problems = []
        if isinstance(patterns, str) or not all(isinstance(p, str) and p for p in patterns):
            problems.append(
                f"strategy.init_args.personal_patterns={personal_patterns!r} must be a list of non-empty "
                "name patterns (e.g. ['*lora_B*', 'head.*'])"
            )
        else:
            for pattern in patterns:
                if pattern.startswith("re:"):
                    try:
                        re.compile(pattern[3:])
                    except re.error as err:
                        problems.append(
                            f"strategy.init_args.personal_patterns: {pattern!r} is not a valid regular "
                            f"expression ({err})"
                        )
        if not isinstance(adapter_up_by_order, bool):
            problems.append(f"strategy.init_args.adapter_up_by_order={adapter_up_by_order!r} must be true or false")
        if problems:
            raise ConfigError("FedSA: " + "; ".join(problems) + ".")
        self.personal_patterns = list(patterns)
        self.adapter_up_by_order = adapter_up_by_order

    def personal_names(self, shared: Sequence[str]) -> list[str]:
        """The names among ``shared`` that FedSA keeps personal, in the given order."""
        chosen = set(adapter_up_projections(shared)) if self.adapter_up_by_order else set()
        chosen |= {n for n in shared if any(_matches(n, p) for p in self.personal_patterns)}
        return [n for n in shared if n in chosen]

    @override
    def configure_roles(self, roles: ParameterRoles) -> ParameterRoles:
        """LoRA B, adapter up projections and the head become personal; LoRA A, down projections stay shared."""
        shared = roles.names("shared")
        low_rank = [n for n in shared if "lora_" in n or adapter_prefixes([n])]
        personal = set(self.personal_names(shared))
        if not low_rank:
            raise ConfigError(
                "FedSA splits LoRA or adapter tensors between the server (A, down projections) and the clients (B, "
                f"up projections), but no shared tensor is a LoRA matrix ('lora_' in its name) or inside an adapter "
                f"('adapter' in its module path); shared tensors look like {shared[:3]}. Add LoRA to the backbone "
                "(model.init_args.backbone.init_args.lora) and make it shared in model.init_args.roles (e.g. "
                "'*lora_*' -> shared), or use a model with adapters."
            )
        if not personal & set(low_rank):
            raise ConfigError(
                f"FedSA: strategy.init_args.personal_patterns={self.personal_patterns} match none of the shared LoRA "
                f"or adapter tensors (e.g. {low_rank[:3]}), so nothing of B or the up projections stays personal. "
                "Give patterns that match them (e.g. '*lora_B*', '*Adapter*.D_fc2.*')."
            )
        if set(shared) <= personal:
            raise ConfigError(
                f"FedSA: strategy.init_args.personal_patterns={self.personal_patterns} make every shared tensor "
                "personal, so nothing is aggregated. Leave LoRA A / the adapters' down projections out of them."
            )
        return roles.with_roles(dict.fromkeys(personal, "personal"))

    @override
    def hparams(self) -> dict[str, Any]:
        """The arguments, ``personal_patterns`` as resolved (the default patterns for None)."""
        return {**super().hparams(), "personal_patterns": self.personal_patterns}
