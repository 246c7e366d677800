"""Parameter roles: which tensors of a model are frozen, shared with the server, or kept personal.

Every parameter and buffer of a :class:`~fedlit.module.FederatedModule` has exactly one role:

========== ========= ======================================== =====================================
role       trained   leaves the client                        example
========== ========= ======================================== =====================================
frozen     no        never                                    the pretrained backbone
shared     yes       uploaded, aggregated, downloaded         LoRA matrices, a shared head
personal   yes       never                                    a personal head, BN layers (FedBN)
========== ========= ======================================== =====================================

Roles are declared once as an ordered list of :class:`RoleRule` (name patterns, optionally restricted to the
first or last layers by depth); the last rule that matches a name wins. Buffers (BatchNorm statistics) take the
role of the parameters of the module that owns them, so running statistics follow their layer and are never
silently dropped; a buffer of a module without parameters follows the rules by its own name. A strategy may then
refine the result (FedBN makes normalization layers personal) through :meth:`ParameterRoles.with_roles`.

Normalization layers (what FedBN, SiloBN and FedPxN keep local) are found by :func:`is_norm_module`, because
transformers encoders define their own norm classes as plain ``nn.Module`` (``T5LayerNorm``, ``LlamaRMSNorm``,
SAM's ``LayerNorm2d``, timm's ``RmsNorm``). A module is a normalization layer when

1. it is an instance of :data:`NORM_TYPES` (torch's BatchNorm, InstanceNorm, GroupNorm, LayerNorm,
   LocalResponseNorm, RMSNorm and their subclasses), or
2. its class name ends in the CamelCase word ``Norm`` or ``Normalization``, optionally followed by ``1d``,
   ``2d`` or ``3d`` (``T5LayerNorm``, ``LlamaRMSNorm``, ``RmsNorm``, ``LayerNorm2d``), and its own parameters
   are scalars or vectors of one length, or
3. its only parameters are a 1-D ``weight`` and optionally a 1-D ``bias`` of the same length, and its
   attribute name says norm (a ``_``/digit-separated word that is ``ln``, ``bn``, ``gn`` or ends in ``norm``
   or ``norms``: ``ln_f``, ``norm1``, ``layer_norm``, ``input_layernorm``, ``LayerNorm``, ``norms.0``) or its
   class name holds the word ``Norm`` (``RMSNormGated``, ``NormLayer``).

Rules 2 and 3 apply only to modules that hold parameters or buffers themselves and none in their submodules, and
never to linear, convolution, embedding, attention or recurrent layers, nor to weight/spectral normalization
(reparametrizations of a weight, not normalization layers). So LoRA matrices, DoRA magnitude vectors, LayerScale
(a 1-D ``gamma``), bias-only modules and heads are never normalization. The parameters and buffers a
normalization layer owns directly are normalization tensors (:meth:`ParameterRoles.is_norm`).
"""

from __future__ import annotations

import difflib
import fnmatch
import re
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Literal, get_args

from torch import nn
from typing_extensions import override

from fedlit.core.errors import broken

Role = Literal["frozen", "shared", "personal"]
ROLES: tuple[str, ...] = get_args(Role)

#: Module types whose parameters and buffers count as "normalization" (FedBN, SiloBN, FedPxN).
NORM_TYPES: tuple[type[nn.Module], ...] = (
    nn.modules.batchnorm._NormBase,  # BatchNorm*, InstanceNorm*, SyncBatchNorm
    nn.GroupNorm,
    nn.LayerNorm,
    nn.LocalResponseNorm,
    nn.RMSNorm,
)

#: Layers that are never normalization, whatever their name (rules 2 and 3 of :func:`is_norm_module`).
NOT_NORM_TYPES: tuple[type[nn.Module], ...] = (
    nn.Linear,
    nn.Bilinear,
    nn.modules.conv._ConvNd,  # Conv*, ConvTranspose*
    nn.Embedding,
    nn.EmbeddingBag,
    nn.MultiheadAttention,
    nn.RNNBase,  # RNN, LSTM, GRU
    nn.PReLU,
)

