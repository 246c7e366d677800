"""LG-FedAvg: local representations, global head.

Liang, Liu, Ziyin, Allen, Auerbach, Brent, Salakhutdinov, Morency. "Think Locally, Act Globally: Federated Learning
with Local and Global Representations." arXiv 2020 (NeurIPS 2019 Workshop on Federated Learning).
https://arxiv.org/abs/2001.01523

Each client m keeps a local representation ``h_m(.; theta^l_m)`` and all share the global model on top,
``g(.; theta^g)``; the prediction is ``g(h_m(x; theta^l_m); theta^g)`` (Sec. 3). Algorithm 1: each selected client
trains ``(theta^l_m, theta^g)`` on its own loss and uploads ``theta^g_m`` only; the server averages the global
layers as FedAvg does, ``theta^g <- sum_m (n_m / n) theta^g_m``, and ``theta^l_m`` never leaves
client m. It is FedPer (:mod:`fedlit.strategies.fedper`) turned around: there the head is personal, here it is
the one thing shared.

Symbols -> code: ``theta^g`` -> the tensors matched by ``head`` (``head.*``: the classifier of
:class:`~fedlit.tasks.ClassificationModule`), ``shared``; ``theta^l_m`` -> every other trainable tensor
(the backbone, its normalization statistics included), made ``personal``; ``n_m`` -> ``update.num_examples``.

Deviations and choices:

- The paper's global model is the top layers of the network (how many is chosen per experiment); PFLlib
  (``LG-FedAvg``) shares the model's ``head`` only and keeps the ``base`` local, as fedlit does by default; a
  wider ``head`` glob makes more layers global.
- The authors' code starts LG-FedAvg from a model trained with FedAvg and averages the global layers uniformly
  over the selected clients; PFLlib starts from the random initialization and weighs by training samples. fedlit
  follows PFLlib (``weighting="uniform"`` gives the authors' mean; to start from a FedAvg model, give the model
  those weights).
"""

from __future__ import annotations

from typing_extensions import override

from fedlit.core.roles import ParameterRoles
from fedlit.strategies.fedper import FedPer, head_names


class LGFedAvg(FedPer):
    """FedAvg on the head (global layers); the representation (everything else that trains) stays personal.

    Args:
        head: Glob (or ``re:<regex>``) of the global layers' names (default ``head.*``: the classifier).
        weighting: As in :class:`~fedlit.strategies.fedavg.FedAvg`.
        aggregator: As in :class:`~fedlit.strategies.fedavg.FedAvg` (default: the weighted mean).
    """

    fusable = True

    @override
    def configure_roles(self, roles: ParameterRoles) -> ParameterRoles:
        """The head's trainable tensors become ``shared``, every other trainable tensor ``personal``."""
        head = set(head_names(roles, self.head_rule, type(self).__name__))
        return roles.with_roles({n: "shared" if n in head else "personal" for n, r in roles.items() if r != "frozen"})
