"""CLIP prompt learning (CoOp) with an optional mixture-of-prompt-experts gate (pFedMoAP).

CoOp: Zhou, Yang, Loy, Liu. "Learning to Prompt for Vision-Language Models." IJCV 2022. A frozen CLIP classifies
an image by the cosine of its image feature with the text feature of each class's prompt
``[SOS] v_1 ... v_M <class name>. [EOS]``; the M context vectors ``v`` (shared by every class, initialized
N(0, 0.02^2)) are the only thing learned: ``logits = s cos(I, T)``, ``s`` CLIP's logit scale.

pFedMoAP's gate: Luo, Chen, Wu. "Mixture of Experts Made Personalized: Federated Prompt Learning for
Vision-Language Models." ICLR 2025. Given the text features of K - 1 non-local prompts ("experts", set by the
strategy with :meth:`CLIPPromptModule.set_experts`), an attention network mixes, per class, the local and non-local
text features for each image (:func:`moap_logits`)::

    pool(x) = x[..., ::D // d]                          (strided subsampling of the normalized features to d dims)
    Q_b = pool(I_b),  K_c = V_c = [pool(T_L,c), pool(T_1,c), ..., pool(T_{K-1},c)]
    o_bc = MHA(Q_b, K_c, V_c)                           (h heads; scores scaled by `gate_scale` instead of 1/sqrt)
    logits_bc = lam s cos(I_b, T_L,c) + s <pool(I_b), o_bc>

Without experts the logits are CoOp's (no ``lam``), as in the authors' code.
"""

from __future__ import annotations

from typing import Literal, cast

import torch
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from torch import Tensor, nn
from torch.nn import functional as F
from typing_extensions import override

from fedlit.core.errors import ConfigError, DataError
from fedlit.core.roles import RoleRule
from fedlit.models.clip import CLIP, CLIP_MEAN, CLIP_STD
from fedlit.module import FederatedModule
from fedlit.tasks.classification import ClassificationModule, build_metrics

__all__ = ["CLIPPromptModule", "gate_attention", "moap_logits", "strided_pool"]


