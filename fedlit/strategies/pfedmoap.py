"""pFedMoAP: each client mixes its own CLIP prompt with the nearest other clients' prompts through a personal gate.

Luo, Chen, Wu. "Mixture of Experts Made Personalized: Federated Prompt Learning for Vision-Language Models."
ICLR 2025. https://arxiv.org/abs/2410.10114 (code read: the official repository, ``ljaiverson/pFedMoAP``, which
holds the training code since April 2025: ``trainers/pfedmoap.py``, ``federated_main.py``)

The model is :class:`fedlit.tasks.CLIPPromptModule` with ``gating: true``: a frozen CLIP, a CoOp context prompt
``P`` (``prompt.ctx``: 16 tokens, shared) and an attention gate ``G_i`` (``gate.*``: personal, never uploaded).
Per round:

- server keeps every client's latest prompt ``P_j`` (``self.prompts``) and the global prompt ``P_g``, the
  sample-weighted mean of the prompts the round's clients uploaded (FedAvg over ``prompt.ctx``); ``P_g``
  initializes the local prompt of every client that trains next round (``configure_client``)
- non-local experts (``configure_client_extras``): the ``K - 1`` stored prompts of other clients nearest in L2 to
  the client's previous prompt (its own stored one), fewer when fewer are stored (:func:`nearest_experts`); a
  client that has never trained has no previous prompt and trains its first turn without experts (the gate is
  then unused: CoOp's logits), as in the authors' code. They count as download.
- client (``on_client_fit_start``): the experts' text features are computed once per turn with the frozen text
  encoder (normalized, pooled to ``d``) and set on the module, whose forward is
  ``logits = lam s cos(I, T_L) + s <pool(I), MHA(pool(I), [pool(T_L), pool(T_1..K-1)])>`` per class
  (:func:`fedlit.tasks.clip_prompt.moap_logits`); the local prompt and the gate train on the client's loss
- up: the trained prompt; the gate, the trained prompt and the experts' features stay on the client
- evaluation: each client with its own last trained prompt, its gate and the experts of its last turn (the
  authors evaluate a client that trained in the round the same way; one that never trained, with ``P_g``)

Symbols -> code: ``K`` -> ``num_experts``; ``P_j`` -> ``self.prompts[j]``; ``P_g`` -> ``global_state``;
``G_i`` -> the module's ``gate.*`` (personal, in the client store); expert features ->
``client_state["experts"]`` (E, C, d); the client's prompt -> ``client_state["prompt"]``; ``lam``, ``d``, the
heads and the score scale are the module's ``lam``, ``gate_dim``, ``gate_heads``, ``gate_scale``.

Deviation: the authors' clients train one after another, and a client picks its experts among prompts uploaded
earlier in the same round; here the clients of a round train from the prompts stored when the round starts (the
clients are independent, as in every fedlit strategy). Deviation: the authors re-select experts when evaluating a
client that sat the round out; here a client is evaluated with the experts of its last turn (no download to
evaluate). Deviation: the authors' model keeps the previous client's expert features when a client trains for the
first time (an attribute never cleared); here such a turn has no experts. Deviation: the authors' loop builds the
prompt's and the gate's optimizers once and shares them (momentum, learning-rate schedules) across every client
and round, and, since its store of gates starts as ``{}`` and is tested with ``!= []`` (always true), a client's
first turn with experts loads an empty state and starts from the gate the previous client trained; fedlit resets
both per client, the paper's procedure (each client trains its own gate from the one initialization, with a fresh
optimizer each turn, or its own under ``federation.optimizer_state: persist``), so that no client's turn depends on
which client trained before it. Deviation: the authors' script asks for ``--sparse_selection nearest``, but the call
uses ``sparse_selection``'s own default, ``random`` (a fixed shuffled order of the clients); fedlit selects the
nearest, as the paper.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from typing_extensions import override

from fedlit.core.contexts import ClientContext, ServerContext
from fedlit.core.errors import ConfigError
from fedlit.module import FederatedModule
from fedlit.strategies.base import ClientUpdate, Strategy
from fedlit.strategies.common.aggregate import weighted_average
from fedlit.tasks.clip_prompt import CLIPPromptModule

__all__ = ["CONTEXT", "nearest_experts", "pFedMoAP"]

#: The shared tensor that is the prompt (``CLIPPromptModule``'s context vectors).
CONTEXT = "prompt.ctx"


def nearest_experts(reference: Tensor, candidates: dict[str, Tensor], count: int) -> list[str]:
    """The ``count`` candidates nearest to ``reference`` in L2 (Frobenius) distance, nearest first; ties keep the
    candidates' order; all of them when there are at most ``count``."""
    names = list(candidates)
    if not names or count <= 0:
        return []
    ref = reference.detach().double().flatten()
    distances = torch.stack(
        [torch.linalg.vector_norm(candidates[n].detach().double().flatten().to(ref.device) - ref) for n in names]
    )
    order = torch.sort(distances, stable=True).indices.tolist()
    return [names[i] for i in order[:count]]


