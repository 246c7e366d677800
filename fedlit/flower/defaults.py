"""The federation settings a Flower deployment's server takes by default where a simulation's differ.

:data:`DEPLOYMENT_DEFAULTS` go on the server's command line before the recipe
(:func:`fedlit.flower.server.server_argv`), so the recipe's ``federation`` section and the run config's
``overrides`` still set them (``--federation.max_update_norm_vs_median null`` turns the bound off).

``federation.max_update_norm_vs_median: 10``: an update whose norm is over 10 times the median of the round's other
updates is rejected (:mod:`fedlit.engine.loop.screening`). 10 is from honest rounds of the recipes a deployment
runs (``python benchmarks/update_norms.py``: the quickstart with 2 and 4 sites, Fed-Heart-Disease with 2, 3 and 4
hospitals under FedAvg and FedProx, also with one pass over the data per round instead of 100 steps; 3 seeds,
every round: 945 client-rounds), where no client's update norm was over 4.15 times the median of its round's others
(that largest with one pass per round: Cleveland takes 50 steps, Switzerland 8; with equal steps at most 1.98;
docs/deployment.md gives the figures). 10 leaves more than twice that margin, while a scaled update (the 500x of a
patched node, or even 20x) is refused. Off in a simulation: a study may want its clients as they are.

``federation.max_client_weight`` stays off (None) by default: a fixed share cannot suit both 2 sites and 40 (with 2
sites the larger one weighs over 0.5 of every round, honestly), so the operator sets it, or gives the sites' train
sizes in the node registry (:mod:`fedlit.flower.registry`), which fixes them before round 1.
"""

from __future__ import annotations

#: ``--federation.<name> value`` pairs the server's run gets before its recipe.
DEPLOYMENT_DEFAULTS: tuple[tuple[str, str], ...] = (("max_update_norm_vs_median", "10"),)


def deployment_argv() -> list[str]:
    """:data:`DEPLOYMENT_DEFAULTS` as command-line options (placed before ``--config``: the recipe wins)."""
    return [arg for name, value in DEPLOYMENT_DEFAULTS for arg in (f"--federation.{name}", value)]
