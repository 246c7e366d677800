"""FedFomo: each client federates with the other clients' models that lower its own validation loss.

Zhang, Sapra, Fidler, Yeung, Alvarez. "Personalized Federated Learning with First Order Model Optimization."
ICLR 2021. https://arxiv.org/abs/2012.08565 (PFLlib's ``FedFomo``, TsingZ0/PFLlib ``clientfomo.py``,
``serverfomo.py``, read)

The server keeps every client's latest model ``theta_n`` and an affinity matrix ``P`` (``P_in``: how much client i
has gained from client n's models so far). Each round, client i downloads its own model and M other clients'
models, chosen on ``P_i`` epsilon-greedily (each of the M places: with probability ``eps`` a uniform pick among the
clients not yet chosen, else the one of highest affinity; ``eps`` decays linearly per round). On its validation data
(the paper holds out part of the client's data; fedlit uses the client's ``val`` split by default) client i computes

    (Eq. 4)  w_n = (L_i(theta_i) - L_i(theta_n)) / ||theta_n - theta_i||_2,
    (Eq. 5)  theta_i <- theta_i + sum_n w~_n (theta_n - theta_i),   w~_n = max(w_n, 0) / sum_k max(w_k, 0),

(no change when no ``w_n`` is positive), trains locally from there and uploads ``theta_i``; the server replaces its
copy of ``theta_i`` and adds the client's ``w_n`` to ``P_in``. Client i is evaluated with its latest ``theta_i``.

Defaults: ``M = 5`` (PFLlib's ``-M``), ``eps = 0.3`` decayed by ``0.05`` per round (the epsilon-greedy settings
of the authors' CIFAR-10 command, ``--client_weight_epsilon 0.3 --client_weight_epsilon_decay 0.05``, the decay
subtracted once per federated round); the validation loss is the module's training loss (cross-entropy for
classification), the mean over the split's samples, in eval mode.

Symbols -> code: ``theta_n`` -> ``self.models[n]`` (the shared parameters it uploaded; until it does, the initial
``global_state``); ``P`` -> ``self.affinity`` (rows and columns in ``self.client_ids`` order, float64); ``M``,
``eps`` -> ``num_models``, ``eps``/``eps_decay``; Eq. 4 -> :func:`fomo_weights`; Eq. 5 -> :func:`fomo_update`;
the choice -> :func:`fomo_choice`. The distance is over the shared parameters (the frozen backbone never
travels); shared buffers (BatchNorm statistics) stay the client's own.

PFLlib departs from the paper, fedlit follows the paper: PFLlib picks the top M of ``P_i`` with no exploration,
with ``P`` starting at the identity (so a client's own upload takes one of the M places, with weight ~0); it computes
``L_i`` and the distances from the client's model before its last local training; it adds ``1e-5`` to every
distance (here a zero distance gives ``w_n = 0``: the same model brings nothing); its validation loss is the mean
of the batch means over the last 20% of the train split, which it then does not train on.
Deviation: a client that has not trained yet starts from the initial model, and nothing is averaged into a global
one (the paper has none): clients never trained (and unseen ones) are evaluated with the initial model.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal, cast

import torch
from torch import Tensor
from typing_extensions import override

from fedlit.core.contexts import ClientContext, ServerContext
from fedlit.core.errors import ConfigError, DataError
from fedlit.core.seeding import derive_seed
from fedlit.module import FederatedModule
from fedlit.strategies.base import ClientUpdate, Strategy

#: The key of a client's uploaded weights ``w_n`` (a vector over every client) in ``ClientUpdate.extras``.
EXTRAS_KEY = "fomo_weights"


def fomo_weights(own_loss: float, losses: Sequence[float], distances: Sequence[float]) -> Tensor:
    """Eq. 4: ``w_n = (L_i - L_n) / d_n`` (float64); 0 where ``d_n = 0`` (the same model)."""
    gains = torch.as_tensor([own_loss - loss for loss in losses], dtype=torch.float64)
    d = torch.as_tensor(list(distances), dtype=torch.float64)
    return torch.where(d > 0, gains / torch.where(d > 0, d, torch.ones_like(d)), torch.zeros_like(d))


def fomo_update(
    own: Mapping[str, Tensor], others: Sequence[Mapping[str, Tensor]], weights: Tensor
) -> dict[str, Tensor]:
    """Eq. 5: ``own + sum_n w~_n (other_n - own)`` with ``w~ = max(w, 0) / sum max(w, 0)``; ``own`` when no weight is
    positive. Per tensor of ``own``, accumulated in float64 and cast back."""
    clipped = weights.to(torch.float64).clamp(min=0)
    if clipped.sum() <= 0:
        return {n: t.clone() for n, t in own.items()}
    share = clipped / clipped.sum()
    out = {}
    for name, tensor in own.items():
        base = tensor.to(torch.float64)
        acc = base.clone()
        for w, other in zip(share.tolist(), others, strict=True):
            acc += w * (other[name].to(tensor.device, torch.float64) - base)
        out[name] = acc.to(tensor.dtype)
    return out


def fomo_choice(affinity: Tensor, m: int, eps: float, generator: torch.Generator) -> list[int]:
    """``min(m, len(affinity))`` distinct indices: each place a uniform pick among those left with probability
    ``eps``, else the one of highest affinity (the lowest index on a tie)."""
    left = list(range(len(affinity)))
    chosen = []
    for _ in range(min(m, len(left))):
        if float(torch.rand((), generator=generator)) < eps:
            pick = left[int(torch.randint(len(left), (), generator=generator))]
        else:
            pick = max(left, key=lambda k: (float(affinity[k]), -k))
        left.remove(pick)
        chosen.append(pick)
    return chosen


def _num_samples(batch: Any) -> int:
    first = (
        batch[0]
        if isinstance(batch, list | tuple)
        else next(iter(batch.values()))
        if isinstance(batch, Mapping)
        else batch
    )
    return len(first)


class FedFomo(Strategy):
    """Per-client models updated from the other clients' models by their first-order gain on validation data.

    Args:
        num_models: ``M``, the other clients' models each client downloads per round (default 5).
        eps: The exploration probability of the first round (default 0.3).
        eps_decay: Subtracted from ``eps`` each round, down to 0 (default 0.05).
        split: The client's data the weights are computed on: ``val`` (default) or ``train``.
    """

    def __init__(
        self, *, num_models: int = 5, eps: float = 0.3, eps_decay: float = 0.05, split: Literal["val", "train"] = "val"
    ) -> None:
        super().__init__()
        problems = []
        key = "strategy.init_args."
        if isinstance(num_models, bool) or not isinstance(num_models, int) or num_models < 1:
            problems.append(f"{key}num_models={num_models!r} must be an integer >= 1 (5 by default)")
        if not 0 <= eps <= 1 or not eps_decay >= 0:
            problems.append(f"{key}eps={eps!r} must be in [0, 1] and {key}eps_decay={eps_decay!r} >= 0")
        if split not in ("val", "train"):
            problems.append(f"{key}split={split!r} is not one of ['val', 'train']")
        if problems:
            raise ConfigError("Invalid FedFomo settings: " + "; ".join(problems) + ".")
        self.num_models, self.eps, self.eps_decay, self.split = num_models, float(eps), float(eps_decay), split
        self.models: dict[str, dict[str, Tensor]] = {}
        self.affinity = torch.zeros(0, 0, dtype=torch.float64)
        self.seed = 0
        self._turn: dict[str, Any] = {}

    # ------------------------------------------------------------------------------------------ server
    @override
    def setup_server_state(self) -> None:
        """No model uploaded yet; ``P = 0``."""
        self.models = {}
        self.affinity = torch.zeros(len(self.client_ids), len(self.client_ids), dtype=torch.float64)

    @override
    def on_fit_start(self, trainer: ServerContext) -> None:
        """The seed of the epsilon-greedy choices (derived from the run's: a resumed run draws the same)."""
        self.seed = int(trainer.derive_seed("fedfomo"))

    def epsilon(self, server_round: int) -> float:
        """``max(0, eps - eps_decay (server_round - 1))``."""
        return max(0.0, self.eps - self.eps_decay * (server_round - 1))

    @override
    def configure_client(self, server_round: int, client_id: str) -> dict[str, Tensor]:
        """The client's own latest model (the initial one before it uploads)."""
        return dict(self.models.get(client_id, self.global_state))

    @override
    def configure_client_extras(self, server_round: int, client_id: str) -> dict[str, Any]:
        """M other clients' latest models (shared parameters), chosen on the client's affinities."""
        own = self.client_ids.index(client_id)
        candidates = [j for j, c in enumerate(self.client_ids) if j != own and c in self.models]
        generator = torch.Generator().manual_seed(derive_seed(self.seed, server_round, client_id))
        picks = fomo_choice(self.affinity[own, candidates], self.num_models, self.epsilon(server_round), generator)
        names = self.shared_parameter_names()
        models = {}
        for k in picks:
            model = self.models[self.client_ids[candidates[k]]]
            models[self.client_ids[candidates[k]]] = {n: model[n] for n in names}
        return {"models": models, "clients": list(self.client_ids)}

    @override
    def aggregate(self, server_round: int, updates: list[ClientUpdate]) -> dict[str, Tensor]:
        """Keep each upload as its client's model; ``P_in += w_n``. ``global_state`` stays the initial model."""
        self.check_uploads(updates)
        for update in updates:
            self.models[update.client_id] = dict(update.state)
            weights = update.extras.get(EXTRAS_KEY)
            if weights is not None:
                row = self.client_ids.index(update.client_id)
                self.affinity[row] += weights.to(torch.float64).cpu()
        return dict(self.global_state)

    @override
    def state_dict(self) -> dict[str, Any]:
        """Server state plus every client's model and ``P``."""
        return {**super().state_dict(), "models": self.models, "affinity": self.affinity}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`."""
        super().load_state_dict(state_dict)
        self.models = {c: dict(m) for c, m in state_dict["models"].items()}
        self.affinity = state_dict["affinity"]

    # ------------------------------------------------------------------------------------------ client
    def validation_loss(self, pl_module: FederatedModule, loader: Any, client: ClientContext) -> float:
        """The module's loss (its ``training_step``'s) over ``loader``, per sample, in eval mode."""
        pl_module.eval()
        total, count = 0.0, 0
        with torch.no_grad():
            for batch_idx, batch in enumerate(loader):
                batch = client.prepare_batch(batch)
                with client.autocast():
                    out = client.convert_output(pl_module.training_step(batch, batch_idx))
                loss = out["loss"] if isinstance(out, Mapping) else out
                n = _num_samples(batch)
                total, count = total + float(cast(Tensor, loss)) * n, count + n
        return total / count

    def on_client_fit_start(
        self,
        pl_module: FederatedModule,
        server_round: int,
        client_id: str,
        received_extras: dict[str, Any],
        client: ClientContext,
    ) -> None:
        """Eqs. 4 and 5 on the received models, then local training from the result."""
        clients, models = list(received_extras["clients"]), received_extras["models"]
        self._turn = {"weights": torch.zeros(len(clients), dtype=torch.float32)}
        if not models:
            return
        if self.split == "val":
            loader = client.eval_dataloader("val")
            if loader is None or client.num_examples("val") == 0:
                raise DataError(
                    f"FedFomo: client {client_id!r} has no validation split to weigh the other clients' "
                    "models on; give every client one, or set strategy.init_args.split: train."
                )
        else:
            loader = client.train_dataloader("fedfomo", server_round, client_id)
        live = dict(pl_module.named_parameters())
        names = list(next(iter(models.values())))
        own = {n: live[n].detach().clone() for n in names}
        own_loss = self.validation_loss(pl_module, loader, client)
        losses, distances, others = [], [], []
        for model in models.values():
            other = {n: model[n].to(own[n].device, own[n].dtype) for n in names}
            with torch.no_grad():
                for n in names:
                    live[n].copy_(other[n])
            losses.append(self.validation_loss(pl_module, loader, client))
            distances.append(sum(float((other[n].double() - own[n].double()).pow(2).sum()) for n in names) ** 0.5)
            others.append(other)
        weights = fomo_weights(own_loss, losses, distances)
        new = fomo_update(own, others, weights)
        with torch.no_grad():
            for n in names:
                live[n].copy_(new[n])
        for j, w in zip(models, weights.tolist(), strict=True):
            self._turn["weights"][clients.index(j)] = w

    def on_client_fit_end(self, update: ClientUpdate) -> None:
        """Upload the client's ``w_n`` (a vector over every client, 0 for the models it did not receive)."""
        if self._turn:
            update.extras[EXTRAS_KEY] = self._turn["weights"]
            self._turn = {}

    @override
    def expected_upload_extras(self, client_id: str) -> dict[str, Any]:
        """The weight vector (one float32 per client)."""
        return {EXTRAS_KEY: torch.zeros(len(self.client_ids), dtype=torch.float32)}
