"""FederatedModule: a LightningModule whose tensors carry federated roles (frozen / shared / personal)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, ClassVar, Literal, TypeVar

import torch
from lightning.pytorch import LightningModule
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from lightning.pytorch.utilities.types import OptimizerLRSchedulerConfig
from torch import Tensor, nn
from typing_extensions import override

from fedlit.core.errors import ConfigError
from fedlit.core.roles import ParameterRoles, RoleRule

_T = TypeVar("_T")
#: Bumped whenever any module of the process registers a parameter, buffer or submodule (PyTorch's global
#: registration hooks: ``module.x = ...``, ``register_buffer``, ``load_state_dict(assign=True)``); what a
#: :class:`FederatedModule` derives from its structure (:meth:`FederatedModule.derived`) is rebuilt after it.
_generation = [0]


def _structure_changed(*_: Any) -> None:
    _generation[0] += 1


nn.modules.module.register_module_parameter_registration_hook(_structure_changed)
nn.modules.module.register_module_buffer_registration_hook(_structure_changed)
nn.modules.module.register_module_module_registration_hook(_structure_changed)


class CachedFeatures(Tensor):
    """The output of a module's frozen :attr:`~FederatedModule.feature_extractor`, computed once and given back in
    place of the inputs (``federation.cache_features``): :meth:`FederatedModule.extract_features` passes it through
    as a plain tensor instead of running the extractor again."""


class FederatedModule(LightningModule):
    """A client model: frozen backbone + trainable adapters + head, each tensor with a role.

    Subclasses build their networks in ``__init__`` and implement ``training_step`` and ``validation_step``
    (``test_step`` defaults to it), updating metrics that :meth:`compute_metrics` returns. Roles are declared
    with ``roles`` (rules applied after :meth:`default_role_rules`); the federation calls
    :meth:`set_parameter_roles` with the strategy's refinement, which also sets ``requires_grad``.

    A module says which data it trains on with ``accepted_tasks`` (the data set's ``task`` must be one of them;
    None accepts any) and which metric picks the best round by default with ``default_selection_metric``.

    Args:
        roles: Extra role rules, applied after the subclass defaults; the last matching rule wins.
        optimizer: The local optimizer: ``sgd``, ``adam`` or ``adamw`` (with ``lr``, ``momentum`` and
            ``weight_decay``), or any ``torch.optim`` optimizer as ``class_path`` + ``init_args`` in a recipe (a
            callable that takes the parameters; its settings then go in its ``init_args``).
        lr: Local learning rate of the shorthands.
        momentum: SGD momentum of the shorthands (ignored by Adam/AdamW).
        weight_decay: Weight decay of the shorthands.
        lr_scheduler: A ``torch.optim.lr_scheduler`` class as ``class_path`` + ``init_args`` (a callable that takes
            the optimizer), or None for a constant learning rate.
        lr_scheduler_interval: When the schedule steps: ``round`` once per server round (every client of round
            ``t`` trains at the value after ``t - 1`` steps; the server keeps the schedule), or ``step`` after
            each local optimizer step (one schedule per client, kept between its turns with
            ``federation.optimizer_state: persist``, restarted at every turn otherwise).
    """

    #: The data set tasks (``FederatedDataModule.task``) this module can train on; None: any task.
    accepted_tasks: ClassVar[frozenset[str] | None] = None
    #: The metric whose mean validation value picks the best round when ``federation.selection_metric`` is
    #: not set; one of :attr:`higher_is_better`'s keys.
    default_selection_metric: ClassVar[str] = "loss"
    #: The submodule (an attribute name) whose output alone the rest of the forward pass reads, which
    #: ``federation.cache_features`` may compute once per sample when all its tensors are frozen; the module's
    #: forward must call it through :meth:`extract_features`. None (the default): no such prefix.
    feature_extractor: ClassVar[str | None] = None

    def __init__(
        self,
        *,
        roles: list[RoleRule] | None = None,
        optimizer: Literal["sgd", "adam", "adamw"] | OptimizerCallable = "sgd",
        lr: float = 0.01,
        momentum: float = 0.0,
        weight_decay: float = 0.0,
        lr_scheduler: LRSchedulerCallable | None = None,
        lr_scheduler_interval: Literal["round", "step"] = "round",
    ) -> None:
        super().__init__()
        problems = _check_optimization(optimizer, lr, momentum, weight_decay, lr_scheduler, lr_scheduler_interval)
        if not 0 < lr < float("inf"):  # nan fails both comparisons too
            problems.append(f"model.init_args.lr={lr} is not a learning rate: it must be a finite number > 0")
        if not 0 <= momentum < 1:
            problems.append(f"model.init_args.momentum={momentum} must be in [0, 1)")
        if weight_decay < 0:
            problems.append(f"model.init_args.weight_decay={weight_decay} must be >= 0")
        if problems:
            raise ConfigError("; ".join(problems) + ".")
        self.role_rules = list(roles or [])
        self.optimizer_name = optimizer if isinstance(optimizer, str) else "callable"
        self.optimizer_factory = None if isinstance(optimizer, str) else optimizer
        self.lr_scheduler_factory, self.lr_scheduler_interval = lr_scheduler, lr_scheduler_interval
        self.lr = lr
        self.momentum = momentum
        self.weight_decay = weight_decay
        self._roles: ParameterRoles | None = None
        self._derived: dict[str, Any] = {}
        self._derived_key: tuple[int, ...] = ()

    # ----------------------------------------------------------------------------------------------- roles
    def default_role_rules(self) -> list[RoleRule]:
        """Rules applied before the user's; subclasses freeze their backbone here."""
        return []

    def parameter_roles(self) -> ParameterRoles:
        """The role of every parameter and buffer (resolved from the rules, or as set by the federation)."""
        if self._roles is None:
            defaults = self.default_role_rules()
            labels = [None] * len(defaults) + [f"model.init_args.roles[{i}]" for i in range(len(self.role_rules))]
            self._roles = ParameterRoles.from_module(self, defaults + self.role_rules, labels=labels)
        return self._roles

    def set_parameter_roles(self, roles: ParameterRoles) -> None:
        """Adopt ``roles`` (usually refined by a strategy) and set ``requires_grad`` from them."""
        missing = sorted(set(self.state_names()) - set(roles))
        if missing:
            raise ConfigError(f"Roles given for a different model: no role for {missing[:5]}.")
        self._roles = roles
        self._derived_key = ()
        for name, param in self.named_parameters():
            param.requires_grad_(roles[name] != "frozen")

    def state_names(self) -> list[str]:
        """Every parameter and buffer name, in module order."""
        return [n for n, _ in self.named_parameters()] + [n for n, _ in self.named_buffers()]

    def named_tensors(self, *roles: str) -> dict[str, Tensor]:
        """Live parameters and buffers with one of ``roles`` (no copy; a new dict at every call)."""
        return dict(self.derived(f"named_tensors{roles}", lambda: self._named_tensors(roles)))

    def _named_tensors(self, roles: tuple[str, ...]) -> dict[str, Tensor]:
        wanted = set(self.parameter_roles().names(*roles))
        tensors: dict[str, Tensor] = dict(self.named_parameters())
        tensors.update(self.named_buffers())
        return {n: t for n, t in tensors.items() if n in wanted}

    def derived(self, key: str, build: Callable[[], _T]) -> _T:
        """``build()``, kept under ``key`` until the module's structure or roles change: a value derived from its
        parameters, buffers, submodules and roles (walking them at every client turn costs more than a small
        model's step).

        A change is: a parameter, buffer or submodule registered anywhere in the process (``module.x = ...``,
        ``register_buffer``, ``load_state_dict(assign=True)``), :meth:`set_parameter_roles`, or a conversion of the
        module or a module above it (``to``, ``half``..., which replace buffers). A conversion of a submodule alone
        (``module.head.to(...)``) is not seen: convert the whole module.
        """
        roles = self._roles
        current = (_generation[0], id(self), id(roles))
        if getattr(self, "_derived_key", None) != current or roles is None:
            self._derived, self._derived_key = {}, current
        if key not in self._derived:
            self._derived[key] = build()
            # Building may resolve the roles (parameter_roles()): keep what was built under the resolved ones.
            self._derived_key = (_generation[0], id(self), id(self._roles))
        return self._derived[key]

    def tensors_replaced(self) -> None:
        """Forget what :meth:`derived` kept: call it after putting other tensor objects in the module's place without
        registering them (``submodule._parameters[name] = p``, as fused training does per client)."""
        self._derived_key = ()

    @override
    def __getstate__(self) -> dict[str, Any]:
        # A copy or a pickle (another process) rebuilds what is derived: it holds this module's tensors and an
        # optimizer wrapped by this process's Fabric.
        return {**super().__getstate__(), "_derived": {}, "_derived_key": ()}

    @override
    def _apply(self, fn: Callable[[Tensor], Tensor], *args: Any, **kwargs: Any) -> FederatedModule:
        self._derived_key = ()  # to(), half()...: buffers (and maybe parameters) become new tensors
        return super()._apply(fn, *args, **kwargs)

    def shared_parameters(self) -> Iterator[tuple[str, nn.Parameter]]:
        """(name, parameter) of the trainable parameters whose role is ``shared``."""
        shared = set(self.parameter_roles().names("shared", buffers=False))
        return ((n, p) for n, p in self.named_parameters() if n in shared)

    def num_trainable_parameters(self) -> int:
        """Number of scalar parameters that train (shared + personal)."""
        return sum(p.numel() for p in self.parameters() if p.requires_grad)

    def set_train_mode(self) -> None:
        """``train()``, except modules whose tensors are all frozen stay in eval mode.

        A frozen BatchNorm in train mode would still move its running statistics: a frozen backbone must not
        drift per client, so such modules are evaluated with their pretrained statistics.
        """
        self.train()
        for module in self.derived("frozen_modules", self._frozen_modules):
            module.eval()

    def _frozen_modules(self) -> list[nn.Module]:
        roles = self.parameter_roles()
        frozen = []
        for module_name, module in self.named_modules():
            prefix = f"{module_name}." if module_name else ""
            own = [prefix + n for n, _ in module.named_parameters(recurse=False)]
            own += [prefix + n for n, _ in module.named_buffers(recurse=False)]
            if own and all(roles[n] == "frozen" for n in own):
                frozen.append(module)
        return frozen

    def extract_features(self, inputs: Any) -> Any:
        """The :attr:`feature_extractor`'s output for ``inputs``; cached features (:class:`CachedFeatures`) pass
        through as they are."""
        if isinstance(inputs, CachedFeatures):
            return inputs.as_subclass(Tensor)
        if self.feature_extractor is None:
            raise TypeError(f"{type(self).__name__} has no feature_extractor to call.")
        return getattr(self, self.feature_extractor)(inputs)

    # ----------------------------------------------------------------------------------------- Lightning API
    @override
    def configure_optimizers(self) -> torch.optim.Optimizer | OptimizerLRSchedulerConfig:
        """The local optimizer over the trainable parameters (shared and personal), with its learning-rate
        scheduler if one is configured (Lightning's dict form, its ``interval`` being ``round`` or ``step``).

        A subclass may override this and return an optimizer, or ``{"optimizer": opt, "lr_scheduler":
        {"scheduler": sched, "interval": "round" | "step"}}`` (see :mod:`fedlit.engine.loop.optim`).
        """
        # requires_grad is read at every call: a strategy may freeze some tensors for a phase (FedRep).
        params = [p for p in self.derived("parameters", lambda: list(self.parameters())) if p.requires_grad]
        if not params:
            raise ConfigError(
                "Nothing to train: every parameter is frozen. Give a role rule that makes some tensors "
                "`shared` or `personal` (model.init_args.roles)."
            )
        optimizer = _build("model.init_args.optimizer", self.optimizer_factory, params, torch.optim.Optimizer)
        if optimizer is None:
            if self.optimizer_name == "sgd":
                optimizer = torch.optim.SGD(params, lr=self.lr, momentum=self.momentum, weight_decay=self.weight_decay)
            elif self.optimizer_name == "adam":
                optimizer = torch.optim.Adam(params, lr=self.lr, weight_decay=self.weight_decay)
            else:
                optimizer = torch.optim.AdamW(params, lr=self.lr, weight_decay=self.weight_decay)
        scheduler = _build(
            "model.init_args.lr_scheduler", self.lr_scheduler_factory, optimizer, torch.optim.lr_scheduler.LRScheduler
        )
        if scheduler is None:
            return optimizer
        interval = self.lr_scheduler_interval
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": interval}}

    @override
    def test_step(self, batch: Any, batch_idx: int) -> Any:
        """Same as ``validation_step``; which split is evaluated is the loop's business."""
        return self.validation_step(batch, batch_idx)

    def reset_metrics(self) -> None:
        """Clear the evaluation metrics before a client's split is evaluated."""

    def compute_metrics(self) -> dict[str, float]:
        """The metrics accumulated by ``validation_step`` since :meth:`reset_metrics`."""
        return {}

    def pooled_predictions(self) -> Any:
        """What :meth:`pooled_metrics` needs of the split evaluated since :meth:`reset_metrics` to compute the
        metrics over several clients' splits together: per-sample scores and targets, or counts, as CPU tensors,
        numbers and their containers. The federation asks for it after :meth:`compute_metrics` on each client's test
        split (``federation.pooled_metrics``), in the process that runs the loop. None (the default): the module
        has no pooled form, and its runs report no pooled figure."""
        return None

    def pooled_metrics(self, predictions: list[Any]) -> dict[str, float]:
        """The metrics over the concatenation of several clients' splits, from their :meth:`pooled_predictions`:
        FLamby's "pooled" figure (Ogier du Terrail et al., NeurIPS Datasets and Benchmarks 2022), reported beside
        the mean over clients. It must leave the metrics that ``validation_step`` accumulates as they are. {} (the
        default): none."""
        return {}

    def validation_images(self) -> Tensor | None:
        """A picture of a few examples seen by ``validation_step`` since :meth:`reset_metrics`: a (3, H, W) float
        RGB image in [0, 1], which the federation logs per client after its validation split (TensorBoard's
        images, under ``client/<id>/val/overlay``); None (the default) logs nothing."""
        return None

    @property
    def higher_is_better(self) -> dict[str, bool]:
        """Per metric name, whether larger is better (used for the worst-client aggregate)."""
        return {}


