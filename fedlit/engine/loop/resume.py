"""What a checkpoint holds, what a resumed run must match, and the run's recorded configuration.

A checkpoint records the run's *identity* beside its state: the strategy (class and settings, as its ``repr``
shows them), the model (class and the shape and dtype of every parameter and buffer), the parameter roles, a
fingerprint of the frozen tensors, the partition manifest and, for runs started from a recipe, the ``model``,
``data``, ``strategy`` and ``federation`` sections of the resolved configuration. Resuming with anything else is
refused with a message that names what differs. Settings that may change on resume are
:data:`~fedlit.engine.loop.settings.RESUMABLE` (declared with each setting); each resume is recorded in
``config.json`` under ``resumed`` (the round it continued from and the keys it changed), the rest of the file
staying the original configuration. A resume into the checkpoint's own run folder that lost its ``metrics.csv`` is
refused (its rows of the rounds so far would be gone for good); one that lost its ``config.json`` warns, and the
file written again from the command's configuration says so (:func:`check_run_files`).

Callbacks may change on resume, except one that reports on the whole run in ``results.json`` (a ``results_json``
method: the privacy callbacks): the checkpoint keeps what each reported, and a resume without one of them is
refused unless ``federation.allow_dropped_callbacks`` is set; then its report is carried into ``results.json``,
marked as covering only the rounds it ran, and later checkpoints carry it on (its state too: a resume that brings
it back goes on from the rounds it ran).
"""

from __future__ import annotations

import hashlib
import json
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from torch import Tensor

from fedlit.core.checkpoint_io import rng_state, save_checkpoint, set_rng_state, snapshot, write_in_background
from fedlit.core.errors import CheckpointError, RunDirError
from fedlit.core.files import write_text_atomic
from fedlit.core.tensors import raw_bytes
from fedlit.engine.loop import optim, placement, ranks
from fedlit.engine.loop.config_diff import config_changes
from fedlit.engine.loop.settings import RESUMABLE
from fedlit.engine.records import record

if TYPE_CHECKING:
    from fedlit.engine.loop.run import Run

#: The parts of a recipe that define the experiment (``out_dir``, ``ckpt_path`` and ``callbacks`` may differ).
SECTIONS = ("model", "data", "strategy", "federation")


def identity(run: Run) -> dict[str, Any]:
    """What a resumed run must share with the checkpoint (plain strings and lists only)."""
    tensors = {**dict(run.module.named_parameters()), **dict(run.module.named_buffers())}
    return {
        "strategy": repr(run.strategy),
        "model": type(run.module).__qualname__,
        "shapes": {n: [*t.shape, str(t.dtype)] for n, t in tensors.items()},
        "roles": dict(run.module.parameter_roles()),
        "frozen_fingerprint": fingerprint(run.module.named_tensors("frozen")),
        "manifest": json.dumps(run.datamodule.manifest(), sort_keys=True),
        "config": json.dumps({k: run.config[k] for k in SECTIONS if k in run.config}, sort_keys=True, default=str),
    }


def save(run: Run, path: str | Path, *more: str | Path, background: bool = False) -> Path:
    """Write everything needed to continue the run exactly to ``path`` (and to each of ``more``, in order), and the
    configuration beside it; return ``path``. Over several ranks every rank calls it: the store entries of every
    rank's clients are gathered, rank 0 writes.

    ``background``: the state is copied now and the files are written by the checkpoint writer thread
    (:func:`fedlit.core.checkpoint_io.write_in_background`) while the run goes on; otherwise they are written when
    this returns."""
    store = run.store.state_dict() if run.fabric.world_size == 1 else ranks.gather_store(run)
    if store is None:  # a rank other than 0
        return Path(path)
    payload = {
        "server_round": run.state.round,
        "identity": run.state.identity,
        "strategy": run.strategy.state_dict(),
        "callbacks": {cb.state_key: cb.state_dict() for cb in run.callbacks[1:]},
        "reports": {
            cb.state_key: cast(Any, cb).results_json(run.server_context())  # reports(cb): it has one
            for cb in run.callbacks[1:]
            if reports(cb)
        },
        "dropped_callbacks": run.state.dropped_callbacks,
        "store": store,
        "history": run.state.history.state_dict(),
        "comm": dict(run.state.comm),
        "compute": dict(run.state.compute),
        "faults": [dict(f) for f in run.state.faults],
        "train_sizes": {r: dict(sizes) for r, sizes in run.state.train_sizes.items()},
        "divergence": {k: v for k, v in run.state.divergence.items() if k in ("round", "loss")},
        "rng": rng_state(),
        "lr_schedule": None if run.lr_schedule is None else run.lr_schedule.state_dict(),
        "timing": record.timing_state(run),
    }
    paths, config = [Path(p) for p in (path, *more)], config_text(run)

    def write(payload: dict[str, Any]) -> None:
        written: set[Path] = set()
        for target in paths:
            save_checkpoint(target, payload)
            if config is not None and target.parent not in written:
                write_config(target.parent, config)
                written.add(target.parent)

    if background:
        frozen = snapshot(payload)
        write_in_background(lambda: write(frozen))
    else:
        write(payload)
    return paths[0]


