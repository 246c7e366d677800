"""Run the personalized comparison on the synthetic sites and report it: every method's overlay
``recipes/personalized_partitions/synthetic_<method>.yaml`` (after ``synthetic_base.yaml``) for the seeds given,
then ``fedlit report`` over all runs with balanced accuracy, the gain over Local and the standard errors.

Each method is one ``fedlit fit --seeds ...`` process, ``--jobs`` of them at a time; its output goes to
``OUT/<method>.log`` and its runs to ``OUT/<method>/`` (one folder per seed). A method whose runs already finished
(as many ``results.json`` as seeds) is not run again, so an interrupted comparison resumes where it stopped.
Printed: the wall-clock seconds of every method and of the whole, and the report's path. Methods that fedlit
cannot run in this setting are listed in ``SKIPPED`` with the reason, and printed.

``--setting frozen`` is FHBench's setting (a frozen pretrained backbone; LoRA and the head train): the overlays
``frozen_<method>.yaml`` after ``frozen_base.yaml``, whose ViT is first pretrained centrally on synthetic images of
another seed (``synthetic_pretrain.py``, saved as ``OUT/pretrained_vit.pt`` and reused when it exists) and loaded
through the backbone's ``checkpoint_path``.

Run: python benchmarks/personalized_synthetic.py [--out bench_out/personalized_synthetic] [--seeds 0 1 2]
     [--methods local fedavg ...] [--setting scarce|frozen] [--jobs 1]   (about 15 minutes on a 2-core CPU with
     --jobs 2; --setting frozen 35 minutes with --jobs 1 at load average 7-14)
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RECIPES = ROOT / "recipes" / "personalized_partitions"
METHODS = (
    "local",
    "fedavg",
    "fedavg_ft",
    "fedbn",
    "fedper",
    "lg_fedavg",
    "fedrep",
    "fedbabu",
    "apfl",
    "fedala",
    "ditto",
    "pfedme",
    "perfedavg",
    "fedrod",
    "fedfomo",
    "feddbe",
    "fml",
    "ida",
    "apple",
    "pgfed",
    "pgfedmo",
    "fedmetamed",
    "metafed",
)
#: The methods of ``--setting frozen`` (recipes ``frozen_<method>.yaml``).
FROZEN_METHODS = ("local", "fedavg", "fedavg_ft", "apple", "pgfed", "epfl", "fedmetamed")
SKIPPED = {
    "EPFL": "mixes LoRA adapters, and SmallCNN has no LoRA option; it runs with --setting frozen (a frozen "
    "pretrained ViT with LoRA, where every method runs on that model)",
}
FROZEN_SKIPPED = {
    "FedBN": "the frozen ViT's normalization layers (LayerNorm) do not train, so FedBN would be FedAvg",
    "PGFedMo": "PGFed's momentum variant, left out to keep this setting short on a 2-core CPU",
}


def recipe_args(method: str, setting: str | None, checkpoint: Path | None = None) -> list[str]:
    """The ``--config`` arguments of one method in one setting (and the pretrained checkpoint, if any)."""
    if setting == "frozen":
        return [
            "--config",
            str(RECIPES / "frozen_base.yaml"),
            "--config",
            str(RECIPES / f"frozen_{method}.yaml"),
            *([f"--model.init_args.backbone.init_args.checkpoint_path={checkpoint}"] if checkpoint else []),
        ]
    return [
        "--config",
        str(RECIPES / "synthetic_base.yaml"),
        "--config",
        str(RECIPES / f"synthetic_{method}.yaml"),
        *(["--config", str(RECIPES / f"synthetic_{setting}.yaml")] if setting else []),
    ]


def run_method(
    method: str, out: Path, seeds: list[str], setting: str | None = None, checkpoint: Path | None = None
) -> float:
    """``fedlit fit`` of one method over the seeds (skipped when every seed finished); returns its seconds."""
    if len(list((out / method).rglob("results.json"))) >= len(seeds):
        print(f"{method}: done already, not run again", flush=True)
        return 0.0
    start = time.perf_counter()
    command = [
        sys.executable,
        "-m",
        "fedlit",
        "fit",
        *recipe_args(method, setting, checkpoint),
        "--out_dir",
        str(out / method),
        "--seeds",
        *seeds,
    ]
    with (out / f"{method}.log").open("w") as log:
        code = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, check=False).returncode
    seconds = time.perf_counter() - start
    print(
        f"{method}: {'ok' if code == 0 else f'FAILED (exit {code}, see {out / method}.log)'} in {seconds:.0f} s",
        flush=True,
    )
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="bench_out/personalized_synthetic", help="Folder of the runs and report.")
    parser.add_argument("--seeds", nargs="+", default=["0", "1", "2"])
    parser.add_argument(
        "--methods",
        nargs="+",
        choices=sorted({*METHODS, *FROZEN_METHODS}),
        help=f"Default: {' '.join(METHODS)}; with --setting frozen: {' '.join(FROZEN_METHODS)}.",
    )
    parser.add_argument(
        "--setting",
        choices=["scarce", "frozen"],
        help="scarce: a data overlay given last "
        "(synthetic_scarce.yaml: 40 train images per site instead of 160); frozen: the frozen_*.yaml "
        "recipes (a frozen pretrained ViT, LoRA and the head train), after pretraining the ViT.",
    )
    parser.add_argument("--jobs", type=int, default=1, help="Methods run at a time (default 1).")
    args = parser.parse_args()
    frozen = args.setting == "frozen"
    methods, skipped = (FROZEN_METHODS, FROZEN_SKIPPED) if frozen else (METHODS, SKIPPED)
    args.methods = args.methods or list(methods)
    unknown = [m for m in args.methods if m not in methods]
    if unknown:
        parser.error(f"--methods {' '.join(unknown)}: not in this setting's methods ({' '.join(methods)})")
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    for name, why in skipped.items():
        print(f"{name}: not run ({why})")
    start = time.perf_counter()
    checkpoint = out / "pretrained_vit.pt" if frozen else None
    if checkpoint is not None and not checkpoint.is_file():
        subprocess.run(
            [sys.executable, str(ROOT / "benchmarks" / "synthetic_pretrain.py"), "--out", str(checkpoint)],
            cwd=ROOT,
            check=True,
        )
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        list(pool.map(lambda m: run_method(m, out, args.seeds, args.setting, checkpoint), args.methods))
    print(f"all methods: {time.perf_counter() - start:.0f} s wall-clock", flush=True)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "fedlit",
            "report",
            *(str(out / m) for m in args.methods if (out / m).is_dir()),
            "--out",
            str(out / "report"),
            "--metric",
            "balanced_accuracy",
            "--vector",
            "none",
        ],
        cwd=ROOT,
        check=True,
    )


if __name__ == "__main__":
    main()