# Rule 2: the class name's last CamelCase word is Norm or Normalization (case-aware: "Enorm" is not one).
_NORM_CLASS = re.compile(r"(?:Norm|Normalization)(?:[123][dD])?$")
# Weight and spectral normalization reparametrize a weight; they are not normalization layers.
_REPARAM_CLASS = re.compile(r"(?:Weight|Spectral)Norm$")
# Rule 3: the class name holds the CamelCase word Norm (not "Normal", "Normalize").
_NORM_WORD_CLASS = re.compile(r"Norm(?![a-z])")
_NORM_ATTR_WORDS = frozenset({"ln", "bn", "gn"})


def _attribute_says_norm(name: str) -> bool:
    """Whether the last non-numeric part of a qualified module name says norm (``encoder.ln_f``, ``norms.0``)."""
    parts = [p for p in name.split(".") if p and not p.isdigit()]
    if not parts:
        return False
    words = [w for w in re.split(r"[_\d]+", parts[-1].lower()) if w]
    return any(w in _NORM_ATTR_WORDS or w.removesuffix("s").endswith(("norm", "normalization")) for w in words)


def is_norm_module(module: nn.Module, name: str = "") -> bool:
    """Whether ``module`` is a normalization layer (its tensors are what FedBN, SiloBN and FedPxN keep local).

    A module is a normalization layer when (see the module docstring for the reasons):

    1. it is an instance of :data:`NORM_TYPES`; or, for a module that holds parameters or buffers itself, none in
       its submodules, and is not one of :data:`NOT_NORM_TYPES` nor a weight/spectral normalization:
    2. its class name ends in ``Norm`` or ``Normalization`` (optionally ``1d``/``2d``/``3d``) and its own
       parameters are scalars or vectors of one length (``T5LayerNorm``, ``LlamaRMSNorm``, ``LayerNorm2d``); or
    3. its parameters are exactly a 1-D ``weight`` and optionally a 1-D ``bias`` of the same length, and its
       attribute name (the last non-numeric part of ``name``) has a word ``ln``, ``bn``, ``gn`` or one ending
       in ``norm`` or ``norms`` (``ln_f``, ``norm1``, ``layer_norm``, ``post_attention_layernorm``,
       ``norms.0``), or its class name holds the word ``Norm``.

    A Linear, a convolution, an embedding, LoRA matrices, timm's ``LayerScale`` (a 1-D ``gamma``) or a bias-only
    module is never a normalization layer.

    Args:
        module: The module to classify.
        name: Its qualified name in the model (``encoder.block.0.layer.0.layer_norm``); ``""`` checks the class
            and structure only.

    Returns:
        True for a normalization layer.
    """
    if isinstance(module, NORM_TYPES):
        return True
    class_name = type(module).__name__
    if isinstance(module, NOT_NORM_TYPES) or _REPARAM_CLASS.search(class_name):
        return False
    params = dict(module.named_parameters(recurse=False))
    has_buffers = next(module.named_buffers(recurse=False), None) is not None
    if not (params or has_buffers):
        return False
    for child in module.children():
        if next(child.parameters(), None) is not None or next(child.buffers(), None) is not None:
            return False
    if _NORM_CLASS.search(class_name):
        if any(p.ndim > 1 for p in params.values()):
            return False
        return len({p.shape[0] for p in params.values() if p.ndim == 1}) <= 1
    weight, bias = params.get("weight"), params.get("bias")
    if weight is None or weight.ndim != 1 or set(params) - {"weight", "bias"}:
        return False
    if bias is not None and bias.shape != weight.shape:
        return False
    return _attribute_says_norm(name) or _NORM_WORD_CLASS.search(class_name) is not None


