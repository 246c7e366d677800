"""FLamby's Fed-Heart-Disease benchmark loop, re-created outside fedlit's federation, as a cross-check.

The FLamby-protocol recipes (``recipes/heart_disease_fed{avg,prox}.yaml``, ``recipes/flamby_heart/*.yaml``) train
the same model with the same settings as FLamby's benchmark, but fedlit draws its batches differently. This script
runs the loop the way FLamby's code does, on the tensors of ``fedlit.data.FedHeartDisease`` (tested equal to
FLamby's preprocessing), so the two can be compared per hospital:

- the model is ``Linear(13, 1)`` built right after ``torch.manual_seed(0)``, followed by a sigmoid, with BCELoss;
- each client has one ``DataLoader(batch_size=4, shuffle=True)`` whose iterator lives across rounds: a round takes
  the next 100 batches and continues the epoch where the previous round stopped; shuffles come from torch's global
  RNG, re-seeded with 0 just before the first round;
- every round all 4 clients take 100 plain SGD steps from the server model; the server takes the sample-weighted
  mean of the client updates (FedAvg, FedProx, SCAFFOLD) or feeds it to Adam / Yogi / Adagrad without bias
  correction (m, v start at 0, tau added to sqrt(v));
- SCAFFOLD keeps, per client, the correction ``c_i - c`` and adds ``(x - y_i) / (K lr)`` to it at the start of each
  round, ``x`` the new server model and ``y_i`` the client's last local model; the local loss subtracts
  ``<correction, params>``, i.e. the gradient gets ``c - c_i``;
- after 15 rounds the final model is evaluated on each hospital's test split.

What this does not re-create: FLamby runs its pooled and local baselines first, in the same process, and builds
every strategy's loaders before re-seeding, so the exact random draws of a FLamby run depend on what ran before.

Run from the repository root (about a minute on 2 cores with ``OMP_NUM_THREADS=1``):
``.venv/bin/python scripts/flamby_heart_reference.py [../shared/data/heart_disease]``
"""

from __future__ import annotations

import copy
import sys

import numpy as np
import torch
from sklearn.metrics import roc_auc_score
from torch.utils.data import DataLoader, TensorDataset

from fedlit.data import FedHeartDisease

CENTERS = ("cleveland", "hungarian", "switzerland", "va")
LOCAL_UPDATES, ROUNDS, BATCH_SIZE, SEED = 100, 15, 4, 0
# FLamby's config_heart_disease.json: client SGD learning rate, server learning rate, FedProx's mu.
SETTINGS = {
    "FedAvg": {"lr": 0.001},
    "FedProx": {"lr": 0.001, "mu": 0.01},
    "FedAdam": {"lr": 0.01, "server_lr": 0.01},
    "FedYogi": {"lr": 0.003162, "server_lr": 0.01},
    "FedAdagrad": {"lr": 0.003162, "server_lr": 0.316228},
    "SCAFFOLD": {"lr": 0.001, "server_lr": 1.0},
}
TAU, BETA_1, BETA_2 = 1e-8, 0.9, 0.999


class _Batches:
    """An endless stream of batches: the loader's iterator is kept, and restarted (reshuffled) when exhausted."""

    def __init__(self, loader: DataLoader) -> None:
        self.loader, self.iterator = loader, iter(loader)

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        try:
            return next(self.iterator)
        except StopIteration:
            self.iterator = iter(self.loader)
            return next(self.iterator)


