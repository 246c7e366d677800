"""Gather the FLamby-protocol Fed-Heart-Disease runs into one per-hospital table (docs/recipes.md).

Run after the six recipes, each with ``--out_dir runs/flamby_heart/<strategy>`` (see docs/recipes.md):
``python scripts/flamby_heart_table.py [runs/flamby_heart]``
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

STRATEGIES = {
    "fedavg": "FedAvg",
    "fedprox": "FedProx",
    "fedadam": "FedAdam",
    "fedyogi": "FedYogi",
    "fedadagrad": "FedAdagrad",
    "scaffold": "SCAFFOLD",
}
HOSPITALS = ["cleveland", "hungarian", "switzerland", "va"]


def main(root: Path) -> None:
    print("Test, last round: accuracy / AUROC per hospital\n")
    print("| strategy | " + " | ".join(HOSPITALS) + " | mean accuracy | worst accuracy | mean AUROC | up+down bytes |")
    print("|---|" + "---:|" * (len(HOSPITALS) + 4))
    for key, name in STRATEGIES.items():
        results = json.loads((root / key / "results.json").read_text())
        last, comm, summary = results["last"], results["comm"], results["last"]["summary"]
        clients = last["clients"]
        cells = " | ".join(f"{clients[h]['accuracy']:.3f} / {clients[h]['auroc']:.3f}" for h in HOSPITALS)
        print(
            f"| {name} | {cells} | {summary['accuracy_mean']:.3f} | {summary['accuracy_worst']:.3f} | "
            f"{summary['auroc_mean']:.3f} | {comm['upload_bytes'] + comm['download_bytes']:,} |"
        )


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "runs/flamby_heart"))