def restore(run: Run, payload: Mapping[str, Any], ckpt_path: str | Path, *, resuming: bool = False) -> list[str]:
    """Load ``payload`` into ``run`` after checking that it belongs to this run (see the module docstring).

    Args:
        run: The run, set up.
        payload: The checkpoint's content.
        ckpt_path: Where it was read (for the messages).
        resuming: Whether a fit continues from it (rather than an evaluation): only then is a callback that
            reported on the run and is missing now refused (see :func:`check_dropped`).

    Returns:
        The callbacks (``state_key``) that reported on the checkpoint's run and that this run lacks.
    """
    check_identity(payload.get("identity"), run.state.identity, ckpt_path)
    check_tensor_shapes(payload, run.state.identity["shapes"], ckpt_path)
    run.state.round = int(payload["server_round"])
    live = {cb.state_key for cb in run.callbacks[1:]}
    dropped = [key for key in payload.get("reports", {}) if key not in live]
    if resuming:
        check_dropped(dropped, run, ckpt_path)
    carried = dict(payload.get("dropped_callbacks", {}))
    # where a straight run keeps it (fedlit.engine.loop.placement): the checkpoint was read onto the CPU
    run.strategy.load_state_dict(placement.moved(payload["strategy"], run.store.device))
    for cb in run.callbacks[1:]:
        if cb.state_key in payload["callbacks"]:
            cb.load_state_dict(payload["callbacks"][cb.state_key])
        elif cb.state_key in carried:  # dropped by an earlier resume and back now: on from the rounds it ran
            cb.load_state_dict(carried[cb.state_key]["state"])
    run.state.dropped_callbacks = {key: entry for key, entry in carried.items() if key not in live} | {
        key: {"after_round": run.state.round, "state": payload["callbacks"].get(key), "report": payload["reports"][key]}
        for key in dropped
    }
    run.store.load_state_dict(payload["store"])
    run.state.history.load_state_dict(payload["history"])
    run.state.comm = dict(payload["comm"])
    run.state.compute = dict(payload.get("compute", {"eval_finetune_steps": 0}))
    run.state.faults = [dict(f) for f in payload.get("faults", [])]
    run.state.train_sizes = {r: dict(sizes) for r, sizes in payload.get("train_sizes", {}).items()}
    run.state.divergence = dict(payload.get("divergence", {}))
    set_rng_state(payload["rng"])
    optim.restore_round_schedule(run.lr_schedule, payload)
    record.load_timing(run, payload.get("timing"))
    return dropped


def check_tensor_shapes(payload: Mapping[str, Any], shapes: Mapping[str, list[Any]], ckpt_path: str | Path) -> None:
    """Refuse a checkpoint whose model tensors (the strategy's global state, the store's initial and client
    tensors) do not have the model's shapes, though its recorded identity matches (a file edited or damaged).

    Raises:
        CheckpointError: naming the file, the first such tensor (where it is in the checkpoint) and both shapes.
    """
    store = payload.get("store") or {}
    strategy = payload.get("strategy")
    places: list[tuple[str, Any]] = [
        ("strategy.global_state", strategy.get("global_state") if isinstance(strategy, Mapping) else None),
        ("store.initial", store.get("initial")),
        *((f"store.tensors.{client}", tensors) for client, tensors in (store.get("tensors") or {}).items()),
    ]
    for where, tensors in places:
        if not isinstance(tensors, Mapping):
            continue
        for name, tensor in tensors.items():
            expected = shapes.get(name)
            if expected is None or not isinstance(tensor, Tensor) or list(tensor.shape) == expected[:-1]:
                continue
            raise CheckpointError(
                f"ckpt_path: {ckpt_path}: tensor {where}.{name} has shape {list(tensor.shape)}, the model's "
                f"{name} has shape {expected[:-1]} (and so does the checkpoint's own record of the model): the file "
                "was edited or damaged. Resume from another checkpoint (best.ckpt, a copy), or start a new run "
                "without --ckpt_path."
            )