def strided_pool(features: Tensor, dim: int) -> Tensor:
    """``features[..., ::D // dim]``: the authors' pooling of D-dimensional features to ``dim`` (D a multiple)."""
    return features[..., :: features.shape[-1] // dim]


def gate_attention(
    query: Tensor, keys: Tensor, attention: nn.MultiheadAttention, scale: float, dropout: float = 0.0
) -> Tensor:
    """Multi-head attention of every query over each class's experts, with the scores scaled by ``scale``.

    The parameters are those of ``attention`` (input and output projections); the scores are
    ``scale <q_h, k_h>`` (the authors' gate replaces ``1 / sqrt(d_h)`` by a scale, 10 by default).

    Args:
        query: (B, d) pooled image features.
        keys: (C, E, d) pooled text features of the E experts of each of the C classes (keys and values).
        attention: Holds ``in_proj_weight`` (3d, d), ``in_proj_bias``, ``out_proj`` and ``num_heads``.
        scale: The score scale.
        dropout: Dropout on the attention weights (training only: pass 0 in evaluation).

    Returns:
        (B, C, d): for image b and class c, the mix of class c's experts.
    """
    heads, d = attention.num_heads, query.shape[-1]
    w_q, w_k, w_v = attention.in_proj_weight.chunk(3)
    b_q, b_k, b_v = attention.in_proj_bias.chunk(3)
    classes = keys.shape[0]
    q = F.linear(query, w_q, b_q).reshape(1, -1, heads, d // heads).transpose(1, 2).expand(classes, -1, -1, -1)
    k = F.linear(keys, w_k, b_k).reshape(classes, -1, heads, d // heads).transpose(1, 2)
    v = F.linear(keys, w_v, b_v).reshape(classes, -1, heads, d // heads).transpose(1, 2)
    mixed = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, scale=scale)  # (C, h, B, d_h)
    mixed = mixed.transpose(1, 2).reshape(classes, -1, d)
    return attention.out_proj(mixed).transpose(0, 1)


def moap_logits(
    image: Tensor,
    local_text: Tensor,
    expert_text: Tensor | None,
    logit_scale: Tensor,
    attention: nn.MultiheadAttention | None,
    *,
    dim: int,
    scale: float,
    lam: float,
    dropout: float = 0.0,
) -> Tensor:
    """pFedMoAP's logits (B, C) from raw image features (B, D), the local prompt's text features (C, D) and the
    experts' normalized, pooled text features (E, C, dim) (None or E = 0: CoOp's logits ``s cos(I, T_L)``)."""
    image = F.normalize(image, dim=-1)
    local_text = F.normalize(local_text, dim=-1)
    local = logit_scale * image @ local_text.t()
    if expert_text is None or len(expert_text) == 0:
        return local
    keys = torch.cat([strided_pool(local_text, dim).unsqueeze(0), expert_text.to(local_text.dtype)]).transpose(0, 1)
    if attention is None:
        raise ValueError("moap_logits: expert_text needs the gate's attention (got attention=None)")
    query = strided_pool(image, dim)
    mixed = gate_attention(query, keys, attention, scale, dropout)  # (B, C, d)
    return lam * local + logit_scale * (mixed * query.unsqueeze(1)).sum(-1)


class CLIPPromptModule(ClassificationModule):
    """A frozen CLIP with learned CoOp context vectors (``prompt.ctx``, shared) and, with ``gating``, pFedMoAP's
    attention gate (``gate.*``, personal); trained with cross-entropy (BCE on the two classes' logit difference
    for a binary task, which is the same loss), with :class:`~fedlit.tasks.ClassificationModule`'s metrics.

    Parameter names: ``clip.*`` (the CLIP model, frozen), ``prompt.ctx`` (M, width), ``gate.*`` (with ``gating``)
    and the int64 buffers ``prompt_ids`` and ``prompt_eos`` (frozen). Images (B, C, H, W): grey ones are repeated
    to RGB and all are resized to CLIP's input size (bilinear); ``pixel_norm: clip`` normalizes images in [0, 1]
    with CLIP's mean and standard deviation (leave ``none`` when the data normalizes them).

    Args:
        clip: The CLIP spec (:class:`~fedlit.models.CLIP`: a local folder or a tiny random config).
        class_names: The classes in label order, put into the prompts (``_`` read as a space). A binary task
            takes two: the negative class, then the positive one.
        task: ``multiclass`` or ``binary`` (one logit: the positive class's minus the negative's).
        num_context: M, the context tokens (16 in CoOp and pFedMoAP).
        context_std: Standard deviation of their initialization (0.02).
        gating: Add pFedMoAP's gate (used once experts are set).
        gate_dim: d, the dimension features are pooled to (128; CLIP's projection must be a multiple).
        gate_heads: Attention heads of the gate (8).
        gate_scale: The gate's score scale (10).
        gate_dropout: Dropout on the gate's attention weights in training (0, as the authors' code behaves: its
            gate takes a dropout of 0.1 but never applies it; 0.1 applies it).
        lam: The weight of the local prompt's logits beside the gate's (0.5).
        pixel_norm: ``clip`` or ``none`` (see above).
        in_channels: Channels of the input images: 3, or 1 (grey, repeated to RGB).
        roles, optimizer, lr, momentum, weight_decay, lr_scheduler, lr_scheduler_interval: As
            :class:`~fedlit.module.FederatedModule`.
    """

    accepted_tasks = frozenset({"multiclass", "binary"})
    prompt_ids: Tensor  # buffers registered by __init__
    prompt_eos: Tensor

    def __init__(
        self,
        *,
        clip: CLIP,
        class_names: list[str],
        task: Literal["multiclass", "binary"] = "multiclass",
        num_context: int = 16,
        context_std: float = 0.02,
        gating: bool = False,
        gate_dim: int = 128,
        gate_heads: int = 8,
        gate_scale: float = 10.0,
        gate_dropout: float = 0.0,
        lam: float = 0.5,
        pixel_norm: Literal["clip", "none"] = "none",
        in_channels: int = 3,
        roles: list[RoleRule] | None = None,
        optimizer: Literal["sgd", "adam", "adamw"] | OptimizerCallable = "sgd",
        lr: float = 0.002,
        momentum: float = 0.9,
        weight_decay: float = 0.0,
        lr_scheduler: LRSchedulerCallable | None = None,
        lr_scheduler_interval: Literal["round", "step"] = "round",
    ) -> None:
        # ClassificationModule's constructor builds a backbone and a linear head, which CLIP replaces: its metrics
        # and loss bookkeeping are set here as it sets them.
        FederatedModule.__init__(
            self,
            roles=roles,
            optimizer=optimizer,
            lr=lr,
            momentum=momentum,
            weight_decay=weight_decay,
            lr_scheduler=lr_scheduler,
            lr_scheduler_interval=lr_scheduler_interval,
        )
        key = "model.init_args."
        problems = []
        if task not in ("multiclass", "binary"):
            problems.append(f"{key}task={task!r} is not one of ['multiclass', 'binary']")
        names_ok = isinstance(class_names, (list, tuple)) and all(isinstance(n, str) and n for n in class_names)
        if not names_ok or len(set(class_names)) != len(class_names) or len(class_names) < 2:
            problems.append(f"{key}class_names={class_names!r} must be 2 or more distinct non-empty names")
        elif task == "binary" and len(class_names) != 2:
            problems.append(
                f"{key}class_names has {len(class_names)} names; a binary task takes 2 (negative, positive)"
            )
        if not isinstance(num_context, int) or num_context < 1:
            problems.append(f"{key}num_context={num_context!r} must be an integer >= 1 (16 in CoOp)")
        if not context_std > 0:
            problems.append(f"{key}context_std={context_std!r} must be > 0 (0.02 in CoOp)")
        if gating and (gate_dim < 1 or gate_heads < 1 or gate_dim % gate_heads):
            problems.append(f"{key}gate_dim={gate_dim!r} must be a positive multiple of gate_heads={gate_heads!r}")
        if gating and not (gate_scale > 0 and 0 <= gate_dropout < 1 and lam >= 0):
            problems.append(
                f"{key}gate_scale={gate_scale!r} must be > 0, gate_dropout={gate_dropout!r} in [0, 1) "
                f"and lam={lam!r} >= 0"
            )
        if pixel_norm not in ("clip", "none"):
            problems.append(f"{key}pixel_norm={pixel_norm!r} is not one of ['clip', 'none']")
        if in_channels not in (1, 3) or isinstance(in_channels, bool):
            problems.append(f"{key}in_channels={in_channels!r} must be 1 (grey, repeated to RGB) or 3")
        if problems:
            raise ConfigError("Invalid CLIPPromptModule settings: " + "; ".join(problems) + ".")
        self.task = task
        self.class_names = [n.replace("_", " ") for n in class_names]
        self.num_classes = 1 if task == "binary" else len(class_names)
        self.clip = clip.build()
        if gating and self.clip.num_features % gate_dim:
            raise ConfigError(
                f"{key}gate_dim={gate_dim} must divide CLIP's projection dimension "
                f"{self.clip.num_features} (pooling takes every {self.clip.num_features}/d-th value)."
            )
        ids, eos = self.clip.prompt_tokens(self.class_names, num_context)
        self.register_buffer("prompt_ids", ids)
        self.register_buffer("prompt_eos", eos)
        self.prompt = nn.Module()
        self.prompt.ctx = nn.Parameter(torch.randn(num_context, self.clip.width) * context_std)
        self.gating, self.gate_dim, self.gate_scale, self.gate_dropout, self.lam = (
            gating,
            gate_dim,
            gate_scale,
            gate_dropout,
            lam,
        )
        self.gate = nn.MultiheadAttention(gate_dim, gate_heads) if gating else None
        self.pixel_norm, self.in_channels = pixel_norm, in_channels
        self.experts: Tensor | None = None
        self.metrics = build_metrics(task, self.num_classes)
        self._loss_sum, self._loss_count = 0.0, 0
        self._positives: Tensor | None = None
        self._seen = 0

    @property
    def context(self) -> Tensor:
        """``prompt.ctx``, the learned context vectors (M, width): what a client trains and keeps."""
        return cast(Tensor, self.prompt.ctx)

    @override
    def default_role_rules(self) -> list[RoleRule]:
        return [
            RoleRule("clip.*", "frozen"),
            RoleRule("prompt_*", "frozen"),
            RoleRule("prompt.*", "shared"),
            RoleRule("gate.*", "personal"),
        ]

    # ------------------------------------------------------------------------------------------------ features
    def image_features(self, images: Tensor) -> Tensor:
        """CLIP's image features (B, D), not normalized."""
        if images.shape[1] != self.in_channels:
            raise DataError(
                f"CLIPPromptModule expects {self.in_channels}-channel images "
                f"(model.init_args.in_channels), got a batch of shape {tuple(images.shape)}."
            )
        if self.in_channels == 1:
            images = images.expand(-1, 3, -1, -1)
        if self.pixel_norm == "clip":
            mean = images.new_tensor(CLIP_MEAN).reshape(1, 3, 1, 1)
            images = (images - mean) / images.new_tensor(CLIP_STD).reshape(1, 3, 1, 1)
        return self.clip(images)

    def text_features(self, ctx: Tensor | None = None) -> Tensor:
        """The text features (C, D), not normalized, of every class's prompt with context ``ctx`` (M, width):
        this module's ``prompt.ctx`` by default (differentiable), or an expert's."""
        ctx = self.context if ctx is None else ctx.to(self.context)
        embeddings = self.clip.token_embedding(self.prompt_ids)
        count = len(ctx)
        embeddings = torch.cat(
            [embeddings[:, :1], ctx.unsqueeze(0).expand(len(embeddings), -1, -1), embeddings[:, 1 + count :]], dim=1
        )
        return self.clip.encode_prompts(embeddings, self.prompt_eos)

    @torch.no_grad()
    def expert_features(self, contexts: Tensor) -> Tensor:
        """The gate's keys of non-local experts: normalized, pooled text features (E, C, d) of contexts (E, M, w)."""
        if len(contexts) == 0:
            return torch.zeros(0, len(self.class_names), self.gate_dim, device=self.context.device)
        return torch.stack([strided_pool(F.normalize(self.text_features(c), dim=-1), self.gate_dim) for c in contexts])

    def set_experts(self, features: Tensor | None) -> None:
        """Use the experts' features (E, C, d) (from :meth:`expert_features`) in the forward; None: none."""
        self.experts = None if features is None else features.to(self.context.device)

    # ------------------------------------------------------------------------------------------------ forward
    @override
    def forward(self, inputs: Tensor) -> Tensor:
        """Logits (B, C) (binary: (B, 1), the positive class's minus the negative's)."""
        image, text = self.image_features(inputs), self.text_features()
        experts = self.experts if self.gate is not None else None
        if experts is None:
            logits = moap_logits(image, text, None, self.clip.logit_scale, None, dim=0, scale=0.0, lam=1.0)
        else:
            logits = moap_logits(
                image,
                text,
                experts,
                self.clip.logit_scale,
                self.gate,
                dim=self.gate_dim,
                scale=self.gate_scale,
                lam=self.lam,
                dropout=self.gate_dropout if self.training else 0.0,
            )
        if self.task == "binary":
            return (logits[:, 1] - logits[:, 0]).unsqueeze(1)
        return logits
