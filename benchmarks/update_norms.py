"""How far honest update norms spread within a round: the measurement behind a Flower deployment's default
``federation.max_update_norm_vs_median``.

For each recipe a deployment runs (the quickstart of ``docs/deployment.md``'s steps, 2 and 4 sites; Fed-Heart-Disease
with 2, 3 and 4 hospitals, FedAvg and FedProx), several seeds, every round: each client's update norm over the median
norm of the round's other clients (the ratio the bound compares with k), all clients honest. Prints the largest ratio
per configuration and over all, and the quantiles.

    python benchmarks/update_norms.py [--seeds 3] [--quick]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import warnings
from pathlib import Path
from typing import Any

from fedlit.engine.loop import rounds, screening

ROOT = Path(__file__).resolve().parents[1]
HEART = ROOT.parent / "shared" / "data" / "heart_disease"

#: (name, recipe, overrides) of each configuration measured.
CONFIGURATIONS = [
    ("quickstart 2 sites", "quickstart.yaml", ["--data.init_args.num_clients", "2"]),
    ("quickstart 4 sites", "quickstart.yaml", []),
    ("heart FedAvg 2 sites", "heart_disease_fedavg.yaml", ["--data.init_args.sites", "[cleveland,hungarian]"]),
    (
        "heart FedAvg 3 sites",
        "heart_disease_fedavg.yaml",
        ["--data.init_args.sites", "[cleveland,hungarian,switzerland]"],
    ),
    ("heart FedAvg 4 sites", "heart_disease_fedavg.yaml", []),
    ("heart FedProx 4 sites", "heart_disease_fedprox.yaml", []),
    ("heart FedAvg 4 sites, 1 epoch", "heart_disease_fedavg.yaml", ["--federation.local_steps", "null"]),
]


def ratios_of(norms: list[float]) -> list[float]:
    """Each norm over the median of the others (the quantity ``max_update_norm_vs_median`` bounds)."""
    out = []
    for i, norm in enumerate(norms):
        others = [n for j, n in enumerate(norms) if j != i]
        median = statistics.median(others) if others else 0.0
        if median > 0:
            out.append(norm / median)
    return out


def measure(recipe: str, overrides: list[str], seed: int, quick: bool) -> list[float]:
    """The ratios of every client of every round of one run."""
    from fedlit.cli import prepare

    found: list[float] = []
    original = rounds.screen_round

    def recording(updates: Any, sent: Any, sizes: Any, settings: Any) -> Any:
        found.extend(ratios_of([screening.update_norm(u, s) for u, s in zip(updates, sent, strict=True)]))
        return original(updates, sent, sizes, settings)

    rounds.screen_round = recording
    try:
        with tempfile.TemporaryDirectory() as out, warnings.catch_warnings():
            warnings.simplefilter("ignore")
            argv = ["fit", "--config", str(ROOT / "recipes" / recipe), *overrides, "--federation.seed", str(seed)]
            argv += ["--out_dir", out, "--federation.progress_bar", "false", "--federation.eval_every", "1000"]
            if "heart" in recipe:
                argv += ["--data.init_args.root", str(HEART)]
            if quick:
                argv += ["--federation.rounds", "3"]
            prepare(argv)()
    finally:
        rounds.screen_round = original
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="3 rounds per run")
    args = parser.parse_args()
    every: list[float] = []
    for name, recipe, overrides in CONFIGURATIONS:
        found = [r for seed in range(args.seeds) for r in measure(recipe, overrides, seed, args.quick)]
        every += found
        middle = statistics.median(found)
        print(f"{name}: {len(found)} client-rounds, largest ratio {max(found):.3f}, median {middle:.3f}")
    quantiles = statistics.quantiles(every, n=100)
    print(f"all: {len(every)} client-rounds, largest {max(every):.3f}, 99th percentile {quantiles[98]:.3f}")


if __name__ == "__main__":
    main()
