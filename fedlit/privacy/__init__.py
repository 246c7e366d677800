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

from fedlit.privacy.accounting import ACCOUNTANT
from fedlit.privacy.client_level import ClientLevelDP, clip_update, gaussian_noise
from fedlit.privacy.sample_level import SampleLevelDP, clip_and_noise, module_problems

__all__ = [
    "ACCOUNTANT",
    "ClientLevelDP",
    "SampleLevelDP",
    "clip_and_noise",
    "clip_update",
    "gaussian_noise",
    "module_problems",
]