def reports(callback: Any) -> bool:
    """Whether ``callback`` reports on the whole run in ``results.json`` (a ``results_json`` method): a resume may
    not drop it silently."""
    return callable(getattr(callback, "results_json", None))


def check_dropped(dropped: list[str], run: Run, ckpt_path: str | Path) -> None:
    """Refuse to resume without callbacks that reported on the checkpoint's run (``dropped``), unless
    ``federation.allow_dropped_callbacks`` is set; then warn."""
    if not dropped:
        return
    names, last = ", ".join(dropped), run.state.round
    if not run.settings.allow_dropped_callbacks:
        raise CheckpointError(
            f"ckpt_path: {ckpt_path} was saved by a run with the callbacks {names}, which this run lacks: its rounds "
            f"after {last} would run without them (for a privacy callback: released without noise) and results.json "
            "would lose what they reported. Give the callbacks again with the same settings (the run's config.json "
            "lists them), or set federation.allow_dropped_callbacks: true (--federation.allow_dropped_callbacks "
            "true) to go on without them, recorded in config.json and results.json."
        )
    warnings.warn(
        f"federation.allow_dropped_callbacks: resuming {ckpt_path} without {names}: the rounds after {last} "
        f"run without them, and what they report in results.json covers only the rounds up to {last}.",
        stacklevel=4,
    )


def dropped_reports(run: Run) -> dict[str, Any]:
    """The ``results.json`` sections of the callbacks dropped on resume, as they last reported them, each block
    marked with the round after which the callback was dropped and a note that its figures stop there."""
    sections: dict[str, Any] = {}
    for key, entry in run.state.dropped_callbacks.items():
        after = entry["after_round"]
        note = (
            f"{key} was dropped when the run was resumed after round {after} (federation.allow_dropped_callbacks)"
            f": these figures (an epsilon: the privacy spent) cover only the rounds it ran, up to round {after}; "
            f"rounds {after + 1}..{run.state.round} ran without it."
        )
        for section, blocks in entry["report"].items():
            for name, block in blocks.items():
                marked = {**block, "dropped_after_round": after, "note": note} if isinstance(block, Mapping) else block
                sections.setdefault(section, {})[name] = marked
    return sections


def check_identity(saved: Mapping[str, Any] | None, current: Mapping[str, Any], ckpt_path: str | Path) -> None:
    """Raise :class:`CheckpointError` naming every difference between the checkpoint's run and this one."""
    if saved is None:
        raise CheckpointError(
            f"ckpt_path: {ckpt_path} was written by an older fedlit without a record of its "
            "strategy and model, so resuming it cannot be checked. Start a new run."
        )
    problems = []
    if saved["strategy"] != current["strategy"]:
        problems.append(f"the strategy was {saved['strategy']}, now {current['strategy']}")
    if saved["model"] != current["model"]:
        problems.append(f"the model class was {saved['model']}, now {current['model']}")
    else:
        changed = [
            f"{n} {saved['shapes'].get(n)} -> {current['shapes'].get(n)}"
            for n in sorted(set(saved["shapes"]) | set(current["shapes"]))
            if saved["shapes"].get(n) != current["shapes"].get(n)
        ]
        if changed:
            problems.append(f"the model's tensors differ ({len(changed)}: {'; '.join(changed[:3])})")
        elif saved["roles"] != current["roles"]:
            names = [n for n in saved["roles"] if saved["roles"][n] != current["roles"].get(n)]
            problems.append(f"the parameter roles differ ({', '.join(names[:3])})")
        elif saved["frozen_fingerprint"] != current["frozen_fingerprint"]:
            problems.append(
                "the frozen tensors differ (other pretrained weights, or a randomly initialized backbone "
                "built with another seed)"
            )
    if saved["manifest"] != current["manifest"]:
        problems.append(
            "it was made with another data partition (the manifest of which client holds which sample differs)"
        )
    before, now = json.loads(saved["config"]), json.loads(current["config"])
    if before and now:
        changed = [
            k
            for k in config_changes(before, now)
            if k.split(".")[0] != "federation" or k.split(".")[1] not in RESUMABLE
        ]
        if changed:
            problems.append(
                "the configuration differs in "
                + ", ".join(f"{k} ({_short(_get(before, k))} -> {_short(_get(now, k))})" for k in changed[:5])
            )
    if problems:
        raise CheckpointError(
            f"ckpt_path: {ckpt_path} belongs to another run: " + "; ".join(problems) + ". Resume "
            "with the settings of that run (only federation."
            + ", federation.".join(sorted(RESUMABLE))
            + " may change), or start a new run without --ckpt_path."
        )