class pFedMoAP(Strategy):  # noqa: N801  (the paper's spelling)
    """FedAvg of CLIP prompts; each client mixes its prompt with its K - 1 nearest peers' by a personal gate.

    Args:
        num_experts: K, the experts of a client including its own prompt (10 in the paper): up to K - 1 non-local
            prompts are sent to each client.
    """

    def __init__(self, *, num_experts: int = 10) -> None:
        super().__init__()
        if isinstance(num_experts, bool) or not isinstance(num_experts, int) or num_experts < 1:
            raise ConfigError(
                f"strategy.init_args.num_experts={num_experts!r} must be an integer >= 1 (K: the own "
                "prompt and K - 1 non-local ones; 10 in the paper)."
            )
        self.num_experts = num_experts
        self.prompts: dict[str, Tensor] = {}
        self._experts: Tensor | None = None

    # ------------------------------------------------------------------------------------------ server
    @override
    def setup_server_state(self) -> None:
        """Check that the model shares its prompt; no client has a stored prompt yet."""
        if CONTEXT not in self.shared_parameter_names():
            raise ConfigError(
                f"pFedMoAP shares the CLIP prompt {CONTEXT!r}, which this model does not share: use "
                "model fedlit.tasks.CLIPPromptModule with gating: true (it shares its prompt)."
            )
        self.prompts = {}

    @override
    def on_fit_start(self, trainer: ServerContext, pl_module: FederatedModule | None = None) -> None:
        """Refuse a module without the gate."""
        if pl_module is not None and getattr(pl_module, "gate", None) is None:
            raise ConfigError(
                "pFedMoAP needs the attention gate: set model.init_args.gating: true (fedlit.tasks.CLIPPromptModule)."
            )

    @override
    def configure_client_extras(self, server_round: int, client_id: str) -> dict[str, Any]:
        """The ``K - 1`` other stored prompts nearest to the client's own (none before it first uploads one)."""
        ids = self.expert_ids(client_id)
        template = self.global_state[CONTEXT]
        experts = torch.stack([self.prompts[c] for c in ids]) if ids else template.new_zeros((0, *template.shape))
        return {"experts": experts}

    @override
    def expected_download_extras(self, server_round: int, client_id: str) -> dict[str, Any]:
        """No expert in round 1 (no prompt stored yet); from round 2, ``min(K - 1, N - 1)`` prompts: every other
        client's once all have trained (with partial participation a client gets fewer until then, and none
        before its first turn: an upper bound)."""
        template = self.global_state[CONTEXT]
        count = 0 if server_round <= 1 else min(self.num_experts - 1, len(self.client_ids) - 1)
        return {"experts": template.new_zeros((count, *template.shape))}

    def expert_ids(self, client_id: str) -> list[str]:
        """The clients whose stored prompts are ``client_id``'s non-local experts, nearest first."""
        own = self.prompts.get(client_id)
        if own is None:
            return []
        others = {c: self.prompts[c] for c in self.client_ids if c != client_id and c in self.prompts}
        return nearest_experts(own, others, self.num_experts - 1)

    @override
    def aggregate(self, server_round: int, updates: list[ClientUpdate]) -> dict[str, Tensor]:
        """Store each uploaded prompt; the global state is the sample-weighted mean of the uploads."""
        if not updates:
            return dict(self.global_state)
        self.check_uploads(updates)
        for update in updates:
            self.prompts[update.client_id] = (
                update.state[CONTEXT].detach().to(self.global_state[CONTEXT].device, copy=True)
            )
        return weighted_average([u.state for u in updates], [u.num_examples for u in updates])

    @override
    def state_dict(self) -> dict[str, Any]:
        """The global state and every client's stored prompt."""
        return {**super().state_dict(), "prompts": self.prompts}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`."""
        super().load_state_dict(state_dict)
        self.prompts = dict(state_dict["prompts"])

    # ------------------------------------------------------------------------------------------ client
    def on_client_fit_start(self, pl_module: CLIPPromptModule, received_extras: dict[str, Any]) -> None:
        """The experts' text features, once for the turn, set on the module."""
        self._experts = pl_module.expert_features(received_extras["experts"])
        pl_module.set_experts(self._experts if len(self._experts) else None)

    def on_client_fit_end(
        self, pl_module: CLIPPromptModule, client_state: dict[str, Any], client: ClientContext
    ) -> None:
        """Keep the trained prompt and the turn's expert features on the client; clear them from the module."""
        store = client.store.device
        client_state["prompt"] = pl_module.context.detach().to(store, copy=True)
        if self._experts is not None:
            client_state["experts"] = self._experts.detach().to(store, copy=True)
        pl_module.set_experts(None)
        self._experts = None

    @override
    def on_client_evaluate_start(self, pl_module: CLIPPromptModule, client_state: dict[str, Any]) -> None:
        """Evaluate with the client's own trained prompt and last experts (as sent, before its first turn)."""
        prompt = client_state.get("prompt")
        if prompt is not None:
            with torch.no_grad():
                pl_module.context.copy_(prompt)
        experts = client_state.get("experts")
        pl_module.set_experts(experts if experts is not None and len(experts) else None)
