"""Differential privacy for a federation: client-level (DP-FedAvg) and sample-level (DP-SGD) callbacks.

Both are callbacks for a recipe's ``callbacks:`` list; their privacy loss is counted by Opacus's Rényi-DP
accountant (:class:`opacus.accounting.RDPAccountant`; Mironov, "Rényi Differential Privacy", CSF 2017; Mironov,
Talwar, Zhang, "Rényi Differential Privacy of the Sampled Gaussian Mechanism", 2019) and reported as the epsilon
of (epsilon, delta)-DP.

- :class:`ClientLevelDP`: McMahan, Ramage, Talwar, Zhang, "Learning Differentially Private Recurrent Language
  Models", ICLR 2018 (DP-FedAvg), with the server-side fixed clipping of Flower's
  ``DifferentialPrivacyServerSideFixedClipping`` as the reference behaviour. It protects *whether a client took
  part, and everything it holds*, against whoever sees the server's model (other clients, the public a model is
  released to); the server itself sees each client's update before the noise, so it must be trusted.
- :class:`SampleLevelDP`: Abadi, Chu, Goodfellow, McMahan, Mironov, Talwar, Zhang, "Deep Learning with Differential
  Privacy", CCS 2016 (DP-SGD), with Opacus's per-sample gradients. It protects *each training sample of a client*
  against whoever sees what the client uploads (the server, and through it everyone), the client being trusted
  with its own data.

Symbols -> code: ``C`` (client clip norm S in McMahan et al.) -> ``clip_norm``; ``z`` -> ``noise_multiplier``;
``m`` -> the number of updates aggregated in the round; ``q`` -> ``sample_rate``; DP-SGD's ``C`` ->
``max_grad_norm``, ``sigma`` -> ``noise_multiplier``, ``L`` (the lot) -> one batch of the client's loader.

Deviations (also in docs/privacy.md):

- Deviation: the accountants assume Poisson sampling (each client, or each sample, taken independently with
  probability ``q``). fedlit samples a fixed number of clients per round without replacement, and a client's loader
  shuffles its data into fixed-size batches (the last one smaller); ``q`` is taken as clients per round / training
  clients and batch size / training samples. Opacus and Flower make the same approximation when they are fed such
  samplers; the reported epsilon is the standard one for this practice, not a proof for fixed-size sampling.
- Deviation: DP-FedAvg divides by a fixed expected weight; here, as in Flower, the noise is scaled by the number
  ``m`` of updates actually aggregated in the round (after quarantined or failed clients are left out).
- The noise is pseudo-random from the run's seed (``federation.seed``), so a run is reproducible and every process
  that runs the server draws the same noise. Whoever knows the seed can regenerate the noise: keep the seed secret
  from the adversary in a real deployment.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch
from lightning.pytorch import Callback
from torch import Tensor, nn
from typing_extensions import override

from fedlit.errors import ConfigError

if TYPE_CHECKING:
    from fedlit.strategies.base import ClientUpdate

ACCOUNTANT = "opacus.accountants.RDPAccountant"
_INSTALL = "pip install 'fedlit[privacy]' (or pip install opacus)"


def _rdp_accountant(history: list[Any] | None = None) -> Any:
    try:
        from opacus.accountants import RDPAccountant
    except ImportError as err:  # an optional dependency: say how to get it
        raise ConfigError(f"The privacy callbacks need Opacus: {_INSTALL}.") from err
    accountant = RDPAccountant()
    accountant.history = [tuple(h) for h in history or []]
    return accountant


def _check_settings(owner: str, noise_multiplier: float, clip: tuple[str, float], delta: float) -> None:
    problems = []
    if not (isinstance(noise_multiplier, (int, float)) and math.isfinite(noise_multiplier) and noise_multiplier > 0):
        problems.append(f"noise_multiplier={noise_multiplier!r} must be a finite number > 0 (the noise std in units "
                        f"of the clipping norm; 0 would give no privacy and an infinite epsilon)")
    name, value = clip
    if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
        problems.append(f"{name}={value!r} must be a finite number > 0")
    if not (isinstance(delta, (int, float)) and 0 < delta < 1):
        problems.append(f"delta={delta!r} must be in (0, 1) (typically below 1 / the number of "
                        f"{'clients' if owner == 'ClientLevelDP' else 'training samples'})")
    if problems:
        raise ConfigError(f"{owner}: " + "; ".join(problems) + ".")


def _warn_uncovered(owner: str, covered: int, trainer: Any) -> None:
    """Warn when a resumed run has rounds that ran without the callback: its epsilon does not cover them."""
    if getattr(trainer, "server_round", 0) > covered:
        warnings.warn(f"{owner}: the checkpoint's rounds {covered + 1}..{trainer.server_round} ran without it, so "
                      "the epsilon it reports covers only the rounds it sees (those rounds had no privacy "
                      "guarantee).", stacklevel=3)


# ----------------------------------------------------------------------------------------------- client level
def clip_update(state: dict[str, Tensor], reference: Mapping[str, Tensor], names: list[str],
                clip_norm: float) -> float:
    """Clip the joint L2 norm of ``state - reference`` over ``names`` to ``clip_norm``, rewriting ``state`` in place.

    Every delta is scaled by ``min(1, clip_norm / ||delta||)``, the norm taken over all of ``names`` together (in
    float64, so a large model's norm is exact enough).

    Returns:
        The norm of the delta before clipping.
    """
    deltas = {n: state[n].detach().to(reference[n].device, torch.float64) - reference[n].double() for n in names}
    norm = math.sqrt(sum(float(d.pow(2).sum()) for d in deltas.values()))
    scale = min(1.0, clip_norm / norm) if norm > 0 else 1.0
    if scale < 1.0:
        for n, d in deltas.items():
            state[n] = (reference[n].double() + d * scale).to(state[n].device, state[n].dtype)
    return norm


def gaussian_noise(shapes: Mapping[str, torch.Size], std: float, seed: int) -> dict[str, Tensor]:
    """Independent N(0, std^2) float32 noise for each tensor shape, in the order of ``shapes``, drawn on the CPU
    from a generator seeded with ``seed``: the same values on every process and device."""
    generator = torch.Generator().manual_seed(seed)
    return {n: torch.normal(0.0, std, size=tuple(s), generator=generator) for n, s in shapes.items()}


class ClientLevelDP(Callback):
    """Client-level differential privacy of the shared parameters (DP-FedAvg, server-side fixed clipping).

    In ``on_before_aggregate`` each client's update delta (its uploaded shared parameters minus the server's
    ``strategy.global_state``) is clipped to L2 norm ``clip_norm`` (jointly over every shared parameter). In
    ``on_after_aggregate`` Gaussian noise N(0, (noise_multiplier * clip_norm / m)^2), m the number of updates
    aggregated, is added to every shared parameter of the new server state. Each round is one step of the sampled
    Gaussian mechanism with sampling rate q = clients per round / training clients; the RDP accountant gives
    epsilon(delta) after each round.

    Defined for strategies whose new server state is the (weighted) mean of the uploads: FedAvg and its subclasses
    that keep its aggregation (FedProx, FedBN, SiloBN, FedSA...) with the default weighted-mean aggregator. Others
    (Local, FedOpt's server optimizers, robust aggregators, SCAFFOLD...) are refused: the noise scale would not
    match what the server computes.

    With ``weighting: uniform`` the mean is unweighted and the noise scale is exact. With ``weighting:
    num_examples`` a client's clipped delta enters the mean with weight w_k / sum(w), so the largest contribution
    is max(w) / sum(w) * clip_norm instead of clip_norm / m; the accountant then uses the round's effective noise
    multiplier noise_multiplier * sum(w) / (m * max(w)) (<= noise_multiplier; logged as
    ``privacy/effective_noise_multiplier``), and a warning says so.

    Shared buffers (BatchNorm's running statistics) are statistics of the clients' data that the clipping and the
    noise do not cover: a model with shared buffers is refused; make them personal (strategy ``FedBN`` or
    ``SiloBN``, or a role rule) or use a normalization without statistics (GroupNorm, LayerNorm).

    Logs per round ``privacy/epsilon``, ``privacy/delta``, ``privacy/clip_norm``, ``privacy/noise_multiplier``,
    ``privacy/effective_noise_multiplier``, ``privacy/clipped_fraction`` (clients whose delta was clipped) and
    ``privacy/sample_rate``; ``results.json`` gets ``privacy.client_level``. The accountant's history is checkpointed,
    so a resumed run reports the same epsilon.

    Args:
        noise_multiplier: z, the noise std in units of ``clip_norm / m`` (> 0).
        clip_norm: C, the bound on the L2 norm of a client's update delta (> 0).
        delta: The delta of the reported (epsilon, delta)-DP (in (0, 1); below 1 / number of clients).
    """

    def __init__(self, noise_multiplier: float, clip_norm: float, delta: float = 1e-5) -> None:
        _check_settings("ClientLevelDP", noise_multiplier, ("clip_norm", clip_norm), delta)
        self.noise_multiplier, self.clip_norm, self.delta = float(noise_multiplier), float(clip_norm), float(delta)
        self.history: list[list[float]] = []  # the accountant's (noise multiplier, sample rate, steps)
        self.rounds = 0
        self._round: dict[str, float] = {}

    def __repr__(self) -> str:
        return (f"ClientLevelDP(noise_multiplier={self.noise_multiplier}, clip_norm={self.clip_norm}, "
                f"delta={self.delta})")

    @override
    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        from fedlit.strategies.aggregators import WeightedMeanAggregator
        from fedlit.strategies.fedavg import FedAvg

        _rdp_accountant()  # Opacus is there
        strategy = trainer.strategy
        cls = type(strategy)
        mean = (isinstance(strategy, FedAvg) and type(strategy.aggregator) is WeightedMeanAggregator
                and all(getattr(cls, m) is getattr(FedAvg, m) for m in ("aggregate", "combine", "client_weights")))
        if not mean:
            raise ConfigError(
                f"ClientLevelDP is defined for strategies whose server state is the weighted mean of the uploads "
                f"(FedAvg and its subclasses that keep its aggregation, with the default aggregator), not for "
                f"{strategy!r}: the noise it adds would not be calibrated to what {cls.__name__} computes. Use "
                "strategy FedAvg, FedProx, FedBN or SiloBN, or remove the callback.")
        buffers = [n for n in strategy.global_state if n not in set(strategy.shared_parameter_names())]
        if buffers:
            raise ConfigError(
                f"ClientLevelDP protects shared parameters only, but the model shares buffers ({buffers[:4]}"
                f"{' ...' if len(buffers) > 4 else ''}: normalization statistics of the clients' data, which "
                "the clipping and the noise do not cover). Make them personal (strategy FedBN or SiloBN, or a "
                "model.init_args.roles rule), or use GroupNorm/LayerNorm instead of BatchNorm.")
        if getattr(strategy, "weighting", "uniform") != "uniform":
            warnings.warn(
                f"ClientLevelDP with {strategy!r}: clients are weighted by their number of examples, so the noise "
                f"(calibrated for the unweighted mean) is smaller than z * the largest weighted contribution; the "
                "accountant uses the round's effective noise multiplier (privacy/effective_noise_multiplier). Set "
                "strategy.init_args.weighting: uniform for the exact calibration.", stacklevel=2)
        _warn_uncovered("ClientLevelDP", self.rounds, trainer)

    def on_before_aggregate(self, trainer: Any, pl_module: Any, server_round: int,
                            updates: list[ClientUpdate]) -> None:
        """Clip each update's delta to ``clip_norm`` (in place) and note the round's weights."""
        strategy = trainer.strategy
        names = strategy.shared_parameter_names()
        norms = [clip_update(u.state, strategy.global_state, names, self.clip_norm) for u in updates]
        weights = strategy.client_weights(updates) if updates else []
        m = len(updates)
        effective = (self.noise_multiplier * sum(weights) / (m * max(weights))
                     if m and max(weights) > 0 else self.noise_multiplier)
        self._round = {"m": m, "clipped": sum(n > self.clip_norm for n in norms), "effective": effective}

    def on_after_aggregate(self, trainer: Any, pl_module: Any, server_round: int,
                           log: dict[str, float] | None = None) -> None:
        """Add the Gaussian noise to the new server state, step the accountant and log the round's privacy."""
        m = int(self._round.get("m", 0))
        if m == 0:
            return
        strategy = trainer.strategy
        names = strategy.shared_parameter_names()
        std = self.noise_multiplier * self.clip_norm / m
        noise = gaussian_noise({n: strategy.global_state[n].shape for n in names}, std,
                               trainer.derive_seed("dp-noise", server_round))
        for n in names:
            target = strategy.global_state[n]
            strategy.global_state[n] = target + noise[n].to(target.device, target.dtype)
        sample_rate = self.sample_rate(trainer)
        accountant = _rdp_accountant(self.history)
        accountant.step(noise_multiplier=self._round["effective"], sample_rate=sample_rate)
        self.history = [list(h) for h in accountant.history]
        self.rounds += 1
        if log is not None:
            log.update({"privacy/epsilon": self.epsilon(), "privacy/delta": self.delta,
                        "privacy/clip_norm": self.clip_norm, "privacy/noise_multiplier": self.noise_multiplier,
                        "privacy/effective_noise_multiplier": self._round["effective"],
                        "privacy/clipped_fraction": self._round["clipped"] / m,
                        "privacy/sample_rate": sample_rate})

    @staticmethod
    def sample_rate(trainer: Any) -> float:
        """q: the clients a round selects / the clients that train."""
        from fedlit.federation import num_selected

        total = len(trainer.train_client_ids)
        return num_selected(trainer.clients_per_round, total) / total

    def epsilon(self) -> float:
        """Epsilon of the rounds so far at ``delta`` (0 before the first round)."""
        return float(_rdp_accountant(self.history).get_epsilon(self.delta)) if self.history else 0.0

    def results_json(self, trainer: Any) -> dict[str, Any]:
        """``results.json``'s ``privacy.client_level``."""
        return {"privacy": {"client_level": {
            "epsilon": self.epsilon(), "delta": self.delta, "noise_multiplier": self.noise_multiplier,
            "clip_norm": self.clip_norm, "rounds": self.rounds, "sample_rate": self.sample_rate(trainer),
            "accountant": ACCOUNTANT, "accountant_history": self.history,
            "mechanism": "DP-FedAvg (McMahan et al., ICLR 2018), server-side fixed clipping"}}}

    @override
    def state_dict(self) -> dict[str, Any]:
        return {"history": [list(h) for h in self.history], "rounds": self.rounds}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.history = [list(h) for h in state_dict["history"]]
        self.rounds = int(state_dict["rounds"])


# ----------------------------------------------------------------------------------------------- sample level
def clip_and_noise(grad_samples: list[Tensor], max_grad_norm: float, noise_std: float,
                   generator: torch.Generator | None = None) -> tuple[list[Tensor], Tensor]:
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
            summed = summed + torch.normal(0.0, noise_std, size=summed.shape, generator=generator,
                                           device=summed.device, dtype=summed.dtype)
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
        _check_settings("SampleLevelDP", noise_multiplier, ("max_grad_norm", max_grad_norm), delta)
        self.noise_multiplier, self.max_grad_norm = float(noise_multiplier), float(max_grad_norm)
        self.delta = float(delta)
        self.epsilons: dict[str, float] = {}  # the latest epsilon of each client, as it uploaded it
        self.rounds = 0
        self._hooks: Any = None
        self._generator: torch.Generator | None = None
        self._turn: dict[str, Any] = {}
        self._round_clipped: list[float] = []

    def __repr__(self) -> str:
        return (f"SampleLevelDP(noise_multiplier={self.noise_multiplier}, max_grad_norm={self.max_grad_norm}, "
                f"delta={self.delta})")

    @override
    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        from fedlit.strategies.base import Strategy
        from fedlit.tasks.survival import CoxModule

        _rdp_accountant()
        problems = []
        if isinstance(pl_module, CoxModule):
            problems.append("the Cox loss is not a mean of per-sample losses (each risk set spans the batch), so "
                            "per-sample gradients are not defined; use ClientLevelDP for survival models")
        strategy = trainer.strategy
        changed = [h for h in ("training_loss", "on_before_optimizer_step", "on_after_backward", "client_forward")
                   if getattr(type(strategy), h) is not getattr(Strategy, h)]
        if changed:
            problems.append(f"strategy {strategy!r} changes the client's gradient ({', '.join(changed)}), which "
                            "DP-SGD's per-sample gradients do not cover; use FedAvg, FedBN, SiloBN, FedSA, Local...")
        if getattr(trainer.fabric.strategy.precision, "scaler", None) is not None:
            problems.append("federation.precision uses a gradient scaler (16-mixed); use bf16-mixed or 32-true")
        layers = module_problems(pl_module)
        if layers:
            problems.append("Opacus cannot compute per-sample gradients of the trainable layers "
                            + "; ".join(layers[:6]) + (" ..." if len(layers) > 6 else "")
                            + " (replace them, or freeze them with a role rule)")
        if problems:
            raise ConfigError("SampleLevelDP: " + "; ".join(problems) + ".")
        _warn_uncovered("SampleLevelDP", self.rounds, trainer)
        if self._hooks is None:
            from opacus.grad_sample import GradSampleHooks

            self._hooks = GradSampleHooks(pl_module, batch_first=True, loss_reduction="mean", strict=False)

    def on_client_fit_start(self, trainer: Any, pl_module: Any, server_round: int, client_id: str) -> None:
        """Start the turn's step count and noise generator; clear any stale per-sample gradient."""
        _reset_hooks_state(pl_module)
        if self._hooks is not None:
            self._hooks.enable_hooks()
        train = trainer.datamodule.num_examples(client_id, "train")
        self._turn = {"steps": 0, "clipped": 0, "samples": 0,
                      "sample_rate": min(1.0, trainer.datamodule.batch_size / max(train, 1))}
        device = next(p.device for p in pl_module.parameters())
        self._generator = torch.Generator(device=device).manual_seed(
            trainer.derive_seed("dp-sgd", server_round, client_id) % 2**63)

    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        """Replace each trainable parameter's gradient by DP-SGD's (:func:`clip_and_noise`)."""
        params = [(n, p) for n, p in pl_module.named_parameters() if p.requires_grad and p.grad is not None]
        missing = [n for n, p in params if not isinstance(getattr(p, "grad_sample", None), Tensor)]
        if missing:
            raise ConfigError(
                f"SampleLevelDP: no per-sample gradient for {missing[:4]} (a trainable parameter used outside a "
                "layer Opacus hooks, a layer in eval mode, or several backward passes per step); its gradient "
                "would not be private. Freeze it with a role rule or restructure the model.")
        if not params:
            return
        grads, norms = clip_and_noise([p.grad_sample for _, p in params], self.max_grad_norm,
                                      self.noise_multiplier * self.max_grad_norm, self._generator)
        for (_, p), grad in zip(params, grads, strict=True):
            p.grad = grad.to(p.dtype)
        self._turn["clipped"] += int((norms > self.max_grad_norm).sum())
        self._turn["samples"] += len(norms)
        _clear_grad_samples(pl_module)

    def on_before_zero_grad(self, trainer: Any, pl_module: Any, optimizer: Any, stepped: bool = True) -> None:
        """Count the optimizer step (one mechanism step) if it happened."""
        self._turn["steps"] = self._turn.get("steps", 0) + int(stepped)
        _clear_grad_samples(pl_module)

    def on_client_fit_end(self, trainer: Any, pl_module: Any, server_round: int, client_id: str,
                          update: ClientUpdate, client_state: dict[str, Any]) -> None:
        """Add the turn's steps to the client's accountant (kept in its ``client_state``) and upload its epsilon.
        A turn left out of aggregation (quarantined, timed out) never gets here: nothing of it is released, so
        nothing is counted."""
        if self._hooks is not None:  # outside a turn (evaluation, unseen clients' fine-tuning) no per-sample work
            self._hooks.disable_hooks()
        accountant = _rdp_accountant(client_state.get("history"))
        for _ in range(self._turn["steps"]):
            accountant.step(noise_multiplier=self.noise_multiplier, sample_rate=self._turn["sample_rate"])
        client_state["history"] = [list(h) for h in accountant.history]
        update.metrics["dp_sample_epsilon"] = float(accountant.get_epsilon(self.delta)) if accountant.history else 0.0
        update.metrics["dp_sample_clipped_fraction"] = self._turn["clipped"] / max(self._turn["samples"], 1)

    def on_before_aggregate(self, trainer: Any, pl_module: Any, server_round: int,
                            updates: list[ClientUpdate]) -> None:
        """Keep each client's epsilon as it uploaded it."""
        if self._hooks is not None:  # also after a turn that stopped before on_client_fit_end
            self._hooks.disable_hooks()
            _clear_grad_samples(pl_module)
        self._round_clipped = []
        for update in updates:
            if "dp_sample_epsilon" in update.metrics:
                self.epsilons[update.client_id] = float(update.metrics["dp_sample_epsilon"])
                self._round_clipped.append(float(update.metrics["dp_sample_clipped_fraction"]))

    def on_after_aggregate(self, trainer: Any, pl_module: Any, server_round: int,
                           log: dict[str, float] | None = None) -> None:
        """Log the max and mean epsilon over the clients that have trained, and the round's clipped fraction."""
        self.rounds += 1
        if log is None or not self.epsilons:
            return
        values = list(self.epsilons.values())
        log.update({"privacy/sample_epsilon_max": max(values), "privacy/sample_epsilon_mean": sum(values) / len(values),
                    "privacy/sample_delta": self.delta, "privacy/sample_noise_multiplier": self.noise_multiplier,
                    "privacy/sample_max_grad_norm": self.max_grad_norm})
        if self._round_clipped:
            log["privacy/sample_clipped_fraction"] = sum(self._round_clipped) / len(self._round_clipped)

    def results_json(self, trainer: Any) -> dict[str, Any]:
        """``results.json``'s ``privacy.sample_level``."""
        values = list(self.epsilons.values())
        return {"privacy": {"sample_level": {
            "epsilon_max": max(values) if values else 0.0,
            "epsilon_mean": sum(values) / len(values) if values else 0.0, "epsilon_per_client": dict(self.epsilons),
            "delta": self.delta, "noise_multiplier": self.noise_multiplier, "max_grad_norm": self.max_grad_norm,
            "accountant": ACCOUNTANT, "mechanism": "DP-SGD (Abadi et al., CCS 2016), Opacus per-sample gradients"}}}

    @override
    def state_dict(self) -> dict[str, Any]:
        return {"epsilons": dict(self.epsilons), "rounds": self.rounds}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.epsilons, self.rounds = dict(state_dict["epsilons"]), int(state_dict["rounds"])


def _clear_grad_samples(module: nn.Module) -> None:
    for p in module.parameters():
        if getattr(p, "grad_sample", None) is not None:
            p.grad_sample = None


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