@dataclass(frozen=True)
class RoleRule:
    """Give ``role`` to the tensors whose qualified name matches ``pattern``.

    Args:
        pattern: A glob on the qualified name (``backbone.*lora_A*``), or ``re:<regex>`` for a regular expression
            searched in the name.
        role: ``frozen``, ``shared`` or ``personal``.
        first: Keep only the matches in the first ``first`` layers by depth (e.g. FedSCA's lowest L adapters).
        last: Keep only the matches in the last ``last`` layers by depth (e.g. FedALA's higher layers).
        depth_key: Regular expression whose first group is a name's layer index (``blocks.3.`` -> 3). Matches
            without a layer index are left out when ``first`` or ``last`` is given.
    """

    pattern: str
    role: Role
    first: int | None = None
    last: int | None = None
    depth_key: str = r"\.(\d+)\."

    def __post_init__(self) -> None:
        problems = []
        if self.role not in ROLES:
            problems.append(f"role={self.role!r} is not one of {list(ROLES)}")
        if self.first is not None and self.last is not None:
            problems.append("give `first` or `last`, not both")
        for key in ("first", "last"):
            value = getattr(self, key)
            if value is not None and value < 1:
                problems.append(f"{key}={value} must be >= 1")
        if self.pattern.startswith("re:"):
            try:
                re.compile(self.pattern[3:])
            except re.error as err:
                problems.append(f"pattern {self.pattern!r} is not a valid regular expression ({err})")
        if problems:
            raise ValueError(f"Invalid role rule {self.pattern!r}: " + "; ".join(problems) + ".")

    def matches(self, name: str) -> bool:
        """Whether ``name`` matches the pattern (ignoring depth)."""
        if self.pattern.startswith("re:"):
            return re.search(self.pattern[3:], name) is not None
        return fnmatch.fnmatchcase(name, self.pattern)

    def select(self, names: list[str]) -> list[str]:
        """The names this rule applies to, depth restriction included."""
        matched = [n for n in names if self.matches(n)]
        if self.first is None and self.last is None:
            return matched
        depth_of = {}
        for name in matched:
            found = re.search(self.depth_key, name)
            if found:
                depth_of[name] = int(found.group(1))
        depths = sorted(set(depth_of.values()))
        if self.first is not None:
            keep = set(depths[: self.first])
        else:
            if not (self.last is not None):  # one of first and last is set (both None returned above)
                raise broken("one of first and last is set (both None returned above)")
            keep = set(depths[-self.last :])
        return [n for n in matched if depth_of.get(n) in keep]


class ParameterRoles(Mapping[str, str]):
    """An immutable map from every parameter and buffer name of a module to its role.

    Args:
        roles: Name -> role, for every parameter and buffer.
        buffers: The names that are buffers.
        norm: The names that belong to normalization layers.
    """

    def __init__(
        self,
        roles: Mapping[str, str],
        *,
        buffers: set[str] | frozenset[str] = frozenset(),
        norm: set[str] | frozenset[str] = frozenset(),
    ) -> None:
        bad = {n: r for n, r in roles.items() if r not in ROLES}
        if bad:
            raise ValueError(f"Unknown roles {bad}; allowed: {list(ROLES)}.")
        self._roles = dict(roles)
        self._buffers = frozenset(buffers)
        self._norm = frozenset(norm)

    @classmethod
    def from_module(
        cls, module: nn.Module, rules: list[RoleRule], default: Role = "shared", labels: list[str | None] | None = None
    ) -> ParameterRoles:
        """Resolve ``rules`` on ``module``: the last matching rule wins, unmatched names get ``default``.

        Args:
            module: The model.
            rules: The rules, in order.
            default: The role of names that no rule matches.
            labels: Where each rule comes from, as the user wrote it (``model.init_args.roles[0]``): a rule with a
                label that matches no parameter or buffer is warned about (a misspelled pattern would otherwise
                leave every tensor at its default role silently). None (for a rule or for all) does not warn.
        """
        param_names = [n for n, _ in module.named_parameters()]
        buffer_names = [n for n, _ in module.named_buffers()]
        roles: dict[str, str] = dict.fromkeys(param_names + buffer_names, default)
        for i, rule in enumerate(rules):
            selected = rule.select(param_names + buffer_names)
            label = labels[i] if labels is not None else None
            if not selected and label is not None:
                close = difflib.get_close_matches(rule.pattern, param_names + buffer_names, n=3, cutoff=0.3)
                warnings.warn(
                    f"{label}: role rule pattern {rule.pattern!r} (-> {rule.role}) matches no parameter or "
                    f"buffer of {type(module).__name__}, so it changes nothing. Check the pattern "
                    f"(names look like {close or (param_names + buffer_names)[:3]}).",
                    stacklevel=3,
                )
            for name in selected:
                roles[name] = rule.role
        norm: set[str] = set()
        for module_name, sub in module.named_modules():
            prefix = f"{module_name}." if module_name else ""
            own_params = [prefix + n for n, _ in sub.named_parameters(recurse=False)]
            own_buffers = [prefix + n for n, _ in sub.named_buffers(recurse=False)]
            if is_norm_module(sub, module_name):
                norm.update(own_params + own_buffers)
            if own_params:
                # Buffers (running statistics) follow the layer they belong to.
                for name in own_buffers:
                    roles[name] = roles[own_params[0]]
        return cls(roles, buffers=set(buffer_names), norm=norm)

    @override
    def __getitem__(self, name: str) -> str:
        return self._roles[name]

    @override
    def __iter__(self) -> Iterator[str]:
        return iter(self._roles)

    @override
    def __len__(self) -> int:
        return len(self._roles)

    def names(self, *roles: str, params: bool = True, buffers: bool = True) -> list[str]:
        """Names with one of ``roles`` (all roles when none given), in module order."""
        return [
            n
            for n, r in self._roles.items()
            if (not roles or r in roles) and (buffers if n in self._buffers else params)
        ]

    def is_buffer(self, name: str) -> bool:
        """Whether ``name`` is a buffer (not a parameter)."""
        return name in self._buffers

    def is_norm(self, name: str) -> bool:
        """Whether ``name`` is a parameter or buffer of a normalization layer (see :func:`is_norm_module`)."""
        return name in self._norm

    def with_roles(self, updates: Mapping[str, str]) -> ParameterRoles:
        """A copy with some names given new roles (unknown names raise)."""
        unknown = sorted(set(updates) - set(self._roles))
        if unknown:
            raise KeyError(f"with_roles: names not in the model: {unknown[:5]}")
        return ParameterRoles({**self._roles, **updates}, buffers=self._buffers, norm=self._norm)

    def replace(self, predicate: Callable[[str, str], bool], role: Role) -> ParameterRoles:
        """A copy where every name for which ``predicate(name, role)`` holds gets ``role``."""
        return self.with_roles({n: role for n, r in self._roles.items() if predicate(n, r)})

    def counts(self) -> dict[str, int]:
        """How many tensors have each role."""
        return {role: sum(1 for r in self._roles.values() if r == role) for role in ROLES}

    @override
    def __repr__(self) -> str:
        return f"ParameterRoles({self.counts()})"


