"""What a round costs with many clients: a sampled round must cost in proportion to the sampled clients, not to N.

A federation of ``--clients`` clients (SyntheticImages, a SmallCNN with a shared backbone and a personal head,
FedAvg) trains ``--rounds`` rounds of one local step each, ``--fraction`` of the clients a round, through
``Federation.fit`` (selection, the turns, aggregation, logging to TensorBoard and ``metrics.csv``, checkpoints every
``--checkpoint-every`` rounds; evaluation every ``--eval-every`` rounds, never by default). In the same process,
after each round (interleaved: load from other processes hits both alike), the same sampled clients' steps run as a
plain PyTorch loop (the floor): per client, its personal tensors and the server's shared ones copied into the one
model, a fresh SGD optimizer, one batch from the data module's DataLoader over its train split, forward, backward,
step, its personal tensors copied back, and a running sum of the shared tensors for the mean. Printed: seconds per
round (median of the rounds but the first, which warms up, and the last, which evaluates every client), per sampled
client, the floor's, their ratio, and the peak RSS of the process.
PyTorch runs on ``--threads`` threads (1 by default: timings on a shared machine vary far less).

Run: python benchmarks/many_clients.py --clients 1000 --fraction 0.1 --rounds 6   (--profile: cProfile's top 30 by
cumulative time over the federated rounds but the first and the last)
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import pstats
import resource
import statistics
import tempfile
import time
import warnings

import torch
from lightning.pytorch import Callback

from fedlit import FedAvg, Federation, RoleRule
from fedlit.data import SyntheticImages
from fedlit.models import SmallCNN
from fedlit.tasks import ClassificationModule


class _RoundClock(Callback):
    """Seconds of each round but the last (from its ``on_round_start`` to the next one's: its checkpoint, written
    after ``on_round_end``, included) and the clients each selected; right after each timed round, the floor's
    round of the same clients, outside the federation's time (interleaved, so that load from other processes hits
    both alike). With a profiler, profiles the rounds but the first and the last (which evaluates every client)."""

    def __init__(self, data: SyntheticImages, rounds: int, profiler: cProfile.Profile | None) -> None:
        self.seconds: list[float] = []
        self.floor_seconds: list[float] = []
        self.selected: list[list[str]] = []
        self.data, self.rounds, self.profiler = data, rounds, profiler
        self._floor: _Floor | None = None
        self._start: float | None = None

    def on_round_start(self, trainer, pl_module, server_round) -> None:  # noqa: ANN001
        if self._start is not None:
            self.seconds.append(time.perf_counter() - self._start)
            if self.profiler is not None:
                self.profiler.disable()
            self._floor = self._floor or _Floor(self.data)
            self.floor_seconds.append(self._floor.round(self.selected[-1]))
        if self.profiler is not None and 1 < server_round < self.rounds:
            self.profiler.enable()
        self._start = time.perf_counter()

    def on_before_aggregate(self, trainer, pl_module, server_round, updates) -> None:  # noqa: ANN001
        self.selected.append([u.client_id for u in updates])


def _module() -> ClassificationModule:
    return ClassificationModule(
        backbone=SmallCNN(width=8),
        num_classes=3,
        lr=0.05,
        roles=[RoleRule("backbone.*", "shared"), RoleRule("head.*", "personal")],
    )


def federated(args: argparse.Namespace, out: str) -> tuple[_RoundClock, SyntheticImages, float]:
    torch.manual_seed(0)
    data = SyntheticImages(
        num_clients=args.clients, samples_per_client=args.samples, image_size=16, seed=0, batch_size=args.batch_size
    )
    profiler = cProfile.Profile() if args.profile else None
    clock = _RoundClock(data, args.rounds, profiler)
    federation = Federation(
        _module(),
        data,
        FedAvg(),
        rounds=args.rounds,
        local_steps=1,
        clients_per_round=args.fraction,
        eval_every=args.eval_every or args.rounds + 1,
        checkpoint_every=args.checkpoint_every,
        accelerator="cpu",
        threads=args.threads,
        progress_bar=False,
        callbacks=[clock],
        out_dir=out,
    )
    start = time.perf_counter()
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        federation.fit()
    if profiler is not None:
        pstats.Stats(profiler).sort_stats("cumulative").print_stats(30)
        if args.profile_out:
            profiler.dump_stats(args.profile_out)
    return clock, data, time.perf_counter() - start


class _Floor:
    """The same clients' one step each as a plain PyTorch loop on one model (see the module docstring)."""

    def __init__(self, data: SyntheticImages) -> None:
        torch.manual_seed(0)
        self.data, self.model = data, _module()
        params = dict(self.model.named_parameters())
        self.shared = {n: p for n, p in params.items() if n.startswith("backbone.")}
        self.personal = {n: p for n, p in params.items() if n.startswith("head.")}
        self.server = {n: p.detach().clone() for n, p in self.shared.items()}
        self.store: dict[str, dict[str, torch.Tensor]] = {}

    def round(self, clients: list[str]) -> float:
        """Seconds of one round of ``clients``."""
        start = time.perf_counter()
        model, shared, personal, server = self.model, self.shared, self.personal, self.server
        total = {n: torch.zeros_like(t) for n, t in server.items()}
        for client_id in clients:
            with torch.no_grad():
                for n, p in shared.items():
                    p.copy_(server[n])
                for n, p in personal.items():
                    p.copy_(self.store.get(client_id, {}).get(n, p))
            optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
            model.train()
            x, y = next(iter(self.data.train_dataloader(client_id, torch.Generator().manual_seed(0))))
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            with torch.no_grad():
                self.store[client_id] = {n: p.detach().clone() for n, p in personal.items()}
                for n, p in shared.items():
                    total[n] += p
        with torch.no_grad():
            for n in server:
                server[n] = total[n] / len(clients)
        return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=1000)
    parser.add_argument("--fraction", type=float, default=0.1)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--samples", type=int, default=10, help="Samples per client.")
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--eval-every", type=int, default=0, help="Evaluate every this many rounds (0: never).")
    parser.add_argument("--checkpoint-every", type=int, default=1000)
    parser.add_argument("--threads", type=int, default=1, help="PyTorch's CPU threads (both loops).")
    parser.add_argument("--profile", action="store_true", help="cProfile's top 30 by cumulative time.")
    parser.add_argument("--profile-out", help="Also save the profile's statistics to this file (pstats).")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as out:
        clock, data, total = federated(args, out)
    rounds = clock.seconds[1:] or clock.seconds  # the first warms up; the last (not timed) evaluates every client
    floors = clock.floor_seconds[1:] or clock.floor_seconds
    fed, base = statistics.median(rounds), statistics.median(floors)
    sampled = len(clock.selected[-1])
    print(
        f"N={args.clients} fraction={args.fraction} ({sampled} clients/round), {args.rounds} rounds, "
        f"fit() {total:.2f} s in all"
    )
    print(
        f"federation: {fed:.3f} s/round, {fed / sampled * 1000:.2f} ms per sampled client (fastest round "
        f"{min(rounds):.3f} s)"
    )
    print(
        f"plain PyTorch floor: {base:.3f} s/round, {base / sampled * 1000:.2f} ms per sampled client (fastest "
        f"round {min(floors):.3f} s)"
    )
    # The fastest rounds' ratio is the steadier one on a loaded machine (other processes only add time).
    print(
        f"ratio {fed / base:.2f} (medians), {min(rounds) / min(floors):.2f} (fastest rounds); peak RSS "
        f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB"
    )


if __name__ == "__main__":
    main()
