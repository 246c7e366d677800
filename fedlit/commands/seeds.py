"""``fedlit fit --seeds 0 1 2``: one recipe run once per seed, as one experiment.

Each seed is a plain ``fit`` run with ``--federation.seed s`` (and ``--data.init_args.seed s`` when the data
module takes a seed), in its own folder ``<experiment>/seed_<s>``. ``--seeds_vary training`` leaves the data's
seed as the recipe gives it: every seed then trains over the same data split (as FLamby's per-seed results do),
and only the training (model initialization, client sampling, batch order) changes; the default ``all`` re-draws
the split too. A data set whose splits are given (``SiteTable``'s ``split_column``) has the same split either
way. The experiment folder is
``runs/<name>/<version>`` (the next ``version_<n>`` unless ``--version`` is given), or ``--out_dir D``. The seeds
run one after another in this process; each run is seeded and built afresh, so ``seed_1`` holds the same
results as ``fedlit fit --config R.yaml --federation.seed 1 --data.init_args.seed 1 --out_dir DIR``. The
experiment folder's ``experiment.json`` records the seeds, what they vary (``seeds_vary``), the command and the
run folders, and which of them have finished.

``--ckpt_path last`` with ``--seeds`` resumes the experiment of ``--out_dir`` (or ``--name``/``--version``) seed by
seed: a seed whose run finished (``results.json``) is kept and not run again, a seed whose run stopped after a
checkpoint resumes from its last one, and a seed with no checkpoint starts afresh. ``fedlit grid``
(:mod:`fedlit.commands.grid`) resumes its cells this way.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedlit.commands import fit
from fedlit.config.explain import CONFIG_ERRORS, explain
from fedlit.config.parser import load
from fedlit.core.errors import ConfigError, FedlitError
from fedlit.core.files import write_text_atomic

SEEDS = fit.SEEDS
SEEDS_VARY = fit.SEEDS_VARY
EXPERIMENT_FILE = "experiment.json"
#: Options that place a run: the experiment takes them, each seed's run gets its own ``--out_dir``.
_PLACING = ("--out_dir", "--name", "--version")


def requested(argv: list[str]) -> bool:
    """Whether ``argv`` is a ``fit`` with ``--seeds``."""
    return argv[:1] == ["fit"] and any(a == SEEDS or a.startswith(SEEDS + "=") for a in argv)


def split_seeds(argv: list[str]) -> tuple[list[int], list[str]]:
    """The seeds of ``--seeds 0 1 2`` (or ``--seeds=[0,1,2]``) and ``argv`` without them."""
    seeds: list[str] = []
    rest: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == SEEDS:
            i += 1
            while i < len(argv) and not argv[i].startswith("--"):
                seeds.extend(v for v in argv[i].strip("[]").replace(",", " ").split() if v)
                i += 1
            continue
        if arg.startswith(SEEDS + "="):
            seeds.extend(v for v in arg.split("=", 1)[1].strip("[]").replace(",", " ").split() if v)
        else:
            rest.append(arg)
        i += 1
    try:
        values = [int(s) for s in seeds]
    except ValueError:
        raise ConfigError(f"--seeds {' '.join(seeds)}: seeds are integers, e.g. --seeds 0 1 2.") from None
    if not values:
        raise ConfigError("--seeds needs at least one seed, e.g. --seeds 0 1 2.")
    duplicates = sorted({s for s in values if values.count(s) > 1})
    if duplicates:
        raise ConfigError(
            f"--seeds {' '.join(seeds)}: seed {duplicates[0]} is given twice; give each seed once "
            "(each seed is one run folder)."
        )
    return values, rest


def _without(argv: list[str], names: tuple[str, ...]) -> list[str]:
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
            continue
        if arg in names:
            skip = True
            continue
        if any(arg.startswith(n + "=") for n in names):
            continue
        out.append(arg)
    return out


@dataclass
class SeedsJob:
    """The runs of one experiment, prepared: calling it runs each seed in turn and returns their results."""

    seeds: list[int]
    folder: Path
    argvs: dict[int, list[str]]
    command: str
    created: bool
    seeds_vary: str = "all"
    results: dict[int, Any] = field(default_factory=dict)
    finished: list[int] = field(default_factory=list)  # seeds whose run had finished before: not run again

    def run_dir(self, seed: int) -> Path:
        return self.folder / f"seed_{seed}"

    def __call__(self) -> dict[int, Any]:
        print(f"fedlit fit: {len(self.seeds)} seeds ({', '.join(map(str, self.seeds))}) -> {self.folder}", flush=True)
        self._write()
        for seed in self.seeds:
            if seed in self.finished:
                path = self.run_dir(seed) / "results.json"
                print(f"fedlit fit: seed {seed} finished before ({path}): kept", flush=True)
                self.results[seed] = json.loads(path.read_text())
                continue
            try:
                job = fit.prepare(self.argvs[seed])
            except FedlitError:
                raise
            except CONFIG_ERRORS as err:
                raise ConfigError(f"--seeds, seed {seed}: {explain(err)}") from None
            self.results[seed] = job()
            self._write()
        return self.results

    def _write(self) -> None:
        record = {
            "seeds": self.seeds,
            "seeds_vary": self.seeds_vary,
            "command": self.command,
            "runs": {str(s): str(self.run_dir(s)) for s in self.seeds},
            "finished": [s for s in self.seeds if s in self.results],
        }
        self.folder.mkdir(parents=True, exist_ok=True)
        write_text_atomic(self.folder / EXPERIMENT_FILE, json.dumps(record, indent=2) + "\n")


def prepare(argv: list[str]) -> SeedsJob:
    """Check ``fit ... --seeds ...`` and plan one run per seed (configuration errors are raised here)."""
    from fedlit.config import resolve as runnames
    from fedlit.engine.records.run_folder import check_run_dir, checkpoint_files, new_version_dir

    seeds, rest = split_seeds(argv)
    if any(a == "--dry_run" or a.startswith("--dry_run=") for a in rest):
        raise ConfigError(
            "--seeds with --dry_run: --seeds starts one run per seed; --dry_run prints the cost of one "
            "run: leave --seeds out."
        )
    if any(a == "--federation.seed" or a.startswith("--federation.seed=") for a in rest):
        raise ConfigError(
            "--seeds with --federation.seed: --seeds sets federation.seed of each run; leave out --federation.seed."
        )
    sub = load(rest, fit.parser("fit")).options
    resume = sub.ckpt_path is not None
    if resume and sub.ckpt_path != "last":
        raise ConfigError(
            f"--seeds with --ckpt_path {sub.ckpt_path}: an experiment resumes seed by seed from each "
            "run's own last checkpoint; give --ckpt_path last (or resume one seed's run on its own: "
            "fedlit fit --config RECIPE --out_dir EXPERIMENT/seed_<s> --federation.seed <s> "
            "--ckpt_path FILE.ckpt)."
        )
    if sub.federation.devices not in (1, "1") or sub.federation.num_nodes != 1:
        raise ConfigError(
            f"--seeds with federation.devices={sub.federation.devices}, num_nodes="
            f"{sub.federation.num_nodes}: the runs of several processes are launched once per "
            "command. Start one command per seed: fedlit fit --config RECIPE --federation.seed <s> "
            "--out_dir EXPERIMENT/seed_<s>, or use --federation.devices 1."
        )
    named = [f"--{key} {sub[key]}" for key in ("name", "version") if sub[key] is not None]
    if sub.out_dir and named:
        raise ConfigError(
            f"{' and '.join(named)} and --out_dir {sub.out_dir}: give one of them (--out_dir is the "
            "experiment's folder; --name and --version make runs/<name>/<version>)."
        )
    init_args = sub.data.get("init_args")
    data_seed = init_args is not None and "seed" in init_args and sub.seeds_vary == "all"
    folder = Path(sub.out_dir) if sub.out_dir else runnames.version_dir(sub)
    if resume and folder is None:
        raise ConfigError(
            "--seeds with --ckpt_path last resumes an experiment: name its folder with --out_dir "
            "(or --name and --version)."
        )
    if folder is not None and (folder / EXPERIMENT_FILE).exists() and not resume:
        raise ConfigError(
            f"{folder} already holds an experiment ({EXPERIMENT_FILE}). Choose another --out_dir or "
            "--version, or leave --version out for the next version_<n>."
        )
    base = _without(rest, (*_PLACING, SEEDS_VARY, "--ckpt_path"))
    argvs = {}
    for seed in seeds:
        overrides = ["--federation.seed", str(seed)]
        if data_seed:
            overrides += ["--data.init_args.seed", str(seed)]
        argvs[seed] = [*base, *overrides]
    created = folder is None
    if folder is None:
        folder = new_version_dir(runnames.run_root(sub))
    job = SeedsJob(seeds, folder, {}, " ".join(["fedlit", *argv]), created, sub.seeds_vary)
    for seed in seeds:
        run_dir = job.run_dir(seed)
        job.argvs[seed] = [*argvs[seed], "--out_dir", str(run_dir)]
        if resume and (run_dir / "results.json").is_file():
            job.finished.append(seed)
            continue
        stopped = resume and bool(checkpoint_files(run_dir))
        check_run_dir(run_dir, resume=stopped)
        if stopped:
            job.argvs[seed] += ["--ckpt_path", "last"]
    return job