def run(strategy: str, train: dict, lr: float, server_lr: float = 1.0, mu: float = 0.0) -> list[torch.Tensor]:
    """Train ``strategy`` for ``ROUNDS`` rounds as FLamby's benchmark does; return the final parameters."""
    torch.manual_seed(SEED)
    model = torch.nn.Linear(13, 1)
    streams = [_Batches(DataLoader(TensorDataset(*train[c]), batch_size=BATCH_SIZE, shuffle=True)) for c in CENTERS]
    torch.manual_seed(SEED)
    sizes = np.array([len(train[c][0]) for c in CENTERS], dtype=np.float64)
    weights = sizes / sizes.sum()
    x = [p.detach().clone() for p in model.parameters()]
    m, v = [torch.zeros_like(p) for p in x], [torch.zeros_like(p) for p in x]
    corrections = [[torch.zeros_like(p) for p in x] for _ in CENTERS]
    previous = [[p.clone() for p in x] for _ in CENTERS]
    loss_fn = torch.nn.BCELoss()
    for _ in range(ROUNDS):
        local = []
        for i, stream in enumerate(streams):
            if strategy == "SCAFFOLD":
                step = server_lr * lr * LOCAL_UPDATES
                corrections[i] = [c + (s - p) / step for c, s, p in zip(corrections[i], x, previous[i], strict=True)]
            client = copy.deepcopy(model)
            with torch.no_grad():
                for p, s in zip(client.parameters(), x, strict=True):
                    p.copy_(s)
            optimizer = torch.optim.SGD(client.parameters(), lr=lr)
            for _ in range(LOCAL_UPDATES):
                inputs, targets = stream.next()
                loss = loss_fn(torch.sigmoid(client(inputs)), targets)
                if mu > 0:
                    pairs = zip(client.parameters(), x, strict=True)
                    loss = loss + mu / 2 * sum(((p - s) ** 2).sum() for p, s in pairs)
                if strategy == "SCAFFOLD":
                    loss = loss - sum((p * c).sum() for p, c in zip(client.parameters(), corrections[i], strict=True))
                loss.backward()
                optimizer.step()
                optimizer.zero_grad()
            y = [p.detach().clone() for p in client.parameters()]
            if strategy == "SCAFFOLD":
                y = [server_lr * new + (1 - server_lr) * old for new, old in zip(y, x, strict=True)]
            local.append(y)
        if strategy == "SCAFFOLD":
            previous = local
        delta = [sum(weights[i] * (local[i][j] - x[j]) for i in range(len(CENTERS))) for j in range(len(x))]
        if strategy in ("FedAvg", "FedProx", "SCAFFOLD"):
            x = [s + d for s, d in zip(x, delta, strict=True)]
            continue
        for j, d in enumerate(delta):
            m[j] = BETA_1 * m[j] + (1 - BETA_1) * d
            if strategy == "FedAdam":
                v[j] = BETA_2 * v[j] + (1 - BETA_2) * d * d
            elif strategy == "FedYogi":
                v[j] = v[j] - (1 - BETA_2) * d * d * torch.sign(v[j] - d * d)
            else:  # FedAdagrad
                v[j] = v[j] + d * d
            x[j] = x[j] + server_lr * m[j] / (torch.sqrt(v[j]) + TAU)
    return x


def main(root: str) -> None:
    data = FedHeartDisease(root=root)
    data.setup()
    pool = data.data

    def split(center: str, name: str) -> tuple[torch.Tensor, torch.Tensor]:
        rows = torch.as_tensor(pool.splits[center][name])
        return pool.inputs[rows], pool.targets[rows].reshape(-1, 1)

    train = {c: split(c, "train") for c in CENTERS}
    test = {c: split(c, "test") for c in CENTERS}
    print("Test, last round (15): accuracy / AUROC per hospital, FLamby's loop re-created\n")
    print("| strategy | " + " | ".join(CENTERS) + " | mean accuracy | mean AUROC |")
    print("|---|" + "---:|" * (len(CENTERS) + 2))
    for strategy, settings in SETTINGS.items():
        weight, bias = run(strategy, train, **settings)
        accuracies, aurocs = [], []
        for center in CENTERS:
            inputs, targets = test[center]
            with torch.no_grad():
                probs = torch.sigmoid(inputs @ weight.T + bias).numpy().ravel()
            truth = targets.numpy().ravel()
            accuracies.append(float(((probs > 0.5) == truth).mean()))
            aurocs.append(float(roc_auc_score(truth, probs)))
        cells = " | ".join(f"{a:.3f} / {u:.3f}" for a, u in zip(accuracies, aurocs, strict=True))
        print(f"| {strategy} | {cells} | {np.mean(accuracies):.3f} | {np.mean(aurocs):.3f} |")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "../shared/data/heart_disease")
