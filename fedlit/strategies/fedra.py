"""FedRA: a random allocation of the adapted layers to heterogeneous clients.

Su, Li, Xue. "FedRA: A Random Allocation Strategy for Federated Tuning to Unleash the Power of Heterogeneous
Clients." ECCV 2024. https://arxiv.org/abs/2311.11227

Each round the server draws a random allocation matrix ``M`` (clients x blocks, ``M_kl = 1`` when client k gets
block l), each row holding as many ones as its client can afford (``|M_k| = c_k``). Client k trains the adapters of
its allocated blocks only (the paper builds it a shallower model out of those blocks) and uploads them with the
layers outside the blocks (head, final norm); the server averages each block's adapters over the clients that had
it and keeps the value of a block nobody had:

    Theta_l <- sum_{k : M_kl = 1} w_k Theta_{k,l} / sum_{k : M_kl = 1} w_k    (Theta_l unchanged if no M_kl = 1)
    phi     <- sum_k w_k phi_k / sum_k w_k                                     (head, norm: every client)

Symbols -> code: ``M_k`` -> :meth:`FedRA.allocation` (sorted block indices); ``c_k`` -> ``block_counts``; the block
``l`` -> the l-th distinct layer index among the block tensors (:attr:`FedRA.blocks`); ``Theta_{k,l}``, ``phi_k``
-> ``update.state``; ``w_k`` -> ``n_k`` or 1 (``weighting``); the means -> :func:`partial_weighted_average`; a
row's draw -> :func:`random_allocation`.

What a block is: the shared tensors of the adapters (:func:`fedlit.strategies.fedsca.adapter_prefixes`: module
paths with ``adapter`` in a component, any case) and of LoRA (``lora_`` in the name), grouped by the layer index
that :class:`fedlit.core.roles.RoleRule` reads (the first ``.N.`` of the name: ``blocks.3.attn.qkv.lora_A...`` is
block 3); ``block_tensors="indexed"`` takes every shared tensor with a layer index instead. Shared tensors outside
the blocks (the head, a final norm, tensors without a layer index) go to and come back from every client.

Decisions (where the paper and its code are silent or differ):

- ``block_counts``: client k (its position in the federation's client list) can afford ``block_counts[k % len]``
  blocks (``size_assignment="cycle"``) or ``block_counts[k * len // N]`` (``"contiguous"``, the authors' code's
  grouping of clients by domain). Default ``[12, 10, 8, 6, 4, 3]``, the paper's ViT-B setting.
- ``M`` is redrawn every round, each row uniformly without replacement, from a generator seeded by
  ``(seed, round, client)`` (``seed`` None: the federation's seed): reproducible, independent of the client order,
  and a resumed run draws the same rows without any state.
- ``weighting``: ``num_examples`` weighs clients by their training examples (fedlit's FedAvg); the authors' code
  takes the plain mean (``uniform``).
- The client trains only its allocated blocks' adapters: the gradients of the others are dropped before each
  optimizer step (so neither the step, its momentum nor weight decay moves them), and they are not uploaded (their
  bytes are not counted). The server still sends every shared tensor (the live model needs a value for each).

Deviation: ``skip_unallocated=True`` (the default) reproduces the paper's shallower client model by making each
unallocated block an identity during the client's training (a forward hook that returns the block's input); this
needs blocks whose output has their input's shape, as transformer blocks. ``skip_unallocated=False`` keeps the whole
model in the forward pass and only freezes the unallocated adapters. Evaluation always uses the full model.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import torch
from torch import Tensor, nn
from torch.optim import Optimizer
from typing_extensions import override

from fedlit.core.contexts import ServerContext
from fedlit.core.errors import ConfigError
from fedlit.core.roles import RoleRule
from fedlit.module import FederatedModule
from fedlit.strategies.base import ClientUpdate, Strategy
from fedlit.strategies.common.aggregate import WEIGHTINGS, State, cast_like, client_weights, normalized_weights
from fedlit.strategies.fedsca import adapter_prefixes

#: The paper's allocation sizes on a 12-block ViT-B (clients of six kinds of resources).
PAPER_BLOCK_COUNTS = (12, 10, 8, 6, 4, 3)


def _seed(*parts: Any) -> int:
    return int(hashlib.sha256("/".join(map(str, parts)).encode()).hexdigest()[:15], 16)


def partial_weighted_average(reference: State, states: Sequence[State], weights: Sequence[float]) -> dict[str, Tensor]:
    """Per tensor of ``reference``: ``sum_{i holds it} w_i state_i / sum_{i holds it} w_i``; a tensor no state holds
    keeps its ``reference`` value (FedRA's aggregation, where each client uploads only its allocated blocks).

    Float64 inside; floating tensors keep their dtype, integer ones are rounded. Raises on a negative weight, on
    a state holding a tensor ``reference`` lacks, or where the clients holding a tensor weigh zero in total.
    """
    if len(states) != len(weights):
        raise ValueError(f"{len(states)} states but {len(weights)} weights.")
    if states:
        normalized_weights(weights)  # raises on negative or non-finite weights
    for i, state in enumerate(states):
        unknown = sorted(set(state) - set(reference))
        if unknown:
            raise ValueError(f"Client state {i} holds tensors the reference lacks: {unknown[:5]}.")
    out = {}
    for key, ref in reference.items():
        holders = [(float(w), s[key]) for w, s in zip(weights, states, strict=True) if key in s]
        if not holders:
            out[key] = ref.clone()
            continue
        w = normalized_weights([h[0] for h in holders])
        acc = torch.zeros(ref.shape, dtype=torch.float64, device=ref.device)
        for wi, (_, tensor) in zip(w, holders, strict=True):
            acc += wi.to(ref.device) * tensor.to(ref.device, torch.float64)
        out[key] = cast_like(acc, ref)
    return out


def random_allocation(num_blocks: int, count: int, generator: torch.Generator) -> list[int]:
    """``count`` distinct block indices of ``range(num_blocks)`` drawn uniformly without replacement from
    ``generator``, sorted (one row of FedRA's allocation matrix)."""
    if not 1 <= count <= num_blocks:
        raise ValueError(f"Cannot allocate {count} of {num_blocks} blocks: give 1 <= count <= {num_blocks}.")
    return sorted(torch.randperm(num_blocks, generator=generator)[:count].tolist())


class FedRA(Strategy):
    """Random allocation of the adapter-bearing blocks to clients each round; per-block means over their holders.

    Args:
        block_counts: How many blocks each kind of client trains (see ``size_assignment``); every entry in
            ``[1, number of blocks]``. Default: the paper's ``[12, 10, 8, 6, 4, 3]``.
        size_assignment: ``cycle``: client k takes ``block_counts[k % len]``; ``contiguous``: ``block_counts[k * len
            // N]`` (clients in consecutive groups, as the authors' code).
        seed: Seed of the allocations; None (the default): the federation's seed (0 outside a federation).
        weighting: ``num_examples`` (the default) or ``uniform`` (the authors' code) weights in the means.
        block_tensors: ``adapters`` (the default): blocks hold the adapter and LoRA tensors; ``indexed``: every
            shared tensor with a layer index.
        skip_unallocated: Make unallocated blocks an identity while the client trains (default True: the paper's
            shallower client model); False keeps them in the forward pass, frozen.
    """

    def __init__(
        self,
        *,
        block_counts: list[int] | None = None,
        size_assignment: Literal["cycle", "contiguous"] = "cycle",
        seed: int | None = None,
        weighting: Literal["num_examples", "uniform"] = "num_examples",
        block_tensors: Literal["adapters", "indexed"] = "adapters",
        skip_unallocated: bool = True,
    ) -> None:
        super().__init__()
        counts = list(PAPER_BLOCK_COUNTS) if block_counts is None else block_counts
        problems = []
        if (
            isinstance(counts, (str, int))
            or not counts
            or not all(isinstance(c, int) and not isinstance(c, bool) and c >= 1 for c in counts)
        ):
            problems.append(
                f"strategy.init_args.block_counts={block_counts!r} must be a non-empty list of integers "
                ">= 1 (e.g. [12, 10, 8, 6, 4, 3])"
            )
        if size_assignment not in ("cycle", "contiguous"):
            problems.append(
                f"strategy.init_args.size_assignment={size_assignment!r} is not one of ['cycle', 'contiguous']"
            )
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
            problems.append(f"strategy.init_args.seed={seed!r} must be an integer >= 0 or null (the federation's)")
        if weighting not in WEIGHTINGS:
            problems.append(f"strategy.init_args.weighting={weighting!r} is not one of {list(WEIGHTINGS)}")
        if block_tensors not in ("adapters", "indexed"):
            problems.append(f"strategy.init_args.block_tensors={block_tensors!r} is not one of ['adapters', 'indexed']")
        if not isinstance(skip_unallocated, bool):
            problems.append(f"strategy.init_args.skip_unallocated={skip_unallocated!r} must be true or false")
        if problems:
            raise ConfigError("FedRA: " + "; ".join(problems) + ".")
        self.block_counts = [int(c) for c in counts]
        self.size_assignment, self.seed, self.weighting = size_assignment, seed, weighting
        self.block_tensors, self.skip_unallocated = block_tensors, skip_unallocated
        self.blocks: list[int] = []
        self.block_of: dict[str, int] = {}
        self.block_modules: dict[int, list[str]] = {}
        self._run_seed = 0
        self._turn: dict[str, Any] = {}

    # ------------------------------------------------------------------------------------------ blocks
    @override
    def setup_server_state(self) -> None:
        """Group the shared tensors into blocks by layer index; check ``block_counts`` against their number."""
        shared = [n for n in self.roles.names("shared") if n in self.global_state]
        in_adapter = (
            set(shared)
            if self.block_tensors == "indexed"
            else {n for n in shared if "lora_" in n or adapter_prefixes([n])}
        )
        self.block_of, self.block_modules = {}, {}
        for name in shared:
            found = re.search(RoleRule.depth_key, name)
            if name in in_adapter and found:
                block = int(found.group(1))
                self.block_of[name] = block
                module = name[: found.end() - 1]
                if module not in self.block_modules.setdefault(block, []):
                    self.block_modules[block].append(module)
        self.blocks = sorted(set(self.block_of.values()))
        if not self.blocks:
            what = (
                "tensor with a layer index"
                if self.block_tensors == "indexed"
                else (
                    "LoRA or adapter tensor with a layer index ('lora_' in its name or 'adapter' in its module path, "
                    "and a '.N.' in it)"
                )
            )
            raise ConfigError(
                f"FedRA allocates blocks of adapters to clients, but no shared {what} was found; shared tensors look "
                f"like {shared[:3]}. Give LoRA or adapters the role 'shared' in model.init_args.roles, or set "
                "strategy.init_args.block_tensors=indexed."
            )
        if max(self.block_counts) > len(self.blocks):
            raise ConfigError(
                f"strategy.init_args.block_counts={self.block_counts} but the model has {len(self.blocks)} blocks "
                f"with adapters (layer indices {self.blocks[:12]}): give counts of at most {len(self.blocks)}."
            )

    def block_count(self, client_id: str) -> int:
        """``c_k``: how many blocks ``client_id`` trains (``size_assignment``)."""
        k, n = self.client_ids.index(client_id), len(self.client_ids)
        if self.size_assignment == "cycle":
            return self.block_counts[k % len(self.block_counts)]
        return self.block_counts[k * len(self.block_counts) // n]

    def allocation(self, server_round: int, client_id: str) -> list[int]:
        """``M_k`` of the round: the layer indices of the blocks ``client_id`` trains, drawn from a generator seeded
        by ``(seed, server_round, client_id)``."""
        seed = self.seed if self.seed is not None else self._run_seed
        generator = torch.Generator().manual_seed(_seed(seed, "fedra", server_round, client_id))
        rows = random_allocation(len(self.blocks), self.block_count(client_id), generator)
        return [self.blocks[i] for i in rows]

    def uploaded_names(self, server_round: int, client_id: str) -> list[str]:
        """The shared tensors ``client_id`` uploads this round: its allocated blocks' and those outside blocks."""
        kept = set(self.allocation(server_round, client_id))
        return [n for n in self.global_state if self.block_of.get(n, -1) in kept or n not in self.block_of]

    @override
    def expected_upload_names(self, server_round: int, client_id: str, received: Mapping[str, Tensor]) -> list[str]:
        """What the client uploads (:meth:`uploaded_names`), not every tensor it received."""
        return self.uploaded_names(server_round, client_id)

    # ------------------------------------------------------------------------------------------ client
    @override
    def on_fit_start(self, trainer: ServerContext, pl_module: FederatedModule) -> None:
        """Take the federation's seed (when ``seed`` is None)."""
        self._run_seed = int(trainer.settings.seed)

    def on_client_fit_start(self, pl_module: FederatedModule, server_round: int, client_id: str) -> None:
        """Note the parameters of the unallocated blocks; with ``skip_unallocated``, make those blocks identities."""
        self._remove_hooks()
        kept = set(self.allocation(server_round, client_id))
        frozen = [p for n, p in pl_module.named_parameters() if self.block_of.get(n, -1) not in (-1, *kept)]
        self._turn = {"frozen": frozen, "hooks": [], "blocks": sorted(kept)}
        if self.skip_unallocated:
            modules = dict(pl_module.named_modules())
            for block in self.blocks:
                if block not in kept:
                    for path in self.block_modules[block]:
                        self._turn["hooks"].append(modules[path].register_forward_hook(_identity(path)))

    @override
    def on_before_optimizer_step(self, optimizer: Optimizer) -> None:
        """Drop the gradients of the unallocated blocks: the optimizer skips parameters without one."""
        for param in self._turn.get("frozen", ()):
            param.grad = None

    def on_client_fit_end(self, update: ClientUpdate, server_round: int, client_id: str) -> None:
        """Upload only the allocated blocks (and what is outside blocks); remove the identity hooks."""
        keep = set(self.uploaded_names(server_round, client_id))
        for name in [n for n in update.state if n not in keep]:
            del update.state[name]
        update.extras["fedra_blocks"] = list(self._turn.get("blocks", []))
        self._remove_hooks()
        self._turn = {}

    @override
    def configure_evaluate(self, server_round: int, client_id: str) -> dict[str, Tensor]:
        """The full global model (no block skipped)."""
        self._remove_hooks()
        return dict(self.global_state)

    def _remove_hooks(self) -> None:
        for handle in self._turn.get("hooks", ()):
            handle.remove()
        if self._turn:
            self._turn["hooks"] = []

    # ------------------------------------------------------------------------------------------ server
    @override
    def aggregate(self, server_round: int, updates: list[ClientUpdate]) -> dict[str, Tensor]:
        """Each block: the weighted mean over the clients that had it (kept if none); the rest: over every client."""
        if not updates:
            return dict(self.global_state)
        self.check_uploads(updates)
        states = []
        for update in updates:
            expected = self.uploaded_names(server_round, update.client_id)
            missing = sorted(set(expected) - set(update.state))
            if missing:
                raise KeyError(
                    f"FedRA: client {update.client_id!r} did not upload {missing[:5]} of its allocated "
                    f"blocks {self.allocation(server_round, update.client_id)} or outside the blocks."
                )
            states.append({n: update.state[n] for n in expected})
        weights = client_weights(updates, self.weighting)
        return {**self.global_state, **partial_weighted_average(self.global_state, states, weights)}

    @override
    def hparams(self) -> dict[str, Any]:
        """The arguments, ``block_counts`` as resolved (the paper's counts for None)."""
        return {**super().hparams(), "block_counts": self.block_counts}


def _identity(path: str) -> Any:
    """A forward hook that returns the block's input instead of its output (the block is skipped)."""

    def hook(module: nn.Module, args: tuple[Any, ...], output: Any) -> Any:
        if (
            not args
            or not isinstance(args[0], Tensor)
            or not isinstance(output, Tensor)
            or (args[0].shape != output.shape)
        ):
            raise ConfigError(
                f"FedRA cannot skip the unallocated block {path!r}: its input and output are not one tensor of the "
                "same shape. Set strategy.init_args.skip_unallocated=false to keep it in the forward pass, frozen."
            )
        return args[0]

    return hook
