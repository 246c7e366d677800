"""Pretrain the frozen setting's backbone centrally, as a stand-in for a foundation model: the ViT of
``recipes/personalized_partitions/frozen_base.yaml`` (its ``name`` and ``model_args``, without LoRA) with a linear
head, trained with AdamW on pooled synthetic images (``fedlit.data.SyntheticImages``) drawn with another seed and
another number of sites than the federation's (public data: the same lesion shapes, other images and acquisitions).
The backbone's ``state_dict`` (timm's names, no head) is saved for the recipe's ``checkpoint_path``.

Run: python benchmarks/synthetic_pretrain.py [--out bench_out/pretrained/synthetic_vit.pt] [--steps 1000]
"""

from __future__ import annotations

import argparse
import time
import warnings
from pathlib import Path

import torch
import yaml
from torch import nn

from fedlit.data import SyntheticImages
from fedlit.models import TimmBackbone

ROOT = Path(__file__).resolve().parents[1]
BASE = ROOT / "recipes" / "personalized_partitions" / "frozen_base.yaml"


def pretrain(
    out: Path,
    *,
    steps: int = 1000,
    seed: int = 1000,
    sites: int = 8,
    per_site: int = 500,
    batch_size: int = 64,
    lr: float = 1e-3,
) -> dict[str, float]:
    """Train the backbone and a head for ``steps`` AdamW steps, save the backbone to ``out``; returns the
    training seconds and the accuracy on held-out images of the same public distribution."""
    spec = yaml.safe_load(BASE.read_text())["model"]["init_args"]
    backbone_args = spec["backbone"]["init_args"]
    torch.manual_seed(seed)
    with warnings.catch_warnings():  # "randomly initialized": what pretraining starts from
        warnings.simplefilter("ignore", UserWarning)
        backbone = TimmBackbone(name=backbone_args["name"], model_args=backbone_args["model_args"]).build()
    model = nn.Sequential(backbone, nn.Linear(backbone.num_features, spec["num_classes"]))
    data = SyntheticImages(
        num_clients=sites, samples_per_client=per_site, num_classes=spec["num_classes"], image_size=16, seed=seed
    ).build()
    generator = torch.Generator().manual_seed(seed)
    order = torch.randperm(len(data.targets), generator=generator)
    held_out, train = order[:500], order[500:]
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.05)
    start = time.perf_counter()
    model.train()
    for _ in range(steps):
        rows = train[torch.randint(len(train), (batch_size,), generator=generator)]
        loss = nn.functional.cross_entropy(model(data.inputs[rows]), data.targets[rows])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    seconds = time.perf_counter() - start
    model.eval()
    with torch.no_grad():
        accuracy = (model(data.inputs[held_out]).argmax(1) == data.targets[held_out]).float().mean().item()
    out.parent.mkdir(parents=True, exist_ok=True)
    torch.save(backbone.state_dict(), out)
    return {"seconds": seconds, "held_out_accuracy": accuracy}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="bench_out/pretrained/synthetic_vit.pt", help="Checkpoint file (.pt).")
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=1000, help="Seed of the public images (not 0, 1, 2).")
    args = parser.parse_args()
    torch.set_num_threads(1)
    result = pretrain(Path(args.out), steps=args.steps, seed=args.seed)
    print(
        f"pretrained {args.out}: {args.steps} steps in {result['seconds']:.0f} s, held-out accuracy "
        f"{result['held_out_accuracy']:.3f}",
        flush=True,
    )


if __name__ == "__main__":
    main()
