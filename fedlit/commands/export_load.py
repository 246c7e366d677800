"""Load a finished run back for :mod:`fedlit.commands.export`: find its checkpoint and rebuild its objects from its
``config.json`` with that checkpoint restored.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from fedlit.commands import fit
from fedlit.core.checkpoint_io import BEST, LAST
from fedlit.core.errors import CheckpointError, ConfigError, broken

if TYPE_CHECKING:
    from fedlit.federation import Federation


def checkpoint_of(run_dir: str | Path, ckpt_path: str | Path = "last") -> Path:
    """The checkpoint to export: ``run_dir/checkpoints/last.ckpt`` or ``best.ckpt`` for ``"last"`` / ``"best"``
    (as for ``fedlit test``), else the file ``ckpt_path``.

    Raises:
        CheckpointError: If the file is missing (the message says which file was tried and what to pass instead).
    """
    option = f"--ckpt_path {ckpt_path}"
    if str(ckpt_path) in ("last", "best"):
        path = Path(run_dir) / "checkpoints" / (LAST if str(ckpt_path) == "last" else BEST)
    else:
        path = Path(ckpt_path)
    if not path.is_file():
        if str(ckpt_path) == "best":
            fix = "Export --ckpt_path last (best.ckpt is saved only by runs with a validation split)"
        else:
            fix = (
                f"Give --run the folder of a run that saved a checkpoint (`fedlit fit ... --out_dir {run_dir}` "
                "writes checkpoints/last.ckpt after each round), or --ckpt_path with the path of a .ckpt file"
            )
        raise CheckpointError(f"{option}: no checkpoint at {path}. {fix}.")
    return path


def load_run(run_dir: str | Path, ckpt_path: str | Path, imports: Iterable[str] = ()) -> Federation:
    """Rebuild a run's objects from its ``config.json`` (as ``fedlit fit`` built them: same seed, so a randomly
    initialized frozen backbone is the same one) and restore ``ckpt_path`` into them.

    Relative paths in the recipe (``data.init_args.root``...) are read from the current folder, as in the run. The
    run's own code (its recipe's ``imports``, recorded in ``config.json``) is imported again; ``imports`` adds
    modules or ``.py`` files (relative to the current folder), as ``--import`` does.

    Raises:
        ConfigError: If ``run_dir`` has no ``config.json`` (a run made from Python rather than a recipe).
        CheckpointError: If the checkpoint does not belong to this configuration.
    """
    run_dir = Path(run_dir)
    config_file = run_dir / "config.json"
    if not config_file.is_file():
        raise ConfigError(
            f"--run {run_dir}: no config.json in that folder, so its model cannot be rebuilt. Give the folder of "
            "a run made with `fedlit fit` (its out_dir); for a run made from Python, call "
            "fedlit.commands.export.export_federation(federation, folder) on the set-up Federation instead."
        )
    config = json.loads(config_file.read_text())
    config.pop("resumed", None)  # the record of resumes is not a setting
    with tempfile.TemporaryDirectory() as tmp:
        recipe = Path(tmp) / "config.json"
        recipe.write_text(json.dumps(config))
        # on the CPU whatever the run used (the accelerator may change on resume too): nothing is computed
        job = fit.prepare(
            [
                "test",
                "--config",
                str(recipe),
                "--out_dir",
                str(run_dir),
                "--ckpt_path",
                str(ckpt_path),
                "--federation.accelerator",
                "cpu",
                "--federation.devices",
                "1",
                *[arg for entry in imports for arg in ("--import", str(entry))],
            ]
        )
    if not isinstance(job, fit.FitJob):
        raise broken("only `fit --dry_run` gives a CostJob")
    fed = job.federation
    fed.settings.progress_bar = False
    fed.setup(ckpt_path)
    return fed
