"""FedMetaMed's (PRR-FL's) math as pure functions: Cumulative Fourier Aggregation, the collaborative-transfer stages
and their distillation losses.

Chen, Zhu, Yang, Yuan. "Personalized Retrogress-Resilient Framework for Real-World Medical Federated Learning."
MICCAI 2021. The equations, the map from the paper's symbols and the deviations are in
:mod:`fedlit.strategies.fedmetamed`, whose strategy calls these; they are apart from it only to keep that file, whose
hooks are long, under 400 lines.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from fedlit.strategies.common.aggregate import normalized_weights


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


#: PRR-FL's collaborative transfer stages.
RETRIEVE, RECIPROCATE, REFINE = 1, 2, 3


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


def prr_losses(
    stage: int, ce_personal: Tensor, ce_deputy: Tensor, logits_personal: Tensor, logits_deputy: Tensor
) -> tuple[Tensor, Tensor]:
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
