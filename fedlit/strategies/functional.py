"""Pure tensor math of the strategies, written once and tested on its own (being moved: the generic aggregation
math is in :mod:`fedlit.strategies.aggregate`, each algorithm's own math in its file).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import Tensor

from fedlit.strategies.aggregate import (  # noqa: F401  (re-exported until every strategy imports them from there)
    State,
    normalized_weights,
    pairwise_squared_distances,
    weighted_average,
)
from fedlit.strategies.aggregate import cast_like as _cast_like
from fedlit.strategies.aggregate import common_keys as _common_keys


def simplex_projection(v: Tensor) -> Tensor:
    """The Euclidean projection of ``v`` onto the probability simplex ``{w : w >= 0, sum w = 1}``.

    The exact sort-based algorithm (Duchi, Shalev-Shwartz, Singer, Chandra. "Efficient Projections onto the
    l1-Ball for Learning in High Dimensions." ICML 2008, Fig. 1; Held, Wolfe, Crowder 1974): sort ``u`` descending,
    ``rho = max{j : u_j - (sum_{r<=j} u_r - 1) / j > 0}``, ``theta = (sum_{r<=rho} u_r - 1) / rho``,
    ``w = max(v - theta, 0)``. Computed in float64.
    """
    v = v.to(torch.float64).reshape(-1)
    if v.numel() == 0 or not torch.isfinite(v).all():
        raise ValueError(f"simplex_projection needs a non-empty finite vector, got {v.tolist()}.")
    u = torch.sort(v, descending=True).values
    cumsum = torch.cumsum(u, 0)
    j = torch.arange(1, len(u) + 1, dtype=torch.float64)
    rho = int(torch.nonzero(u - (cumsum - 1) / j > 0).max()) + 1
    theta = (cumsum[rho - 1] - 1) / rho
    return torch.clamp(v - theta, min=0)


def sgca_weights(distances: Tensor, sizes: Sequence[float], alpha: float, *, normalize: bool = False,
                 literal_eq7: bool = False) -> Tensor:
    """FedSCA's per-client aggregation weights (SGCA, Eq. 7), one row per client.

    FedSCA: "FedSCA: Federated Tuning with Similarity-guided Collaborative Aggregation for Heterogeneous Medical
    Image Segmentation" (arXiv 2025), Eq. 7, corrected as in pFedGraph (Ye, Ni, Wu, Wang, Chen, Wang.
    "Personalized Federated Learning with Inferred Collaboration Graphs." ICML 2023):

        W_i = argmin_{w in simplex} sum_j (w_j - m_j)^2 + alpha sum_j w_j d_ij = Proj_simplex(m - (alpha / 2) d_i)

    (complete the square: the objective is ``||w - (m - alpha d_i / 2)||^2`` plus a constant).

    Args:
        distances: ``(N, N)`` distances ``d_ij = ||Theta_i - Theta_j||_2`` between the clients' uploads.
        sizes: ``n_j``, the clients' training examples; ``m_j = n_j / sum n``.
        alpha: Weight of the distance penalty (>= 0).
        normalize: Divide the distances by their mean off-diagonal value first (when it is > 0), making ``alpha``
            independent of the scale of the weights.
        literal_eq7: The paper's Eq. 7 as printed: the prior ``m_i`` (the client's own share, for every j) and a
            minus sign on the distance term, i.e. ``W_i = Proj_simplex(m_i 1 + (alpha / 2) d_i)``.

    Returns:
        ``(N, N)`` float64 weights; row ``i`` is on the simplex.
    """
    d = torch.as_tensor(distances, dtype=torch.float64)
    n = d.shape[0]
    if d.shape != (n, n):
        raise ValueError(f"sgca_weights needs an (N, N) distance matrix, got shape {tuple(d.shape)}.")
    if alpha < 0:
        raise ValueError(f"sgca_weights: alpha={alpha} must be >= 0.")
    m = normalized_weights(sizes)
    if len(m) != n:
        raise ValueError(f"{n} clients in the distances but {len(m)} sizes.")
    if normalize and n > 1:
        mean = d[~torch.eye(n, dtype=torch.bool)].mean()
        if mean > 0:
            d = d / mean
    rows = []
    for i in range(n):
        target = m[i].expand(n) + alpha / 2 * d[i] if literal_eq7 else m - alpha / 2 * d[i]
        rows.append(simplex_projection(target))
    return torch.stack(rows)


def flat_distances(states: Sequence[State]) -> Tensor:
    """``(N, N)`` float64 Euclidean distances ``||Theta_i - Theta_j||_2`` over all tensors of the states."""
    return pairwise_squared_distances(states).clamp(min=0).sqrt()


def cosine_regularizer(params: Mapping[str, Tensor], target: Mapping[str, Tensor], eps: float = 1e-8) -> Tensor:
    """FedSCA's client regularizer ``-cos(Theta_i, Theta_target)`` over the concatenation of ``params``' tensors
    (FedSCA, arXiv 2025: the client loss is the segmentation loss plus beta times this). Differentiable in
    ``params``; ``eps`` keeps a zero vector finite (its cosine is 0)."""
    if not params:
        raise ValueError("cosine_regularizer of an empty set of tensors.")
    a = torch.cat([p.reshape(-1) for p in params.values()])
    b = torch.cat([target[n].to(p.device, p.dtype).reshape(-1) for n, p in params.items()])
    return -torch.nn.functional.cosine_similarity(a, b, dim=0, eps=eps)


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
        out[key] = _cast_like(acc, ref)
    return out


def random_allocation(num_blocks: int, count: int, generator: torch.Generator) -> list[int]:
    """``count`` distinct block indices of ``range(num_blocks)`` drawn uniformly without replacement from
    ``generator``, sorted (one row of FedRA's allocation matrix)."""
    if not 1 <= count <= num_blocks:
        raise ValueError(f"Cannot allocate {count} of {num_blocks} blocks: give 1 <= count <= {num_blocks}.")
    return sorted(torch.randperm(num_blocks, generator=generator)[:count].tolist())


def heal_consistency_mask(
    update: State, history: State | None, count: int, tau: float
) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """One client's parameter-update-consistency mask and its new sign history (FedHEAL, FPHL).

    ``history`` holds, per coordinate, the fraction of the client's ``count`` previous updates that were >= 0.
    The consistency of the current update ``u`` is that fraction where ``u >= 0`` and one minus it where ``u < 0``
    (the share of past updates with the same sign); ``mask = consistency > tau``. The history then takes ``u`` in:
    ``(history * count + [u >= 0]) / (count + 1)``. With no history (``history`` None or ``count`` 0) the mask is
    all ones and the history is ``[u >= 0]``.

    Returns:
        ``(mask, new_history)``, float64 tensors of 0s and 1s / fractions, per tensor of ``update``.
    """
    if count < 0:
        raise ValueError(f"count={count} must be >= 0.")
    positive = {n: (u >= 0).to(torch.float64) for n, u in update.items()}
    if history is None or count == 0:
        return {n: torch.ones_like(p) for n, p in positive.items()}, positive
    mask, new_history = {}, {}
    for name, pos in positive.items():
        h = history[name].to(pos.device, torch.float64)
        consistency = torch.where(pos > 0, h, 1 - h)
        mask[name] = (consistency > tau).to(torch.float64)
        new_history[name] = (h * count + pos) / (count + 1)
    return mask, new_history


def heal_weights(
    distances: Sequence[float], previous: Sequence[float], previous_delta: Sequence[float], beta: float,
    total: float | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """FedHEAL's aggregation weights with momentum (FAEL):

        dw_k = (1 - beta) dw_k_prev + beta d_k / D,   w_k = w_k_prev + dw_k,   p_k = w_k / sum_j w_j

    over the round's clients, ``D = total`` or, when None, ``sum_j d_j`` over them. Where ``D`` is 0 the distance
    term is 0 (no client moved).

    Returns:
        ``(p, w, dw)``, float64: the normalized weights, and the unnormalized ``w_k`` and ``dw_k`` to keep.
    """
    d = torch.as_tensor(list(distances), dtype=torch.float64)
    w_prev = torch.as_tensor(list(previous), dtype=torch.float64)
    dw_prev = torch.as_tensor(list(previous_delta), dtype=torch.float64)
    if not len(d) == len(w_prev) == len(dw_prev) or len(d) == 0:
        raise ValueError(f"heal_weights needs as many distances ({len(d)}), weights ({len(w_prev)}) and increments "
                         f"({len(dw_prev)}) as clients, at least one.")
    if (d < 0).any() or not torch.isfinite(d).all():
        raise ValueError(f"Distances must be finite and >= 0, got {d.tolist()}.")
    denominator = float(d.sum()) if total is None else float(total)
    share = d / denominator if denominator > 0 else torch.zeros_like(d)
    dw = (1 - beta) * dw_prev + beta * share
    w = w_prev + dw
    return normalized_weights(w.tolist()), w, dw


def heal_aggregate(
    reference: State, updates: Sequence[State], masks: Sequence[State], weights: Sequence[float]
) -> dict[str, Tensor]:
    """``theta_g - sum_k q_k * (u_k * m_k)`` per tensor of ``reference``, elementwise, with
    ``q_k = p_k m_k / sum_j p_j m_j`` where some client's mask is 1 and ``q_k = p_k`` where every mask is 0
    (FedHEAL's masked aggregation; ``u_k = theta_g - theta_k``, ``p`` the normalized ``weights``).

    Float64 inside, cast back to each tensor's dtype (integer tensors rounded).
    """
    if not (len(updates) == len(masks) == len(weights)):
        raise ValueError(f"{len(updates)} updates, {len(masks)} masks and {len(weights)} weights.")
    p = normalized_weights(weights)
    out = {}
    for key, ref in reference.items():
        u = torch.stack([s[key].to(ref.device, torch.float64) for s in updates])
        m = torch.stack([s[key].to(ref.device, torch.float64) for s in masks])
        pk = p.to(ref.device).view(-1, *([1] * ref.dim()))
        adjusted = pk * m
        total = adjusted.sum(0, keepdim=True)
        q = torch.where(total == 0, pk.expand_as(m), adjusted / torch.where(total == 0, 1.0, total))
        out[key] = _cast_like(ref.to(torch.float64) - (q * u * m).sum(0), ref)
    return out


def state_dot(a: State, b: State) -> Tensor:
    """``sum_k <a_k, b_k>`` over the keys of ``a``, a float64 scalar (on ``a``'s first tensor's device)."""
    if not a:
        raise ValueError("state_dot of an empty set of tensors.")
    device = next(iter(a.values())).device
    terms = [(t.detach().to(torch.float64) * b[n].detach().to(device, torch.float64)).sum() for n, t in a.items()]
    return torch.stack(terms).sum()


def pgfed_auxiliary_gradient(grads: Sequence[State], coefficients: Sequence[float], mu: float) -> dict[str, Tensor]:
    """``mu * sum_j a_j grad_j`` per tensor (PGFed: the gradient of client i's weighted first-order approximations
    of the other clients' risks), accumulated in float64 and cast back to the dtype of ``grads[0]``. The
    coefficients are used as given (not normalized: PGFed's ``a_ij`` are only kept >= 0); ``a_j = 1 / M`` for all
    j gives the mean gradient ``gbar`` clients receive."""
    if len(grads) != len(coefficients):
        raise ValueError(f"{len(grads)} gradients but {len(coefficients)} coefficients.")
    keys = _common_keys(grads)
    out = {}
    for key in keys:
        ref = grads[0][key]
        acc = torch.zeros(ref.shape, dtype=torch.float64, device=ref.device)
        for a, grad in zip(coefficients, grads, strict=True):
            acc += float(a) * grad[key].to(ref.device, torch.float64)
        out[key] = (mu * acc).to(ref.dtype)
    return out


def pgfed_coefficient_step(a: Tensor, mu_losses: Tensor, theta_dot_gbar: Tensor | float, lam: float) -> Tensor:
    """``a_ij <- max(0, a_ij - lam (mu l_j + <theta_i, gbar>))`` for every j at once (PGFed's projected gradient
    step on client i's coefficients, the other clients' gradients replaced by their mean ``gbar`` as in the
    authors' code). Float64."""
    step = mu_losses.to(torch.float64) + torch.as_tensor(theta_dot_gbar, dtype=torch.float64)
    return (a.to(torch.float64) - lam * step).clamp_min(0.0)


def pgfed_risk_offset(mean_loss: float, grad: State, theta: State) -> Tensor:
    """``l_i = f_i(theta_i) - <grad f_i(theta_i), theta_i>``: the constant of client i's first-order risk
    approximation ``f_i(theta) ~ l_i + <grad f_i(theta_i), theta>`` (PGFed). Float64 scalar."""
    return torch.as_tensor(mean_loss, dtype=torch.float64) - state_dot(grad, theta).cpu()


def momentum_mix(new: State, previous: State | None, beta: float) -> dict[str, Tensor]:
    """``(1 - beta) new + beta previous`` per tensor of ``new`` (PGFedMo's gradient correction); ``new`` itself
    (copied) when there is no ``previous``. Computed in float64, cast back to ``new``'s dtypes."""
    if previous is None:
        return {n: t.clone() for n, t in new.items()}
    return {n: ((1 - beta) * t.to(torch.float64) + beta * previous[n].to(t.device, torch.float64)).to(t.dtype)
            for n, t in new.items()}


def mean_tensor_distances(states: Sequence[State], names: Sequence[str]) -> Tensor:
    """``(N, N)`` float64 ``dbar_ij = mean over l in names of ||X_i^l - X_j^l||_F``: the Frobenius distance per
    tensor, then the mean over tensors (EPFL's distance between clients' LoRA B matrices, FHBench, arXiv 2025)."""
    if not names:
        raise ValueError("mean_tensor_distances needs at least one tensor name.")
    n = len(states)
    out = torch.zeros(n, n, dtype=torch.float64)
    for name in names:
        flat = torch.stack([s[name].detach().to("cpu", torch.float64).reshape(-1) for s in states])
        # Exact differences (no matrix-product shortcut): identical tensors must be at distance exactly 0.
        out += torch.cdist(flat, flat, compute_mode="donot_use_mm_for_euclid_dist")
    out /= len(names)
    out.fill_diagonal_(0.0)
    return out


def epfl_weights(distances: Tensor, lam: float = 0.5, eps: float = 0.0) -> Tensor:
    """EPFL's mixing matrix (FHBench, arXiv 2025) from the clients' mean distances ``dbar``:

        s^_ij = (1 / dbar_ij) / sum_{k != i} (1 / dbar_ik),   s_ij = (1 - lam) s^_ij (j != i),   s_ii = lam.

    A zero distance (identical matrices, e.g. every B still at 0 in round 1) would divide by zero. With
    ``eps > 0`` the similarity is ``1 / (dbar + eps)``; with ``eps = 0`` a zero distance is the maximum similarity,
    the limit of ``s^`` as that distance goes to 0: the clients at distance 0 from ``i`` share ``1 - lam`` equally
    and the others get 0. A single client keeps its own value (``s_11 = 1``).

    Args:
        distances: ``(N, N)`` non-negative distances (the diagonal is ignored).
        lam: The weight of the client's own value, in [0, 1].
        eps: Added to every distance before inverting; >= 0.

    Returns:
        ``(N, N)`` float64; row ``i`` holds client i's weights, summing to 1.
    """
    d = torch.as_tensor(distances, dtype=torch.float64)
    n = d.shape[0]
    if d.ndim != 2 or d.shape != (n, n):
        raise ValueError(f"epfl_weights needs an (N, N) distance matrix, got shape {tuple(d.shape)}.")
    if not 0 <= lam <= 1:
        raise ValueError(f"epfl_weights: lam={lam} must be in [0, 1].")
    if eps < 0:
        raise ValueError(f"epfl_weights: eps={eps} must be >= 0.")
    off = ~torch.eye(n, dtype=torch.bool)
    if not torch.isfinite(d[off]).all() or (d[off] < 0).any():
        raise ValueError(f"epfl_weights: distances must be finite and >= 0, got {d.tolist()}.")
    if n == 1:
        return torch.ones(1, 1, dtype=torch.float64)
    if eps > 0:
        similarity = 1.0 / (d + eps)
    else:
        zero = (d == 0) & off
        similarity = torch.where(zero.any(dim=1, keepdim=True), zero.to(torch.float64), 1.0 / d)
    similarity = torch.where(off, similarity, torch.zeros_like(similarity))
    weights = (1 - lam) * similarity / similarity.sum(dim=1, keepdim=True)
    return weights + lam * torch.eye(n, dtype=torch.float64)


def apple_mix(p: Tensor, cores: Sequence[Tensor]) -> Tensor:
    """APPLE's personalized tensor ``sum_j p_j core_j`` (the same coefficient for a layer's weights and biases).

    Differentiable in ``p`` and in every core that requires a gradient (APPLE trains the client's own core and
    ``p``; the other cores enter as constants). ``p`` is cast to the cores' dtype.

    Args:
        p: ``(N,)`` directed-relationship vector (unconstrained: neither non-negative nor summing to 1).
        cores: N tensors of one shape, ``cores[j]`` from client j's core model.
    """
    if p.ndim != 1 or p.shape[0] != len(cores) or not cores:
        raise ValueError(f"apple_mix needs one coefficient per core: p has shape {tuple(p.shape)}, "
                         f"{len(cores)} cores.")
    weights = p.to(cores[0].dtype)
    out = weights[0] * cores[0]
    for j in range(1, len(cores)):
        out = out + weights[j] * cores[j]
    return out


def apple_proximal_coefficient(round_index: int, decay_rounds: int, mu: float, schedule: str = "exponential",
                               eps: float = 1e-3) -> float:
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


def apple_download_choice(p: Tensor, own: int, touched: Tensor, limit: int, round_index: int,
                          generator: torch.Generator, *, lamb: float = 1.0, thresh: float = 1.5) -> list[int]:
    """The ``limit`` other cores client ``own`` downloads under APPLE's bandwidth limit, sorted.

    Cores it has never downloaded (``touched[j]`` False) come first, drawn uniformly if there are more than
    ``limit``; the remaining places are drawn without replacement among the other cores with probability
    proportional to ``base^|p_j|``, ``base = max(thresh, lamb * r * limit / N)`` (``r`` the round, counted from 0):
    a core the client relies on more is refreshed more often, and ``base`` grows with the rounds.

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


def fourier_ratio(server_round: int, rounds: int, start: float, end: float) -> float:
    """PRR-FL's cumulative ratio ``L`` of round ``t`` (from 1) of ``R``: ``L_t = start + (t - 1) / R * (end - start)``,
    the authors' linear schedule (round 1 uses ``start``; ``end`` would be reached after round ``R``)."""
    if rounds < 1 or server_round < 1:
        raise ValueError(f"fourier_ratio needs server_round >= 1 and rounds >= 1, got {server_round} and {rounds}.")
    return start + (server_round - 1) / rounds * (end - start)


def fourier_matrix(weight: Tensor) -> Tensor:
    """The 2-D matrix PRR-FL transforms: a conv weight ``(O, C, k1, k2)`` as ``(C k1, k2 O)`` (``permute(1, 2, 3,
    0)`` then ``reshape``), a 2-D weight as it is."""
    if weight.ndim == 4:
        out_ch, in_ch, k1, k2 = weight.shape
        return weight.permute(1, 2, 3, 0).reshape(in_ch * k1, k2 * out_ch)
    if weight.ndim == 2:
        return weight
    raise ValueError(f"fourier_matrix takes a 2-D or 4-D weight, got shape {tuple(weight.shape)}.")


def fourier_unmatrix(matrix: Tensor, shape: Sequence[int]) -> Tensor:
    """The inverse of :func:`fourier_matrix` for a weight of ``shape``."""
    if len(shape) == 4:
        out_ch, in_ch, k1, k2 = shape
        return matrix.reshape(in_ch, k1, k2, out_ch).permute(3, 0, 1, 2)
    return matrix.reshape(tuple(shape))


def cumulative_fourier_average(tensors: Sequence[Tensor], weights: Sequence[float], ratio: float) -> list[Tensor]:
    """PRR-FL's Cumulative Fourier Aggregation of one weight held by several clients (Chen et al., MICCAI 2021).

    Each client's weight ``W_i`` (a conv weight through :func:`fourier_matrix`) is transformed, ``F_i = fft2(W_i)``;
    in the centred (``fftshift``-ed) amplitude spectrum, the box of rows ``[c_h - b_h, c_h + b_h)`` and columns
    ``[c_w - b_w, c_w + b_w)``, with ``c = floor(size / 2)`` and ``b = floor(size * ratio / 2)``, takes the weighted
    mean of the clients' amplitudes; outside the box, and for the phase everywhere, each client keeps its own:
    ``W'_i = Re(ifft2(ifftshift(A'_i) e^{i phase(F_i)}))``, reshaped back. ``ratio = 0`` (an empty box) returns each
    client's weight; a ratio of 1 on even sizes averages every amplitude.

    Args:
        tensors: The clients' values of one weight, all of one 2-D or 4-D shape.
        weights: One non-negative weight per client (normalized here).
        ratio: ``L`` in [0, 1].

    Returns:
        One tensor per client, in order, with the input's dtype, device and shape (computed in float64).
    """
    if len(tensors) != len(weights):
        raise ValueError(f"{len(tensors)} tensors but {len(weights)} weights.")
    if not 0 <= ratio <= 1:
        raise ValueError(f"cumulative_fourier_average: ratio={ratio} must be in [0, 1].")
    w = normalized_weights(weights)
    shape = tensors[0].shape
    if any(t.shape != shape for t in tensors):
        raise ValueError(f"cumulative_fourier_average: shapes differ: {[tuple(t.shape) for t in tensors]}.")
    spectra = [torch.fft.fft2(fourier_matrix(t.detach().to(torch.float64))) for t in tensors]
    amplitudes = [torch.fft.fftshift(s.abs()) for s in spectra]
    mean = torch.zeros_like(amplitudes[0])
    for wi, amplitude in zip(w, amplitudes, strict=True):
        mean += wi.item() * amplitude
    h, wd = mean.shape
    bh, bw = int(h * ratio / 2), int(wd * ratio / 2)  # floor: both are >= 0
    rows, cols = slice(h // 2 - bh, h // 2 + bh), slice(wd // 2 - bw, wd // 2 + bw)
    out = []
    for tensor, spectrum, amplitude in zip(tensors, spectra, amplitudes, strict=True):
        mixed = amplitude.clone()
        mixed[rows, cols] = mean[rows, cols]
        back = torch.fft.ifft2(torch.fft.ifftshift(mixed) * torch.exp(1j * spectrum.angle())).real
        out.append(fourier_unmatrix(back, shape).to(tensor.dtype).contiguous())
    return out


def distillation_kl(student_logits: Tensor, teacher_logits: Tensor) -> Tensor:
    """``KL(p_teacher || p_student)`` averaged over the batch, no temperature, the teacher detached:
    ``(1 / B) sum_b sum_c p_t (log p_t - log p_s)`` with ``p = softmax(logits)`` over the last dimension, as
    ``torch.nn.functional.kl_div(log_softmax(student), softmax(teacher), reduction="batchmean")``."""
    log_student = torch.log_softmax(student_logits.float(), dim=-1)
    teacher = torch.softmax(teacher_logits.detach().float(), dim=-1)
    return torch.nn.functional.kl_div(log_student, teacher, reduction="batchmean")


def prr_stage(previous: int, f1_deputy: float, f1_personal: float, alpha1: float, alpha2: float) -> int:
    """The next collaborative-transfer stage of PRR-FL, decided before a local epoch from macro-F1 of both models.

    ``previous`` is 0 when no stage was chosen yet (then Retrieve, whatever the scores), otherwise the last stage.
    Retrieve (1) while ``f1_deputy < alpha1 f1_personal``; else Reciprocate (2) after Retrieve, or after
    Reciprocate/Refine while ``f1_deputy < alpha2 f1_personal``; else Refine (3). Stages move 1 -> 2 -> 3 one at a
    time and fall back to 1 or 2 when the deputy drops, as in the authors' code.
    """
    if previous == 0 or f1_deputy < alpha1 * f1_personal:
        return RETRIEVE
    if previous == RETRIEVE or f1_deputy < alpha2 * f1_personal:
        return RECIPROCATE
    return REFINE


def prr_losses(stage: int, ce_personal: Tensor, ce_deputy: Tensor, logits_personal: Tensor,
               logits_deputy: Tensor) -> tuple[Tensor, Tensor]:
    """The personal and deputy losses of a PRR-FL stage (each KL toward a detached teacher, see
    :func:`distillation_kl`): Retrieve: ``CE_p``, ``CE_d + KL(p_p || p_d)`` (the deputy learns from the personal
    model); Reciprocate: ``CE_p + KL(p_d || p_p)``, ``CE_d + KL(p_p || p_d)``; Refine: ``CE_p + KL(p_d || p_p)``,
    ``CE_d``."""
    if stage not in (RETRIEVE, RECIPROCATE, REFINE):
        raise ValueError(f"prr_losses: stage={stage} is not 1 (Retrieve), 2 (Reciprocate) or 3 (Refine).")
    personal, deputy = ce_personal, ce_deputy
    if stage in (RECIPROCATE, REFINE):
        personal = personal + distillation_kl(logits_personal, logits_deputy)
    if stage in (RETRIEVE, RECIPROCATE):
        deputy = deputy + distillation_kl(logits_deputy, logits_personal)
    return personal, deputy


#: PRR-FL's collaborative transfer stages.
RETRIEVE, RECIPROCATE, REFINE = 1, 2, 3