def role_summary(module: nn.Module, roles: ParameterRoles) -> list[dict[str, float | int | str]]:
    """Per role (``frozen``, ``shared``, ``personal``, then ``total``): tensors (parameters and buffers),
    parameters (their scalar count; buffers not included) and MB (parameters and buffers)."""
    tensors = {**dict(module.named_parameters()), **dict(module.named_buffers())}
    buffers = {n for n, _ in module.named_buffers()}
    rows: list[dict[str, float | int | str]] = []
    for role in (*ROLES, "total"):
        names = [n for n in tensors if role == "total" or roles.get(n) == role]
        rows.append(
            {
                "role": role,
                "tensors": len(names),
                "parameters": sum(tensors[n].numel() for n in names if n not in buffers),
                "mb": sum(tensors[n].numel() * tensors[n].element_size() for n in names) / 2**20,
            }
        )
    return rows


def unmatched_rules(module: nn.Module, rules: list[RoleRule]) -> list[RoleRule]:
    """The rules that select no parameter or buffer of ``module``."""
    names = [n for n, _ in module.named_parameters()] + [n for n, _ in module.named_buffers()]
    return [rule for rule in rules if not rule.select(names)]


def role_summary_table(module: nn.Module, roles: ParameterRoles, rules: list[RoleRule]) -> str:
    """:func:`role_summary` as a Markdown table, and the ``rules`` that match nothing below it."""
    lines = ["| role | tensors | parameters | MB |", "|---|---:|---:|---:|"]
    lines += [
        f"| {r['role']} | {r['tensors']:,} | {r['parameters']:,} | {r['mb']:.2f} |" for r in role_summary(module, roles)
    ]
    unmatched = unmatched_rules(module, rules)
    if unmatched:
        lines.append("\nRole rules that match no tensor: " + ", ".join(f"{r.pattern!r} -> {r.role}" for r in unmatched))
    return "\n".join(lines)
