"""Pure tensor math of the strategies, written once and tested on its own (being moved: the generic aggregation
math is in :mod:`fedlit.strategies.aggregate`, each algorithm's own math in its file).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from fedlit.strategies.aggregate import (  # noqa: F401  (re-exported until every strategy imports them from there)
    State,
    normalized_weights,
    pairwise_squared_distances,
    weighted_average,
)
from fedlit.strategies.aggregate import common_keys as _common_keys


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