def save_config(run: Run, folder: Path | None = None) -> None:
    """``config.json``: the original configuration, plus a ``resumed`` entry per resume."""
    text = config_text(run)
    if text is not None:
        write_config(folder or run.out_dir, text)


def config_text(run: Run) -> str | None:
    """What :func:`save_config` writes (None: a run without a recorded configuration writes nothing)."""
    return json.dumps(run.config, indent=1, default=str) if run.config else None


def write_config(folder: Path, text: str) -> None:
    """Write ``folder/config.json`` (atomically)."""
    folder.mkdir(parents=True, exist_ok=True)
    write_text_atomic(folder / "config.json", text)


def record_resume(run: Run, folder: Path, dropped: list[str] | None = None) -> None:
    """On resume, keep the original ``config.json`` and add this resume to its ``resumed`` list, with the
    callbacks it ``dropped`` (see :func:`check_dropped`)."""
    path = folder / "config.json"
    if not run.config:
        return
    original = json.loads(path.read_text()) if path.is_file() else {}
    resumed = list(original.pop("resumed", []))
    if original:
        entry: dict[str, Any] = {
            "from_round": run.state.round,
            "changed": {k: [_get(original, k), _get(run.config, k)] for k in config_changes(original, run.config)},
        }
        if dropped:
            entry["dropped_callbacks"] = list(dropped)
        resumed.append(entry)
        run.config = {**original, "resumed": resumed}


def check_run_files(run: Run, ckpt_path: str | Path) -> None:
    """Before a fit resumed from ``ckpt_path`` writes anything (rank 0): the run folder still holds what the rounds
    so far recorded.

    Raises:
        RunDirError: when the checkpoint lies in the run folder, which lost its ``metrics.csv``: a new one would
            hold only the rounds after the checkpoint's. (Resumed into another folder, that is said in a warning.)
    """
    folder, last = run.out_dir, run.state.round
    metrics = folder / record.CSV_NAME
    own = Path(ckpt_path).resolve().is_relative_to(folder.resolve())  # its checkpoints/, not a copy elsewhere
    earlier = "round 1" if last == 1 else f"rounds 1..{last}"
    if last > 0 and not metrics.is_file():
        if own:
            raise RunDirError(
                f"{metrics} is missing: resuming {ckpt_path} (round {last}) would start a new one at round "
                f"{last + 1}, without the rows of {earlier}. Restore it from a copy; or, to go on with a "
                f"metrics.csv of the rounds after {last} only, create it empty (touch {metrics}) and resume again."
            )
        warnings.warn(
            f"{metrics} starts at round {last + 1}: the rows of {earlier} are in the metrics.csv of the run of "
            f"{ckpt_path}.",
            stacklevel=3,
        )
    if own and run.config and not (folder / "config.json").is_file():
        warnings.warn(
            f"{folder / 'config.json'} is missing: it is written again from this command's configuration (the "
            "checkpoint's own record matches it but for settings a resume may change, whose first values are "
            "lost), marked config_json_missing in its `resumed` entry.",
            stacklevel=3,
        )
        resumed = [*run.config.get("resumed", []), {"from_round": last, "config_json_missing": True}]
        run.config = {**run.config, "resumed": resumed}


def fingerprint(tensors: Mapping[str, Tensor]) -> str:
    """A SHA-256 of the frozen tensors (names, shapes, bytes): checkpoints hold no backbone, so a resumed run must
    rebuild the very same one."""
    digest = hashlib.sha256()
    for name, tensor in tensors.items():
        digest.update(f"{name}:{tuple(tensor.shape)}:{tensor.dtype}".encode())
        digest.update(raw_bytes(tensor))  # type: ignore[arg-type]  # numpy stubs: ndarray is a Buffer on 3.12+ only
    return digest.hexdigest()


def _get(config: Mapping[str, Any], dotted: str) -> Any:
    node: Any = config
    for part in dotted.split("."):
        node = node.get(part) if isinstance(node, Mapping) else None
    return node


def _short(value: Any) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= 40 else text[:37] + "..."
