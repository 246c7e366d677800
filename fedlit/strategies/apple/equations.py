"""APPLE's math as pure functions: the mix of the cores, the proximal pull of ``p`` and its schedule, the
bandwidth-limited draw, and each core's own initialization.

Luo, Wu. "Adapt to Adaptation: Learning Personalization for Cross-Silo Federated Learning." IJCAI 2022. The
algorithm, the map from the paper's symbols and the deviations are in :mod:`fedlit.strategies.apple`, whose strategy
calls these; they are apart from it only to keep that file under 400 lines.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence

import torch
from torch import Tensor, nn


@contextlib.contextmanager
def swapped_parameters(module: nn.Module, tensors: Mapping[str, Tensor]) -> Iterator[None]:
    """Inside the block, ``module``'s parameters named in ``tensors`` are those tensors (which may be functions of
    the parameters, so autograd reaches them); the parameters are put back on exit, in their order. This is the
    swap ``torch.func.functional_call`` makes, kept open around a whole ``training_step``."""
    replaced = []
    try:
        for name, tensor in tensors.items():
            prefix, _, attr = name.rpartition(".")
            owner = module.get_submodule(prefix) if prefix else module
            replaced.append((owner, attr, owner._parameters[attr]))
            # a computed tensor stands in for the parameter while swapped (as torch.func.functional_call does)
            owner._parameters[attr] = tensor  # type: ignore[assignment]
        yield
    finally:
        for owner, attr, original in reversed(replaced):
            owner._parameters[attr] = original


def apple_mix(p: Tensor, cores: Sequence[Tensor]) -> Tensor:
    """APPLE's personalized tensor ``sum_j p_j core_j`` (the same coefficient for a layer's weights and biases).

    Differentiable in ``p`` and in every core that requires a gradient (APPLE trains the client's own core and
    ``p``; the other cores enter as constants). ``p`` is cast to the cores' dtype.

    Args:
        p: ``(N,)`` directed-relationship vector (unconstrained: neither non-negative nor summing to 1).
        cores: N tensors of one shape, ``cores[j]`` from client j's core model.
    """
    if p.ndim != 1 or p.shape[0] != len(cores) or not cores:
        raise ValueError(f"apple_mix needs one coefficient per core: p has shape {tuple(p.shape)}, {len(cores)} cores.")
    weights = p.to(cores[0].dtype)
    out = weights[0] * cores[0]
    for j in range(1, len(cores)):
        out = out + weights[j] * cores[j]
    return out


def apple_proximal_coefficient(
    round_index: int, decay_rounds: int, mu: float, schedule: str = "exponential", eps: float = 1e-3
) -> float:
    """APPLE's weight ``coef(r)`` of ``||p - p0||^2`` in round ``r`` (counted from 0): ``mu eps^(r / R_d)``
    (``exponential``) or ``mu (cos(pi r / R_d) + 1) / 2`` (``cosine``) while ``r < R_d``, 0 from ``R_d`` on (and
    for ``mu = 0``)."""
    if schedule not in ("exponential", "cosine"):
        raise ValueError(f"apple_proximal_coefficient: schedule={schedule!r} is not 'exponential' or 'cosine'.")
    if mu == 0 or round_index >= decay_rounds:
        return 0.0
    if schedule == "cosine":
        phase = torch.tensor(torch.pi * round_index / decay_rounds, dtype=torch.float64)
        return float(mu * (torch.cos(phase) + 1) / 2)
    return float(mu * eps ** (round_index / decay_rounds))


def apple_proximal(p: Tensor, p0: Tensor, coef: float) -> Tensor:
    """``coef * ||p - p0||_2^2`` (APPLE's pull of the directed relationships towards the sample shares ``p0``)."""
    return coef * (p - p0.to(p.device, p.dtype)).pow(2).sum()


def apple_download_choice(
    p: Tensor,
    own: int,
    touched: Tensor,
    limit: int,
    round_index: int,
    generator: torch.Generator,
    *,
    lamb: float = 1.0,
    thresh: float = 1.5,
) -> list[int]:
    """The ``limit`` other cores client ``own`` downloads under APPLE's bandwidth limit, sorted.

    The module docstring's draw: cores never downloaded (``touched[j]`` False) first, uniformly; the other places
    without replacement with probability proportional to ``base^|p_j|``, ``base = max(thresh, lamb r limit / N)``.

    Args:
        p: ``(N,)`` the client's directed relationships.
        own: The client's index (never drawn: it holds its own core).
        touched: ``(N,)`` bool, the cores it has downloaded before.
        limit: ``M``, between 1 and ``N - 1``.
        round_index: ``r``.
        generator: The random stream of the draw.
    """
    n = p.shape[0]
    if not 1 <= limit <= n - 1:
        raise ValueError(f"apple_download_choice: limit={limit} must be in [1, N - 1] = [1, {n - 1}].")
    others = [j for j in range(n) if j != own]
    fresh = [j for j in others if not bool(touched[j])]
    if len(fresh) >= limit:
        order = torch.randperm(len(fresh), generator=generator)[:limit]
        return sorted(fresh[i] for i in order.tolist())
    candidates = [j for j in others if j not in fresh]
    base = max(thresh, lamb * round_index * limit / n)
    probs = torch.tensor([base ** abs(float(p[j])) for j in candidates], dtype=torch.float64)
    drawn = torch.multinomial(probs / probs.sum(), limit - len(fresh), replacement=False, generator=generator)
    return sorted(fresh + [candidates[i] for i in drawn.tolist()])


def reinitialized_parameters(module: nn.Module, names: Sequence[str], seed: int) -> tuple[dict[str, Tensor], list[str]]:
    """The parameters ``names`` of ``module`` as its own layers initialize them, drawn from ``seed``: APPLE's core
    of one client, which the authors' code builds as a fresh model of its own.

    Each layer owning one of ``names`` runs its ``reset_parameters()`` (PyTorch's default initialization of
    convolutions, linear and normalization layers) under ``torch.manual_seed(seed)``, in model order, with the
    global random state put back afterwards. A parameter whose initial values are all equal (a LoRA B at 0, a
    zero-initialized head, a norm's scale at 1) keeps them: the model chose that constant. The module is left
    exactly as it was.

    Returns:
        The new values (detached copies), and the names left at their initial values because their layer has no
        ``reset_parameters()`` or they are constant.
    """
    params = dict(module.named_parameters())
    owners: dict[str, nn.Module] = {}
    for name in names:
        prefix = name.rpartition(".")[0]
        owners.setdefault(prefix, module.get_submodule(prefix) if prefix else module)
    saved = {
        (prefix, n): t.detach().clone()
        for prefix, owner in owners.items()
        for n, t in [*owner.named_parameters(recurse=False), *owner.named_buffers(recurse=False)]
    }
    devices = sorted({t.device.index or 0 for t in saved.values() if t.device.type == "cuda"})
    try:
        with torch.random.fork_rng(devices=devices), torch.no_grad():
            torch.manual_seed(seed)
            for owner in owners.values():
                reset = getattr(owner, "reset_parameters", None)
                if callable(reset):
                    reset()
            drawn = {n: params[n].detach().clone() for n in names}
    finally:
        with torch.no_grad():
            for (prefix, n), value in saved.items():
                owner = owners[prefix]
                target = owner._parameters.get(n) if n in owner._parameters else owner._buffers.get(n)
                if target is not None:
                    target.copy_(value)
    kept = []
    for name in names:
        initial = params[name].detach()
        if torch.equal(drawn[name], initial) or (initial.numel() > 0 and bool((initial == initial.flatten()[0]).all())):
            drawn[name] = initial.clone()
            kept.append(name)
    return drawn, kept


def initial_cores(
    module: nn.Module,
    names: Sequence[str],
    initial: Mapping[str, Tensor],
    client_ids: Sequence[str],
    derive_seed: Callable[..., int],
) -> dict[str, dict[str, Tensor]]:
    """Every client's initial core under APPLE's ``core_init: own``: ``initial`` with the parameters ``names``
    re-drawn by :func:`reinitialized_parameters` from the seed ``derive_seed("apple-core", client_id)``, on
    ``initial``'s devices; a warning when none of ``names`` could be re-drawn (every core then starts equal)."""
    starts: dict[str, dict[str, Tensor]] = {}
    kept: list[str] = []
    for client_id in client_ids:
        drawn, kept = reinitialized_parameters(module, names, derive_seed("apple-core", client_id))
        starts[client_id] = {**initial, **{n: t.to(initial[n].device) for n, t in drawn.items()}}
    left = [n for n in kept if n in names]
    if len(left) == len(names) and names:
        warnings.warn(
            "APPLE core_init='own': no shared parameter could be re-initialized (constant, or their "
            "layers have no reset_parameters()): every core starts equal, as with core_init='shared'.",
            stacklevel=2,
        )
    return starts
