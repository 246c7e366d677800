"""Where a command's run lives: run names, versions, ``--run``, ``--ckpt_path last`` and ``best``.

Without ``--out_dir`` a run goes to ``runs/<name>/<version>``: ``--name`` defaults to the recipe's file name plus
the strategy's class name (``quickstart_fedprox``), ``--version`` to the next ``version_<n>`` (an int ``n`` means
``version_<n>``, a string is used as is). ``validate``/``test --run DIR`` rebuild a run from ``DIR/config.json``;
``--ckpt_path best`` names the run's ``checkpoints/best.ckpt``.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

from jsonargparse import ArgumentParser, Namespace

from fedlit.core.errors import CheckpointError, ConfigError
from fedlit.engine.records.run_folder import lock_holder, run_files, run_versions

LAST_KEYWORD = "last"
BEST_KEYWORD = "best"
#: The subcommands that evaluate a checkpoint (they take ``--run``).
EVALUATING = ("validate", "test")


def add_run_arguments(parser: ArgumentParser, subcommand: str) -> None:
    """``--name``, ``--version`` and, for validate and test, ``--run`` (see :func:`run_root`, :func:`expand_run`)."""
    parser.add_argument(
        "--name",
        type=str | None,
        default=None,
        help="Run name: runs go to runs/<name>/<version> (default: <recipe>_<strategy>).",
    )
    parser.add_argument(
        "--version",
        type=int | str | None,
        default=None,
        help="Run version: an int n gives runs/<name>/version_<n>, a string runs/<name>/<string> "
        "(default: the next version_<n>; a taken one is refused).",
    )
    if subcommand in EVALUATING:
        parser.add_argument(
            "--run",
            type=str | None,
            default=None,
            help="A run folder: rebuild the run from its config.json and evaluate its checkpoint "
            "(--ckpt_path last, the default, or best).",
        )


def run_name(cfg: Namespace) -> str:
    """``--name``, or the recipe's file name plus the strategy's class name: ``quickstart_fedprox``; a recipe
    whose name already ends with the strategy keeps its name (``heart_disease_fedavg``)."""
    if cfg.name is not None:
        return check_folder_name("--name", cfg.name)
    recipe = recipe_name(cfg)
    class_path = cfg.strategy.get("class_path") if isinstance(cfg.strategy, Namespace) else None
    strategy = str(class_path or "").rsplit(".", 1)[-1].lower()
    if not strategy or recipe == strategy or recipe.endswith("_" + strategy):
        return recipe
    return f"{recipe}_{strategy}"


def run_root(cfg: Namespace) -> Path:
    """``runs/<name>``: the folder of every version of this run name."""
    return Path("runs") / run_name(cfg)


def version_dir(cfg: Namespace) -> Path | None:
    """``runs/<name>/version_<n>`` (int) or ``runs/<name>/<version>`` (string), or None without ``--version``."""
    version = cfg.version
    if version is None:
        return None
    if isinstance(version, int):
        if version < 0:
            raise ConfigError(f"--version {version} must be >= 0 (or a name such as `baseline`).")
        return run_root(cfg) / f"version_{version}"
    return run_root(cfg) / check_folder_name("--version", version)


def check_folder_name(option: str, value: str) -> str:
    if not value or value in (".", "..") or "/" in value or "\\" in value:
        raise ConfigError(
            f"{option} {value!r} is not a folder name: give a name without slashes (runs go to runs/<name>/<version>)."
        )
    return value


def expand_run(argv: list[str]) -> list[str]:
    """``validate|test --run DIR``: the run's saved configuration (``DIR/config.json``) is given as the first
    ``--config``, so that options after it still apply (``--data.init_args.root`` of moved data, say)."""
    folder = next((argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--run"), None)
    folder = folder or next((a.split("=", 1)[1] for a in argv if a.startswith("--run=")), None)
    if folder is None or not argv or argv[0] not in ("fit", *EVALUATING):
        return argv
    path = Path(folder) / "config.json"
    if argv[0] == "fit":
        raise ConfigError(
            f"--run {folder} is for validate and test. To continue that run: fedlit fit --config "
            f"RECIPE --out_dir {folder} --ckpt_path last."
        )
    if not path.is_file():
        raise ConfigError(
            f"--run {folder}: no config.json there (is it a run folder?). Give the folder of a run "
            "started with `fedlit fit`, or --config RECIPE --ckpt_path FILE.ckpt."
        )
    if any(a == "--config" or a.startswith("--config=") for a in argv):
        raise ConfigError(
            f"--run {folder} rebuilds the run from its config.json: leave out --config (options "
            "such as --data.init_args.root still apply)."
        )
    try:
        saved = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ConfigError(
            f"--run {folder}: {path} is not a readable run configuration ({err}). Restore it from a "
            "copy, or evaluate with --config RECIPE --ckpt_path FILE.ckpt."
        ) from None
    if not isinstance(saved, dict):
        raise ConfigError(
            f"--run {folder}: {path} holds a {type(saved).__name__}, not a run configuration. Restore "
            "it from a copy, or evaluate with --config RECIPE --ckpt_path FILE.ckpt."
        )
    for key in (
        "config",
        "resumed",
        "out_dir",
        "ckpt_path",
        "name",
        "version",
        "run",
        "baseline_run",
        "baseline_compare",
        "__path__",
    ):
        saved.pop(key, None)
    return [argv[0], "--config", json.dumps(saved), *argv[1:]]


def recipe_name(cfg: Namespace) -> str:
    """The stem of the first recipe file (a later ``--config`` refines it: ``--config recipes/fedsca_prostate.yaml
    --config recipes/fedsca_baselines/fedavg.yaml`` is still a ``fedsca_prostate`` run, named with its strategy)."""
    configs = cfg.get("config") or []
    if configs:
        return Path(str(configs[0])).stem
    return "fedlit"


def resolve_best(cfg: Namespace, subcommand: str, out_dir: Path | None) -> tuple[Path, Path]:
    """``--ckpt_path best``: the run's ``checkpoints/best.ckpt`` (the run: ``--run``/``--out_dir``/``--version``,
    else the newest of this name)."""
    if subcommand == "fit":
        raise ConfigError("--ckpt_path best is for validate and test; a run is resumed from --ckpt_path last.")
    if out_dir is None:
        runs = run_versions(run_root(cfg))
        if not runs:
            raise CheckpointError(
                f"--ckpt_path best: no run of this name under {run_root(cfg)}. Give --run DIR "
                "of a run, or --ckpt_path with the path of a .ckpt file."
            )
        out_dir = runs[-1]
    from fedlit.core.checkpoint_io import BEST  # torch: imported when a run is resolved, not for --help

    ckpt = out_dir / "checkpoints" / BEST
    if not ckpt.is_file():
        results = out_dir / "results.json"
        why = ""
        if results.is_file():
            with contextlib.suppress(ValueError, KeyError, TypeError):
                why = f" ({json.loads(results.read_text())['checkpoints']['why_no_best']})"
        raise CheckpointError(
            f"--ckpt_path best: {out_dir} has no {ckpt.name}{why}. Evaluate --ckpt_path last "
            "instead; best.ckpt is saved only by runs with a validation split."
        )
    return out_dir, ckpt


def resolve_run(cfg: Namespace, subcommand: str) -> tuple[Path | None, Path | None]:
    """The run folder and the checkpoint of a command; ``None`` as folder means a new ``runs/<name>/version_<n>``.

    - ``fit``: ``--out_dir`` (or ``--name``/``--version``) as given, else a new version; ``--ckpt_path last``
      resumes the newest run of the name (or the given folder) and never an older one silently.
    - ``validate``/``test``: ``--ckpt_path`` (default ``last``, as for ``fit``; ``best`` for the run's
      ``best.ckpt``) of ``--run`` or the folders above; without them a checkpoint file is evaluated in its own
      run folder.
    """
    from fedlit.core.checkpoint_io import LAST  # torch: imported when a run is resolved, not for --help

    named = [f"--{key} {cfg[key]}" for key in ("name", "version") if cfg[key] is not None]
    if cfg.out_dir and named:
        raise ConfigError(
            f"{' and '.join(named)} and --out_dir {cfg.out_dir}: give one of them (--out_dir is the "
            "whole folder; --name and --version make runs/<name>/<version>)."
        )
    out_dir = Path(cfg.out_dir) if cfg.out_dir else version_dir(cfg)
    if cfg.get("run"):
        if cfg.out_dir or cfg.version is not None or cfg.name is not None:
            raise ConfigError(f"--run {cfg.run} is the run's folder: leave out --out_dir, --name and --version.")
        out_dir = Path(cfg.run)
    ckpt_path = cfg.ckpt_path if cfg.ckpt_path is not None or subcommand == "fit" else LAST_KEYWORD
    if ckpt_path is None:
        return out_dir, None
    if ckpt_path == BEST_KEYWORD:
        return resolve_best(cfg, subcommand, out_dir)
    if ckpt_path != LAST_KEYWORD:
        ckpt = Path(ckpt_path)
        if out_dir is None and subcommand != "fit":
            out_dir = ckpt.parent.parent if ckpt.parent.name == "checkpoints" else ckpt.parent
        return out_dir, ckpt
    option = "--ckpt_path last" if cfg.ckpt_path is not None else f"fedlit {subcommand} (without --ckpt_path)"
    if out_dir is not None:
        ckpt = out_dir / "checkpoints" / LAST
        if not ckpt.is_file():
            holder = lock_holder(out_dir) if out_dir.is_dir() else None
            if holder is None and out_dir.is_dir() and run_files(out_dir):
                raise CheckpointError(
                    f"{option}: no checkpoint at {ckpt}: the run in {out_dir} stopped before its first checkpoint, "
                    f"so there is nothing to resume. Start it again with `fedlit fit` without --ckpt_path (it takes "
                    "over that folder), or give --ckpt_path with the path of a .ckpt file."
                )
            running = f" (the run there is still running, pid {holder.get('pid', '?')})" if holder else ""
            raise CheckpointError(
                f"{option}: no checkpoint at {ckpt}{running}. Run `fedlit fit` into --out_dir {out_dir} first, or "
                "give --out_dir of the run to resume, or --ckpt_path with the path of a .ckpt file."
            )
        return out_dir, ckpt
    root = run_root(cfg)
    runs = run_versions(root)
    if not runs:
        raise CheckpointError(
            f"{option}: no run named {root.name} under {root.parent}. Run `fedlit fit` with this recipe first (with "
            "the same --name or --strategy), or give --out_dir or --run of a run, or --ckpt_path with the path of a "
            ".ckpt file."
        )
    newest = runs[-1]
    ckpt = newest / "checkpoints" / LAST
    if not ckpt.is_file():
        holder = lock_holder(newest)
        state = (
            f"it is still running (pid {holder.get('pid', '?')}) and has not saved one yet"
            if holder
            else "it stopped before its first checkpoint"
        )
        older = [p for p in runs[:-1] if (p / "checkpoints" / LAST).is_file()]
        hint = f" (the newest with one is {older[-1]})" if older else ""
        again = (
            ""
            if holder
            else (
                " It has nothing to resume: `fedlit fit` without --ckpt_path starts the run "
                f"again (with --out_dir {newest}, in its folder)."
            )
        )
        raise CheckpointError(
            f"{option}: the newest run of this name, {newest}, has no checkpoint: {state}. `last` never falls "
            f"back to an older run. Pass --out_dir of an older run{hint}, or --ckpt_path with the path of a "
            f".ckpt file.{again}"
        )
    return newest, ckpt
