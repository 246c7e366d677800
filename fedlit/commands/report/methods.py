"""How ``fedlit report`` groups runs into methods: by what they are, not where they sit.

A method is a strategy class with one configuration: the run's ``config.json`` (flattened, ``model.init_args.lr``)
with the strategy's and callbacks' arguments ``results.json`` records (``strategy_hparams``, ``callbacks``) for
the keys ``config.json`` lacks, less what does not change what is run (:data:`NOT_METHOD`: paths, names,
versions, seeds, the progress bar...). Runs of one method are its seeds; two configurations never pool, wherever
their folders sit. The same seed twice in one method (a run made twice) keeps the run that ended last, with a
warning naming both folders: counting one seed twice would shrink the standard error over seeds.

A method is labelled by its class's short name and, where one class ran several configurations, the keys where
they differ (``FedAvg lr=0.1``), each named by the last part of its key that tells it from the others
(``lr``; ``model.lr`` beside ``strategy.lr``). Beyond :data:`MAX_KEYS` differing keys the label is the
experiment's name where it tells the configurations apart (``FedAvg (fedavg_tcga)``). Nothing here draws or
writes."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from fedlit.commands.report.runs import Run, find_runs, flatten, load_run
from fedlit.core.errors import DataError

__all__ = ["MAX_KEYS", "NOT_METHOD", "by_method", "load_runs", "name_methods", "run_names", "setting"]

#: Top-level configuration keys that do not make another method: where a run is written, its name and version,
#: the recipe files read. Keys ending in ``seed`` are left out too: the seeds are the replicates of a method.
#: ``resumed`` (a resume's record) counts only by the keys a resume changed, see :func:`setting`.
NOT_METHOD = ("out_dir", "name", "version", "ckpt_path", "config", "__path__", "resumed")
#: Last parts of keys that change how a run is shown or fed, not what it computes.
NOT_METHOD_LEAVES = ("progress_bar", "loggers", "checkpoint_every", "num_workers")
#: A label lists at most this many differing keys; beyond, the experiment's name where it separates them.
MAX_KEYS = 3
_SHOWN = 24  # characters of a value shown in a label


def load_runs(paths: Sequence[str | Path]) -> tuple[list[Run], list[str]]:
    """The readable runs under ``paths``, grouped into named methods (one run kept per method and seed), and the
    warnings about the others.

    Raises:
        DataError: When no run can be read.
    """
    warnings: list[str] = []
    runs = []
    for folder in find_runs(paths, warnings):
        try:
            runs.append(load_run(folder, warnings))
        except DataError as err:
            warnings.append(str(err))
    if not runs:
        raise DataError(
            "fedlit report: no readable run under "
            + ", ".join(map(str, paths))
            + (" (" + "; ".join(warnings) + ")" if warnings else "")
            + ". Give folders of finished `fedlit fit` runs (they hold results.json)."
        )
    return name_methods(runs, warnings), warnings


def setting(run: Run) -> dict[str, Any]:
    """What the run is, as flattened keys: its configuration less :data:`NOT_METHOD`, its seeds and
    ``strategy.class_path`` (the class is ``strategy_class``), with ``results.json``'s ``strategy_hparams`` for the
    strategy's arguments ``config.json`` does not hold, and what each resume changed (``resumed.<round>.<key>``:
    the new value; a resume that changed nothing leaves the run a seed like the others)."""
    flat = flatten(run.config)
    hparams = run.results.get("strategy_hparams")
    if isinstance(hparams, Mapping):
        for key, value in flatten({"strategy": {"init_args": dict(hparams)}}).items():
            flat.setdefault(key, value)
    for entry in run.config.get("resumed") or []:
        if isinstance(entry, Mapping):
            for key, change in (entry.get("changed") or {}).items():
                new = change[-1] if isinstance(change, list) and change else change
                flat[f"resumed.{entry.get('from_round')}.{key}"] = _text(new)
            if entry.get("dropped_callbacks"):
                flat[f"resumed.{entry.get('from_round')}.dropped_callbacks"] = _text(entry["dropped_callbacks"])
    return {
        k: v
        for k, v in flat.items()
        if k not in NOT_METHOD
        and not k.startswith("__")
        and k != "strategy.class_path"
        and not k.endswith("seed")
        and k.rsplit(".", 1)[-1] not in NOT_METHOD_LEAVES
    }


def _text(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)


def name_methods(runs: list[Run], warnings: list[str] | None = None) -> list[Run]:
    """Set each run's ``method`` (see the module's docstring) and return the runs kept: of two runs of one method
    and seed, the one that ended last (``results.json`` ``ended``; the later one given on a tie), the other named in
    ``warnings``."""
    groups: dict[tuple[str, str], list[Run]] = {}
    for run in runs:
        groups.setdefault((run.strategy_class, _text(setting(run))), []).append(run)
    by_class: dict[str, list[list[Run]]] = {}
    for (cls, _), members in groups.items():
        by_class.setdefault(cls, []).append(members)
    shorts = [cls.rsplit(".", 1)[-1] for cls in by_class]
    for cls, configurations in by_class.items():
        short = cls.rsplit(".", 1)[-1]
        name = short if shorts.count(short) == 1 else cls  # two classes of one short name: the full names
        for members, label in zip(configurations, _labels(configurations), strict=True):
            for run in members:
                run.method = f"{name} {label}".rstrip()
    kept: list[Run] = []
    for members in groups.values():
        by_seed: dict[str, Run] = {}
        for run in members:
            seed = _text(run.seed)
            other = by_seed.get(seed)
            if other is None or run.seed is None:
                by_seed[seed if run.seed is not None else str(run.folder)] = run
                continue
            newer, older = (
                (run, other)
                if str(run.results.get("ended") or "") >= str(other.results.get("ended") or "")
                else (other, run)
            )
            by_seed[seed] = newer
            if warnings is not None:
                warnings.append(
                    f"{older.folder} and {newer.folder}: the same configuration ({run.method}) and seed {run.seed}, "
                    f"a run made twice; only {newer.folder} (ended last) is reported, as one seed counted twice "
                    "would shrink the standard error. Report the other alone to compare the two."
                )
        kept += by_seed.values()
    return [r for r in runs if any(r is k for k in kept)]


def _labels(configurations: Sequence[Sequence[Run]]) -> list[str]:
    """The label of each configuration of one class: its values of the keys where they differ ("" for one)."""
    if len(configurations) == 1:
        return [""]
    settings = [setting(members[0]) for members in configurations]
    keys = sorted({k for s in settings for k in s})
    differ = [k for k in keys if len({_text(s.get(k, "—")) for s in settings}) > 1]
    names = _short_keys(differ)
    recipes = [{r.recipe for r in members} for members in configurations]
    if len(differ) > MAX_KEYS and all(len(r) == 1 for r in recipes) and len({min(r) for r in recipes}) == len(recipes):
        return [f"({min(r)})" for r in recipes]
    for width in (_SHOWN, None):
        labels = [" ".join(f"{names[k]}={_value(k, s.get(k, '—'), width)}" for k in differ) for s in settings]
        if len(set(labels)) == len(labels):
            return labels
    return labels


def _value(key: str, value: Any, width: int | None) -> str:
    text = value if isinstance(value, str) else _text(value)
    if key.endswith("class_path") and isinstance(value, str):
        text = value.rsplit(".", 1)[-1]
    return text if width is None or len(text) <= width else text[: width - 1] + "…"


def _short_keys(keys: Sequence[str]) -> dict[str, str]:
    """Each key by the shortest tail of its parts (``init_args`` and a final ``class_path`` left out) that no other
    key ends with: ``model.init_args.lr`` -> ``lr``, or ``model.lr`` beside ``strategy.init_args.lr``; a resume's
    change (``resumed.<round>.<key>``) as ``resumed@<round>.`` and its key's tail."""
    parts, prefixes = {}, {}
    for key in keys:
        names = [p for p in key.split(".") if p != "init_args"]
        prefixes[key] = f"resumed@{names[1]}." if names[0] == "resumed" and len(names) > 2 else ""
        names = names[2:] if prefixes[key] else names
        parts[key] = names[:-1] if len(names) > 1 and names[-1] == "class_path" else names
    out = {}
    for key, names in parts.items():
        n = next(
            (
                n
                for n in range(1, len(names) + 1)
                if not any(
                    other != key and prefixes[other] == prefixes[key] and o[-n:] == names[-n:]
                    for other, o in parts.items()
                )
            ),
            None,
        )
        out[key] = prefixes[key] + ".".join(names[-n:]) if n is not None else key
    return out


def by_method(runs: Sequence[Run]) -> dict[str, list[Run]]:
    """The runs of each method, in the order the methods first appear."""
    groups: dict[str, list[Run]] = {}
    for run in runs:
        groups.setdefault(run.method, []).append(run)
    return groups


def run_names(runs: Sequence[Run]) -> list[str]:
    """A name per run that tells it from the others: its folder relative to the folder that holds them all
    (``fedavg_lr01/version_0/seed_0``), or its folder's name for one run."""
    parents = [str(r.folder.parent.resolve()) for r in runs]
    try:
        common = Path(os.path.commonpath(parents)) if parents else None
    except ValueError:  # paths on other drives
        common = None
    names = []
    for run in runs:
        try:
            names.append(run.folder.resolve().relative_to(common).as_posix() if common else str(run.folder))
        except ValueError:
            names.append(str(run.folder))
    return names
