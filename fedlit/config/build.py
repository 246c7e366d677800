"""Building a run from a parsed recipe: the run folder and checkpoint resolved, the objects built in the order
that reports the cheapest mistakes first, the data set up, the :class:`~fedlit.federation.Federation` made (and its
processes launched over several devices); and the objects alone, from a recipe given as a mapping (what a Flower
node builds, without a run folder).
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jsonargparse import ArgumentParser, Namespace

from fedlit.config import imports, resolve
from fedlit.config.parser import Recipe, recipe_parser
from fedlit.engine.loop.settings import Settings, check_seed
from fedlit.engine.records.run_folder import check_run_dir, new_version_dir
from fedlit.federation import Federation


@dataclass
class BuiltRun:
    """A federation built from a recipe, with its checkpoint.

    Attributes:
        federation: The run.
        ckpt_path: The checkpoint to resume or evaluate, or None.
        created: The outermost folder the run makes (its new version folder, or the first missing folder of
            ``out_dir`` and of ``runs/<name>``), removed again if the run leaves no file in it (None: none made).
    """

    federation: Federation
    ckpt_path: Path | None
    created: Path | None


@dataclass(frozen=True)
class DataSection:
    """The recipe's data section, parsed and type-checked but never built: all a Flower server knows of the data.

    The server constructs no data module: a constructor may look for the sites' folders or files, which only the
    nodes hold. The number of clients it waits for comes from the options alone
    (:meth:`~fedlit.data.FederatedDataModule.clients_in_options`).

    Attributes:
        class_path: The data module's class, as the parser resolved it.
        init_args: Its options, defaults included.
    """

    class_path: str
    init_args: dict[str, Any]

    @property
    def name(self) -> str:
        """The class's name."""
        return self.class_path.rsplit(".", 1)[-1]

    def expected_num_clients(self) -> int | None:
        """The number of clients the options give (sites listed, ``num_clients``...), or None."""
        module, _, name = self.class_path.rpartition(".")
        return getattr(importlib.import_module(module), name).clients_in_options(self.init_args)


def build_run(
    recipe: Recipe,
    out_dir: Path | None,
    ckpt_path: Path | None,
    *,
    wrap_data: Callable[[DataSection], Any] | None = None,
) -> BuiltRun:
    """Build the objects of a loaded recipe into its run folder ``out_dir`` (None: a new ``runs/<name>/version_<n>``)
    with the checkpoint ``ckpt_path``, as :func:`fedlit.config.resolve.resolve_run` gave them (configuration errors
    are raised here). With ``wrap_data`` the data section is parsed and validated but not built: what
    ``wrap_data`` returns for its :class:`DataSection` is the run's data module (a Flower server's view of the
    nodes' data, :mod:`fedlit.flower`)."""
    from lightning.fabric.utilities.seed import seed_everything

    from fedlit.engine.loop.ranks import launched_rank_zero

    parser, cfg, subcommand = recipe.parser, recipe.cfg, recipe.subcommand
    sub_cfg = recipe.options
    # Over several processes only the first one checks and makes the run folder; the others take it from rank 0.
    first = (sub_cfg.federation.devices in (1, "1") and sub_cfg.federation.num_nodes == 1) or launched_rank_zero()
    if subcommand == "fit" and out_dir is not None and first:
        check_run_dir(out_dir, resume=ckpt_path is not None)  # refuse a taken folder before the slow part
    config = json.loads(parser.dump(cfg, format="json_indented", skip_none=False, skip_validation=True))[subcommand]
    for key in ("dry_run", "seeds", "seeds_vary"):  # options of fit only: validate/test --run rebuild the run from this
        config.pop(key, None)
    baseline_run = config.pop("baseline_run", None)  # what the run is compared with, not part of it
    baseline_compare = config.pop("baseline_compare", None) or "strict"  # validate has no such option
    # Seed before the objects are built: randomly initialized weights (a frozen random backbone included) and
    # generated data must be the same in a resumed or re-evaluated run as in the original one.
    check_seed(sub_cfg.federation.seed)
    seed_everything(sub_cfg.federation.seed, verbose=False)
    if wrap_data is None:
        objects = instantiate(parser, cfg)[subcommand]
    else:  # the data section stays a description: its constructor never runs here
        section = cfg[subcommand].data
        without_data = cfg.clone()
        without_data[subcommand].data = None
        objects = instantiate(parser, without_data)[subcommand]
        objects.data = wrap_data(DataSection(str(section.class_path), section.init_args.as_dict()))
    objects.data.setup()  # reading and partitioning the data is input: its errors are configuration errors
    created = None
    if out_dir is None:
        root = resolve.run_root(sub_cfg)
        if first:
            missing = first_missing(root)  # runs/<name> of a first run: removed too if the run fails
            out_dir = new_version_dir(root)
            created = missing or out_dir
        else:
            out_dir = created = root / "version_of_rank_0"  # replaced at launch
    elif subcommand == "fit" and first:
        created = first_missing(Path(out_dir))  # the fit makes it: removed again if it fails before writing
    try:
        federation = Federation(
            objects.model,
            objects.data,
            objects.strategy,
            settings=Settings(**objects.federation.as_dict()),
            callbacks=objects.callbacks,
            out_dir=out_dir,
            config=config,
        )
    except BaseException:
        remove_if_empty(created)
        raise
    federation.baseline_run = Path(baseline_run) if baseline_run else None
    federation.baseline_compare = baseline_compare
    if federation.fabric.world_size > 1:
        ckpt_path, created = _launch(federation, ckpt_path, created)
    return BuiltRun(federation, ckpt_path, created)


