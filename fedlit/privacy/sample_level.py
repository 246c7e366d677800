"""Sample-level differential privacy (DP-SGD: Abadi et al., CCS 2016, with Opacus's per-sample gradients): see
:mod:`fedlit.privacy`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from lightning.pytorch import Callback
from torch import Tensor, nn
from torch.optim import Optimizer
from typing_extensions import override

from fedlit.core.contexts import ClientContext, ServerContext
from fedlit.core.errors import ConfigError
from fedlit.module import FederatedModule
from fedlit.privacy.accounting import ACCOUNTANT, check_settings, rdp_accountant, warn_uncovered

if TYPE_CHECKING:
    from fedlit.strategies.base import ClientUpdate


def clip_and_noise(
    grad_samples: list[Tensor], max_grad_norm: float, noise_std: float, generator: torch.Generator | None = None
) -> tuple[list[Tensor], Tensor]:
    """DP-SGD's gradient of one batch from its per-sample gradients (Abadi et al. 2016, Algorithm 1).

    Each sample's gradient, over all the tensors together, is scaled by ``min(1, max_grad_norm / ||g_i||)``
    (Opacus's ``max_grad_norm / (||g_i|| + 1e-6)`` clamped at 1); the scaled gradients are summed, N(0, noise_std^2)
    is added to each coordinate, and the sum is divided by the batch size B.

    Args:
        grad_samples: One (B, *shape) tensor per parameter.
        max_grad_norm: C.
        noise_std: sigma * C (0: no noise).
        generator: Drives the noise (on the gradients' device).

    Returns:
        The gradients, one per parameter, and the B per-sample norms before clipping.
    """
    batch = grad_samples[0].shape[0]
    norms = torch.stack([g.reshape(batch, -1).float().norm(2, dim=1) for g in grad_samples]).norm(2, dim=0)
    factor = (max_grad_norm / (norms + 1e-6)).clamp(max=1.0)
    grads = []
    for g in grad_samples:
        summed = torch.einsum("i,i...->...", factor.to(g.dtype), g)
        if noise_std > 0:
            summed = summed + torch.normal(
                0.0, noise_std, size=summed.shape, generator=generator, device=summed.device, dtype=summed.dtype
            )
        grads.append(summed / batch)
    return grads, norms


def module_problems(module: nn.Module) -> list[str]:
    """What keeps Opacus from computing true per-sample gradients of ``module``'s trainable layers, by layer name:
    Opacus's validators (BatchNorm, LSTM...) and trainable layers that keep buffers. Normalization layers whose
    tensors are all frozen are evaluated with fixed statistics by the loop, which is fine."""
    from opacus.validators import ModuleValidator

    problems = []
    for name, sub in module.named_modules():
        if not any(p.requires_grad for p in sub.parameters(recurse=False)):
            continue
        validator = ModuleValidator.VALIDATORS.get(type(sub))
        if isinstance(sub, nn.modules.batchnorm._BatchNorm):
            problems.append(f"{name} ({type(sub).__name__}: mixes the samples of a batch; use GroupNorm)")
        elif validator is not None and validator(sub):
            problems.append(f"{name} ({type(sub).__name__}: {str(validator(sub)[0]).split('.')[0]})")
        elif any(True for _ in sub.buffers(recurse=False)):
            problems.append(f"{name} ({type(sub).__name__}: a trainable layer with buffers)")
    return problems


class SampleLevelDP(Callback):
    """Sample-level differential privacy of each client's local training (DP-SGD with Opacus's per-sample gradients).

    At fit start Opacus's per-sample-gradient hooks (``opacus.grad_sample.GradSampleHooks``) are attached to the live
    module's trainable layers; the loop calls ``training_step`` on the module as usual. In
    ``on_before_optimizer_step`` each trainable parameter's gradient is replaced by DP-SGD's: the per-sample
    gradients clipped jointly to ``max_grad_norm``, summed, plus N(0, (noise_multiplier * max_grad_norm)^2) noise,
    divided by the batch size (:func:`clip_and_noise`). Every optimizer step is one step of the sampled Gaussian
    mechanism on the client's training data with q = batch size / the client's training samples; each client's
    accountant history lives in its ``client_state``, its epsilon goes up with its update (``update.metrics``).

    Logs per round ``privacy/sample_epsilon_max`` and ``privacy/sample_epsilon_mean`` (over the clients that have
    trained), ``privacy/sample_clipped_fraction`` (samples whose gradient was clipped, mean over the round's
    clients), ``privacy/sample_delta``, ``privacy/sample_noise_multiplier``, ``privacy/sample_max_grad_norm``;
    ``results.json`` gets ``privacy.sample_level`` with every client's epsilon.

    Refused (ConfigError, at fit start): a model whose trainable layers Opacus cannot handle (BatchNorm: use
    GroupNorm); a loss that is not a mean of per-sample losses (the Cox partial likelihood, whose risk sets couple
    the samples of a batch); a strategy that changes the client's gradient (``training_loss``,
    ``on_before_optimizer_step``, ``on_after_backward`` or ``client_forward`` of FedProx, SCAFFOLD, FedDyn, APPLE...:
    its term would be dropped or not privatized); 16-bit mixed precision with a gradient scaler (use
    ``bf16-mixed`` or ``32-true``). The module's loss must be the *mean* over the batch (fedlit's classification and
    segmentation losses are), since the per-sample gradients are rebuilt from it.

    Args:
        noise_multiplier: sigma, the noise std in units of ``max_grad_norm`` (> 0).
        max_grad_norm: C, the bound on each sample's gradient norm (> 0).
        delta: The delta of the reported (epsilon, delta)-DP (in (0, 1); below 1 / a client's training samples).
    """

    def __init__(self, noise_multiplier: float, max_grad_norm: float, delta: float = 1e-5) -> None:
        check_settings("SampleLevelDP", noise_multiplier, ("max_grad_norm", max_grad_norm), delta)
        self.noise_multiplier, self.max_grad_norm = float(noise_multiplier), float(max_grad_norm)
        self.delta = float(delta)
        self.epsilons: dict[str, float] = {}  # the latest epsilon of each client, as it uploaded it
        self.rounds = 0
        self._hooks: Any = None
        self._generator: torch.Generator | None = None
        self._turn: dict[str, Any] = {}
        self._round_clipped: list[float] = []

    @override
    def __repr__(self) -> str:
        return (
            f"SampleLevelDP(noise_multiplier={self.noise_multiplier}, max_grad_norm={self.max_grad_norm}, "
            f"delta={self.delta})"
        )

    @override
    def on_fit_start(self, trainer: ServerContext, pl_module: FederatedModule) -> None:
        from fedlit.strategies.base import Strategy
        from fedlit.tasks.survival import CoxModule

        rdp_accountant()
        problems = []
        if isinstance(pl_module, CoxModule):
            problems.append(
                "the Cox loss is not a mean of per-sample losses (each risk set spans the batch), so "
                "per-sample gradients are not defined; use ClientLevelDP for survival models"
            )
        strategy = trainer.strategy
        changed = [
            h
            for h in ("training_loss", "on_before_optimizer_step", "on_after_backward", "client_forward")
            if getattr(type(strategy), h) is not getattr(Strategy, h)
        ]
        if changed:
            problems.append(
                f"strategy {strategy!r} changes the client's gradient ({', '.join(changed)}), which "
                "DP-SGD's per-sample gradients do not cover; use FedAvg, FedBN, SiloBN, FedSA, Local..."
            )
        if trainer.scaler is not None:
            problems.append("federation.precision uses a gradient scaler (16-mixed); use bf16-mixed or 32-true")
        layers = module_problems(pl_module)
        if layers:
            problems.append(
                "Opacus cannot compute per-sample gradients of the trainable layers "
                + "; ".join(layers[:6])
                + (" ..." if len(layers) > 6 else "")
                + " (replace them, or freeze them with a role rule)"
            )
        if problems:
            raise ConfigError("SampleLevelDP: " + "; ".join(problems) + ".")
        warn_uncovered("SampleLevelDP", self.rounds, trainer)
        if self._hooks is None:
            from opacus.grad_sample import GradSampleHooks

            self._hooks = GradSampleHooks(pl_module, batch_first=True, loss_reduction="mean", strict=False)

    def on_client_fit_start(
        self, pl_module: FederatedModule, server_round: int, client_id: str, client: ClientContext
    ) -> None:
        """Start the turn's step count and noise generator; clear any stale per-sample gradient."""
        _reset_hooks_state(pl_module)
        if self._hooks is not None:
            self._hooks.enable_hooks()
        train = client.num_examples("train")
        self._turn = {
            "steps": 0,
            "clipped": 0,
            "samples": 0,
            "sample_rate": min(1.0, client.batch_size / max(train, 1)),
        }
        device = next(p.device for p in pl_module.parameters())
        self._generator = torch.Generator(device=device).manual_seed(
            client.derive_seed("dp-sgd", server_round, client_id) % 2**63
        )

    @override
    def on_before_optimizer_step(
        self, trainer: ClientContext, pl_module: FederatedModule, optimizer: Optimizer
    ) -> None:
        """Replace each trainable parameter's gradient by DP-SGD's (:func:`clip_and_noise`)."""
        params = [(n, p) for n, p in pl_module.named_parameters() if p.requires_grad and p.grad is not None]
        missing = [n for n, p in params if not isinstance(getattr(p, "grad_sample", None), Tensor)]
        if missing:
            raise ConfigError(
                f"SampleLevelDP: no per-sample gradient for {missing[:4]} (a trainable parameter used outside a "
                "layer Opacus hooks, a layer in eval mode, or several backward passes per step); its gradient "
                "would not be private. Freeze it with a role rule or restructure the model."
            )
        if not params:
            return
        per_sample = [p.grad_sample for _, p in params]  # type: ignore[attr-defined]  # set by Opacus's GradSampleModule
        grads, norms = clip_and_noise(
            per_sample, self.max_grad_norm, self.noise_multiplier * self.max_grad_norm, self._generator
        )
        for (_, p), grad in zip(params, grads, strict=True):
            p.grad = grad.to(p.dtype)
        self._turn["clipped"] += int((norms > self.max_grad_norm).sum())
        self._turn["samples"] += len(norms)
        _clear_grad_samples(pl_module)

    @override
    def on_before_zero_grad(
        self, trainer: ClientContext, pl_module: FederatedModule, optimizer: Optimizer, stepped: bool = True
    ) -> None:
        """Count the optimizer step (one mechanism step) if it happened."""
        self._turn["steps"] = self._turn.get("steps", 0) + int(stepped)
        _clear_grad_samples(pl_module)

    def on_client_fit_end(
        self,
        trainer: ClientContext,
        pl_module: FederatedModule,
        server_round: int,
        client_id: str,
        update: ClientUpdate,
        client_state: dict[str, Any],
    ) -> None:
        """Add the turn's steps to the client's accountant (kept in its ``client_state``) and upload its epsilon.
        A turn left out of aggregation (quarantined, timed out) never gets here: nothing of it is released, so
        nothing is counted."""
        if self._hooks is not None:  # outside a turn (evaluation, unseen clients' fine-tuning) no per-sample work
            self._hooks.disable_hooks()
        accountant = rdp_accountant(client_state.get("history"))
        for _ in range(self._turn["steps"]):
            accountant.step(noise_multiplier=self.noise_multiplier, sample_rate=self._turn["sample_rate"])
        client_state["history"] = [list(h) for h in accountant.history]
        update.metrics["dp_sample_epsilon"] = float(accountant.get_epsilon(self.delta)) if accountant.history else 0.0
        update.metrics["dp_sample_clipped_fraction"] = self._turn["clipped"] / max(self._turn["samples"], 1)

    def on_before_aggregate(
        self, trainer: ServerContext, pl_module: FederatedModule, server_round: int, updates: list[ClientUpdate]
    ) -> None:
        """Keep each client's epsilon as it uploaded it."""
        if self._hooks is not None:  # also after a turn that stopped before on_client_fit_end
            self._hooks.disable_hooks()
            _clear_grad_samples(pl_module)
        self._round_clipped = []
        for update in updates:
            if "dp_sample_epsilon" in update.metrics:
                self.epsilons[update.client_id] = float(update.metrics["dp_sample_epsilon"])
                self._round_clipped.append(float(update.metrics["dp_sample_clipped_fraction"]))

    def on_after_aggregate(
        self, trainer: ServerContext, pl_module: FederatedModule, server_round: int, log: dict[str, float] | None = None
    ) -> None:
        """Log the max and mean epsilon over the clients that have trained, and the round's clipped fraction."""
        self.rounds += 1
        if log is None or not self.epsilons:
            return
        values = list(self.epsilons.values())
        log.update(
            {
                "privacy/sample_epsilon_max": max(values),
                "privacy/sample_epsilon_mean": sum(values) / len(values),
                "privacy/sample_delta": self.delta,
                "privacy/sample_noise_multiplier": self.noise_multiplier,
                "privacy/sample_max_grad_norm": self.max_grad_norm,
            }
        )
        if self._round_clipped:
            log["privacy/sample_clipped_fraction"] = sum(self._round_clipped) / len(self._round_clipped)

    def results_json(self, trainer: ServerContext) -> dict[str, Any]:
        """``results.json``'s ``privacy.sample_level``."""
        values = list(self.epsilons.values())
        return {
            "privacy": {
                "sample_level": {
                    "epsilon_max": max(values) if values else 0.0,
                    "epsilon_mean": sum(values) / len(values) if values else 0.0,
                    "epsilon_per_client": dict(self.epsilons),
                    "delta": self.delta,
                    "noise_multiplier": self.noise_multiplier,
                    "max_grad_norm": self.max_grad_norm,
                    "accountant": ACCOUNTANT,
                    "mechanism": "DP-SGD (Abadi et al., CCS 2016), Opacus per-sample gradients",
                }
            }
        }

    @override
    def state_dict(self) -> dict[str, Any]:
        return {"epsilons": dict(self.epsilons), "rounds": self.rounds}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.epsilons, self.rounds = dict(state_dict["epsilons"]), int(state_dict["rounds"])


def _clear_grad_samples(module: nn.Module) -> None:
    for p in module.parameters():
        if getattr(p, "grad_sample", None) is not None:
            p.grad_sample = None  # type: ignore[attr-defined]  # set by Opacus's GradSampleModule


def _reset_hooks_state(module: nn.Module) -> None:
    """Forget what Opacus's hooks kept from a forward pass without its backward pass (a turn that stopped at a
    non-finite loss): stale activations and forward counters would misplace the next per-sample gradients."""
    _clear_grad_samples(module)
    for sub in module.modules():
        for attr in ("activations", "max_batch_len"):
            if hasattr(sub, attr):
                delattr(sub, attr)
    for p in module.parameters():
        if hasattr(p, "_forward_counter"):
            p._forward_counter = 0
        if hasattr(p, "_current_grad_sample"):
            del p._current_grad_sample
