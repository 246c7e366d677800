"""Gather the per-hospital tables of the FedPxN paper's comparison on Fed-Heart-Disease from its run folders.

Run after the nine recipes (see docs/fedpxn_heart.md):  python scripts/fedpxn_heart_table.py [runs/fedpxn_heart]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

STRATEGIES = {
    "fedavg": "FedAvg",
    "fedprox": "FedProx",
    "fedbn": "FedBN",
    "fedpxn": "FedPxN",
    "scaffold": "SCAFFOLD",
    "fedadam": "FedAdam",
    "fedadagrad": "FedAdagrad",
    "fedyogi": "FedYogi",
    "feddyn": "FedDyn",
}
HOSPITALS = ["cleveland", "hungarian", "switzerland", "va"]


def main(root: Path) -> None:
    results = {key: json.loads((root / key / "results.json").read_text()) for key in STRATEGIES}
    for metric, title in (("auroc", "Test AUROC"), ("accuracy", "Test accuracy")):
        print(f"\n### {title} at the round with the best mean validation AUROC\n")
        print("| strategy | round | " + " | ".join(HOSPITALS) + " | mean | worst |")
        print("|---|---:|" + "---:|" * (len(HOSPITALS) + 2))
        for key, name in STRATEGIES.items():
            best = results[key]["best"]
            values = " | ".join(f"{best['clients'][h][metric]:.3f}" for h in HOSPITALS)
            summary = best["summary"]
            print(
                f"| {name} | {best['round']} | {values} | {summary[metric + '_mean']:.3f} | "
                f"{summary[metric + '_worst']:.3f} |"
            )
    print("\n### Test AUROC at the last round (15), and communication\n")
    print("| strategy | " + " | ".join(HOSPITALS) + " | mean | worst | upload MB | download MB |")
    print("|---|" + "---:|" * (len(HOSPITALS) + 4))
    for key, name in STRATEGIES.items():
        last, comm = results[key]["last"], results[key]["comm"]
        values = " | ".join(f"{last['clients'][h]['auroc']:.3f}" for h in HOSPITALS)
        print(
            f"| {name} | {values} | {last['summary']['auroc_mean']:.3f} | {last['summary']['auroc_worst']:.3f} | "
            f"{comm['upload_bytes'] / 2**20:.3f} | {comm['download_bytes'] / 2**20:.3f} |"
        )


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "runs/fedpxn_heart"))