def _launch(federation: Federation, ckpt_path: Path | None, created: Path | None) -> tuple[Path | None, Path | None]:
    """Start the processes of a run over several devices or nodes (Fabric's own launcher re-runs this command up to
    here in each further local process); every rank then takes rank 0's run folder and checkpoint."""
    try:
        federation.launch()
        out_dir, ckpt = federation.fabric.broadcast((str(federation.out_dir), ckpt_path and str(ckpt_path)))
    except BaseException:
        remove_if_empty(created)
        raise
    if not federation.fabric.is_global_zero:
        remove_if_empty(created)
        created = None
    federation.out_dir = Path(out_dir)
    return (Path(ckpt) if ckpt else None), created


def instantiate(parser: ArgumentParser, cfg: Namespace) -> Namespace:
    """``parser.instantiate_classes(cfg)``, with what a constructor raised unwrapped from jsonargparse's wrappers:
    fedlit's own errors stay one-line configuration errors, anything else (a bug in a user's class) is raised as
    it was, with its traceback."""
    try:
        return parser.instantiate_classes(cfg)
    except Exception as err:
        original = unwrap(err)
        if original is err:
            raise
        raise original from None


def unwrap(err: BaseException) -> BaseException:
    """The exception a constructor raised behind jsonargparse's wrappers (the union and ``Parser key`` errors that
    it chains ``from`` the original), or ``err`` itself."""
    node = err
    while node.__cause__ is not None and _is_wrapper(node):
        node = node.__cause__
    return node


def _is_wrapper(err: BaseException) -> bool:
    text = str(err)
    return type(err).__module__.startswith("jsonargparse") or text.startswith(
        ("Does not validate against any of the Union subtypes", 'Parser key "', "Problem with given class_path")
    )


def first_missing(path: Path) -> Path | None:
    """The outermost folder of ``path`` (itself or a parent) that does not exist yet: what making ``path`` creates
    first; None when ``path`` exists (or cannot be looked up: making it will say why)."""
    missing = None
    try:
        for folder in (path, *path.parents):
            if folder.exists():
                break
            missing = folder
    except OSError:
        return None
    return missing


def remove_if_empty(folder: Path | None) -> None:
    """Remove ``folder`` and the folders in it if none holds a file (folders a run made and did not write into)."""
    if folder is None or not folder.is_dir() or any(files for _, _, files in os.walk(folder)):
        return
    for sub, _, _ in os.walk(folder, topdown=False):  # the innermost first
        with contextlib.suppress(OSError):  # filled meanwhile by another process, or already gone
            os.rmdir(sub)


def build_objects(
    recipe: Mapping[str, Any],
    overrides: list[str] | None = None,
    *,
    folder: Path | None = None,
    where: str = "the recipe",
) -> Namespace:
    """The objects of a recipe given as a mapping (``model``, ``data``, ``strategy``, ``federation``,
    ``callbacks``), with dotted ``overrides`` (``["--data.init_args.root", "/data/site_0"]``) on top: the model,
    data module (not set up), strategy, callbacks, and the federation's :class:`~fedlit.engine.loop.settings.Settings`.
    Seeded by ``federation.seed`` as a run is, so a randomly initialized backbone and generated data are the
    run's. The recipe's ``imports`` (relative to ``folder``, default the current folder) and the ``--import``
    options of ``overrides`` are imported first (:mod:`fedlit.config.imports`); ``where`` names the recipe in
    messages."""
    from lightning.fabric.utilities.seed import seed_everything

    overrides, entries = imports.split(list(overrides or []))
    entries = [*imports.of_recipe(dict(recipe), Path.cwd() if folder is None else Path(folder), where), *entries]
    imports.import_all(entries)
    parser = recipe_parser("fit", "A recipe.")
    sections = {k: v for k, v in recipe.items() if k in ("model", "data", "strategy", "federation", "callbacks")}
    cfg = parser.parse_object(sections)
    if overrides:
        cfg = parser.parse_args(list(overrides), namespace=cfg)
    check_seed(cfg.federation.seed)
    seed_everything(cfg.federation.seed, verbose=False)
    objects = instantiate(parser, cfg)
    objects.federation = Settings(**objects.federation.as_dict())
    return objects