def _check_optimization(
    optimizer: Any, lr: float, momentum: float, weight_decay: float, lr_scheduler: Any, interval: str
) -> list[str]:
    """The problems of the optimizer settings, as the recipe spells them."""
    problems = []
    if isinstance(optimizer, str):
        if optimizer not in ("sgd", "adam", "adamw"):
            problems.append(
                f"model.init_args.optimizer={optimizer!r} is not one of ['sgd', 'adam', 'adamw'] (or "
                "give a torch.optim class as class_path + init_args)"
            )
    elif not callable(optimizer):
        problems.append(
            f"model.init_args.optimizer={optimizer!r} is neither a shorthand nor a callable that builds "
            "an optimizer from the parameters"
        )
    else:
        given = [
            f"{k}={v}"
            for k, v, default in (("lr", lr, 0.01), ("momentum", momentum, 0.0), ("weight_decay", weight_decay, 0.0))
            if v != default
        ]
        if given:
            problems.append(
                f"model.init_args.{', '.join(given)} only apply to the shorthands sgd/adam/adamw: with "
                "a class_path optimizer, give them in model.init_args.optimizer.init_args"
            )
    if lr_scheduler is not None and not callable(lr_scheduler):
        problems.append(
            f"model.init_args.lr_scheduler={lr_scheduler!r} is not a callable that builds a scheduler "
            "from the optimizer"
        )
    if interval not in ("round", "step"):
        problems.append(f"model.init_args.lr_scheduler_interval={interval!r} is not one of ['round', 'step']")
    return problems


def _build(key: str, factory: Any, arg: Any, kind: type) -> Any:
    """``factory(arg)``, its errors (a bad setting in ``init_args``) raised as ConfigError naming ``key``."""
    if factory is None:
        return None
    name = getattr(getattr(factory, "func", None), "__name__", None) or getattr(factory, "__name__", "callable")
    try:
        built = factory(arg)
    except (TypeError, ValueError, KeyError) as err:
        raise ConfigError(f"{key}: building it failed: {type(err).__name__}: {err}. Fix its init_args.") from err
    if not isinstance(built, kind):
        raise ConfigError(
            f"{key} built a {type(built).__name__} ({name}), not a {kind.__module__}.{kind.__name__}: "
            "give such a class as class_path."
        )
    return built
