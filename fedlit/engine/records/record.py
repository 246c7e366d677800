"""What a run records beside its checkpoints: ``metrics.csv``, the run's description, ``best.ckpt``, evaluations.

``metrics.csv`` is written as the run goes, as UTF-8: the rows of a round are appended in one write, flushed and
synced to disk when the round ends (before its checkpoint), so the file of a killed run holds every finished
round, and at most a cut last line, which a resume drops. It is tidy (one value per row), with the columns
:data:`CSV_COLUMNS`:

- ``round``: the server round (from 1);
- ``client``: the client id, or empty for a value of the whole federation (the server);
- ``split``: ``train``, ``val`` or ``test`` for metrics; ``comm`` for communication (bytes) and ``system`` for
  seconds, memory and sizes, ``privacy`` for epsilon and the settings of :mod:`fedlit.privacy`'s callbacks, all on
  server rows; a metric of another evaluation has its section before the
  split: ``global/val`` and ``global/test`` (each client with the strategy's global model, logged as
  ``global/client/<id>/val/<metric>``), ``unseen/test`` and ``unseen_finetuned/test`` (the unseen clients, at
  the last round only; see :mod:`fedlit.engine.loop.evaluate`);
- ``metric``: the metric (``accuracy``, ``loss``...; on server rows of a split, its aggregate over clients:
  ``accuracy_mean``, ``accuracy_wmean``, ``accuracy_worst``; ``upload_bytes``, ``round_seconds``...);
- ``value``: the number.

A resumed run continues the same file after dropping the rows of rounds after its checkpoint (a run killed
after round 5 whose last checkpoint is round 4 would otherwise list round 5 twice).

``checkpoints/best.ckpt`` is a full checkpoint saved at the end of each round whose mean validation value of the
selection metric is the best so far (see :class:`~fedlit.engine.records.history.EvaluationHistory`); a run without a
validation split has none. ``fedlit validate``/``test`` write what they measured to
``evaluations/<split>_<checkpoint>.json`` (``evaluations/test_best.json``...) in the run's folder.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import math
import os
import subprocess
import time
import warnings
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch

from fedlit.core.checkpoint_io import BEST, LAST
from fedlit.core.errors import RunDirError
from fedlit.core.files import write_text_atomic
from fedlit.core.init_args import hparams_of
from fedlit.engine.records import energy
from fedlit.engine.records.history import summarize

if TYPE_CHECKING:
    from fedlit.engine.records.state import RecordedRun

CSV_NAME = "metrics.csv"
CSV_COLUMNS = ("round", "client", "split", "metric", "value")
EVALUATIONS = "evaluations"
_GROUPS = {"comm": "comm", "system": "system", "privacy": "privacy"}  # log prefixes of server rows, not a split
#: Log prefixes of the other evaluations (:mod:`fedlit.engine.loop.evaluate`): their rows' split is
# ``<section>/<split>``.
SECTIONS = ("global", "unseen", "unseen_finetuned")
#: Sections written by the final report only: a resumed run drops them, its own report writes them again.
_FINAL_SECTIONS = ("unseen/", "unseen_finetuned/")


def utc_now() -> str:
    """The current time as ISO 8601 in UTC, to the second (``2026-11-23T11:02:03+00:00``)."""
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def git_state(folder: str | os.PathLike | None = None) -> dict[str, Any] | None:
    """The commit checked out in ``folder`` (default: the working directory) and whether tracked files differ
    from it; None when it is not a git checkout or git is missing (best effort, never raises)."""
    cwd = Path(folder) if folder is not None else Path.cwd()
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=10)
        if head.returncode != 0:
            return None
        status = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    dirty = bool(status.stdout.strip()) if status.returncode == 0 else None
    return {"commit": head.stdout.strip(), "dirty": dirty}


# --------------------------------------------------------------------------------------------- run record
def begin(run: RecordedRun, *, resumed: bool) -> None:
    """At the start of a fit: the run's data files (written by a fit only, an evaluation leaves them alone), its
    start, ``metrics.csv`` (continued at the resumed round) and, on resume, no ``best.ckpt`` from the future. In a
    run over several ranks, rank 0 writes the files (:mod:`fedlit.engine.loop.ranks`)."""
    if not run.fabric.is_global_zero:
        start(run)
        return
    run.out_dir.mkdir(parents=True, exist_ok=True)
    write_text_atomic(run.out_dir / "manifest.json", json.dumps(run.datamodule.manifest()))
    counts = run.datamodule.class_counts()
    if counts is not None:  # classification tasks only
        write_text_atomic(run.out_dir / "class_counts.json", json.dumps(counts, indent=1))
    open_metrics(run)  # first: a metrics.csv that cannot be read stops the resume before anything changes
    start(run)
    if resumed:
        drop_stale_best(run)


def start(run: RecordedRun) -> None:
    """Note the start of a fit (the first start of the run is kept across resumes) and the code it runs."""
    run.state.timing.setdefault("started", utc_now())
    run.state.timing.setdefault("wall_seconds", 0.0)
    run.state.timing["session_start"] = time.perf_counter()
    run.state.timing["git"] = git_state()
    energy.start(run)


def timing_state(run: RecordedRun) -> dict[str, Any]:
    """For a checkpoint: the first start and the wall time of the run so far (earlier sessions included)."""
    return {
        "started": run.state.timing.get("started"),
        "wall_seconds": _wall_seconds(run),
        "energy_kwh": energy.summary(run, run.state.timing.get("energy_kwh", 0.0))["kwh"],
    }


def load_timing(run: RecordedRun, saved: Mapping[str, Any] | None) -> None:
    """Restore :func:`timing_state` from a checkpoint."""
    if saved:
        run.state.timing.update(
            {
                "started": saved.get("started"),
                "wall_seconds": float(saved.get("wall_seconds", 0.0)),
                "energy_kwh": float(saved.get("energy_kwh") or 0.0),
            }
        )


def _wall_seconds(run: RecordedRun) -> float:
    session = run.state.timing.get("session_start")
    return run.state.timing.get("wall_seconds", 0.0) + (time.perf_counter() - session if session is not None else 0.0)


def describe(run: RecordedRun) -> dict[str, Any]:
    """The run's description in ``results.json``: strategy (its ``repr``, class and ``hparams()``), the extra
    callbacks (class and arguments), seed, versions, times."""
    from fedlit.core.version import __version__

    cls = type(run.strategy)
    return {
        "strategy": repr(run.strategy),
        "strategy_class": f"{cls.__module__}.{cls.__qualname__}",
        "strategy_hparams": hparams_of(run.strategy),
        "callbacks": [
            {"class": f"{type(c).__module__}.{type(c).__qualname__}", "hparams": hparams_of(c)}
            for c in run.callbacks[1:]
        ],
        "seed": run.settings.seed,
        "fedlit_version": __version__,
        "git": run.state.timing.get("git"),
        "started": run.state.timing.get("started"),
        "ended": utc_now(),
        "wall_seconds": round(_wall_seconds(run), 3),
        "energy": energy.summary(run, run.state.timing.get("energy_kwh", 0.0)),
        "evaluation_only": _evaluation_only(run),
        "unseen_clients": run.unseen_client_ids,
    }


def _evaluation_only(run: RecordedRun) -> list[str]:
    """The clients that neither train nor are held out as unseen (one set built, not one per client)."""
    others = set(run.train_client_ids) | set(run.unseen_client_ids)
    return [c for c in run.client_ids if c not in others]


# -------------------------------------------------------------------------------------------- images
def image_writers(run: RecordedRun) -> list[Any]:
    """The experiments of the loggers that take images (TensorBoard's ``SummaryWriter``); empty for the others."""
    return [
        cast(Any, logger).experiment
        for logger in run.fabric.loggers  # Fabric's Logger declares no experiment
        if hasattr(getattr(logger, "experiment", None), "add_image")
    ]


def log_validation_images(run: RecordedRun, server_round: int, images: Mapping[str, torch.Tensor]) -> None:
    """Log each client's validation picture (a (3, H, W) image in [0, 1], from the module's
    ``validation_images``) as ``client/<id>/val/overlay``, beside the client's validation scalars."""
    for writer in image_writers(run):
        for client_id, image in images.items():
            writer.add_image(f"client/{client_id}/val/overlay", image.clamp(0, 1), global_step=server_round)


# -------------------------------------------------------------------------------------------- metrics.csv
def open_metrics(run: RecordedRun) -> Path:
    """Start ``metrics.csv`` (a fresh run), or keep its rows up to the resumed round (a resumed run).

    A last line without its newline is a row cut by a kill while it was appended: rows are appended before the
    round's checkpoint is saved, so it belongs to a round after the checkpoint and is dropped (with a warning).

    Raises:
        RunDirError: naming the file, the byte offset and the line when ``metrics.csv`` is not UTF-8 (the file is
            left as it is).
    """
    path = run.out_dir / CSV_NAME
    if not path.is_file():
        _append(path, [CSV_COLUMNS])
        return path
    data = path.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        raise RunDirError(
            f"{path}: not UTF-8 text: byte {err.start} (line {line}) is 0x{data[err.start]:02x}; fedlit writes "
            "this file as UTF-8, so it was edited or damaged. Restore it (or fix that line), or move it away to "
            "start a new one; it was left as it is"
        ) from None
    torn = ""
    if text and not text.endswith("\n"):
        cut = text.rfind("\n") + 1
        text, torn = text[:cut], text[cut:]
        warnings.warn(
            f"{path}: its last line {torn[:80]!r} has no newline (a row cut while it was written, of a "
            "round after the checkpoint): dropped",
            stacklevel=3,
        )
    rows = list(csv.reader(io.StringIO(text, newline="")))
    kept = [
        CSV_COLUMNS,
        *(r for r in rows[1:] if r and _round_of(r) <= run.state.round and not r[2].startswith(_FINAL_SECTIONS)),
    ]
    if len(kept) < len(rows) or torn or not rows:  # not rows: an empty file, given its header
        tmp = path.with_suffix(".csv.tmp")
        with open(tmp, "w", newline="", encoding="utf-8") as file:
            csv.writer(file).writerows(kept)
            file.flush()
            os.fsync(file.fileno())
        os.replace(tmp, path)
    return path


def _append(path: Path, rows: Iterable[Sequence[Any]]) -> None:
    """Append ``rows`` to ``path`` whole: one write of their UTF-8 bytes, then flush and fsync, so a kill or a
    crash leaves at most one cut last line (which :func:`open_metrics` drops on resume), never rows interleaved."""
    buffer = io.StringIO(newline="")
    csv.writer(buffer).writerows(rows)
    with open(path, "ab") as file:
        file.write(buffer.getvalue().encode("utf-8"))
        file.flush()
        os.fsync(file.fileno())


def _round_of(row: list[str]) -> int:
    try:
        return int(row[0])
    except ValueError:
        return 0  # a header: kept once, rewritten as the first row


def round_rows(run: RecordedRun, server_round: int, log: Mapping[str, float]) -> list[tuple[Any, ...]]:
    """The rows of ``server_round``: what the round logged, and the test metrics it recorded (not logged)."""
    rows = [_row(server_round, key, value) for key, value in log.items()]
    for split in ("test", "global/test"):
        per_client = run.state.history.rounds.get(server_round, {}).get(split)
        if not per_client:
            continue
        weights = {c: run.datamodule.num_examples(c, "test") for c in per_client}
        for client, values in per_client.items():
            rows += [(server_round, client, split, m, v) for m, v in values.items()]
        summary = summarize(per_client, weights, run.module.higher_is_better)
        rows += [(server_round, "", split, m, v) for m, v in summary.items()]
    return rows


def _row(server_round: int, key: str, value: Any) -> tuple[Any, ...]:
    """One logged scalar as a row: ``[<section>/]client/<id>/<split>/<metric>``,
    ``[<section>/]server/<split>/<metric>``, ``comm/...``, ``system/...``."""
    group, _, rest = key.partition("/")
    section = ""
    if group in SECTIONS:
        section = f"{group}/"
        group, _, rest = rest.partition("/")
    if group == "client":
        client, split, metric = rest.rsplit("/", 2)
        return (server_round, client, section + split, metric, value)
    if group == "server":
        split, _, metric = rest.partition("/")
        return (server_round, "", section + split, metric, value)
    return (server_round, "", _GROUPS.get(group, ""), rest if group in _GROUPS else key, value)


def append_round(run: RecordedRun, server_round: int, log: Mapping[str, float]) -> None:
    """Append the round's rows to ``metrics.csv`` whole and durably (rank 0 only; see :func:`_append`)."""
    if not run.fabric.is_global_zero:
        return
    _append(run.out_dir / CSV_NAME, [(r, c, s, m, _number(v)) for r, c, s, m, v in round_rows(run, server_round, log)])


def append_final(run: RecordedRun, server_round: int, log: Mapping[str, float]) -> None:
    """Append rows the final report computes (the unseen clients) to ``metrics.csv``, if the run has one."""
    path = run.out_dir / CSV_NAME
    if not path.is_file() or not run.fabric.is_global_zero:
        return
    _append(path, [(r, c, s, m, _number(v)) for r, c, s, m, v in (_row(server_round, k, v) for k, v in log.items())])


def _number(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        value = value.item()
    return "nan" if isinstance(value, float) and math.isnan(value) else value


# -------------------------------------------------------------------------------------------- best.ckpt
def best_path(run: RecordedRun) -> Path:
    """``out_dir/checkpoints/best.ckpt``."""
    return run.out_dir / "checkpoints" / BEST


def is_best(run: RecordedRun, server_round: int) -> bool:
    """Whether ``server_round`` has the best mean validation value so far (its state goes to ``best.ckpt``)."""
    return run.state.history.best_round() == server_round and "val" in run.state.history.rounds.get(server_round, {})


def drop_stale_best(run: RecordedRun) -> None:
    """On resume: remove a ``best.ckpt`` written after the resumed checkpoint (its round is run again)."""
    path = best_path(run)
    if not path.is_file():
        return
    try:
        saved_round = int(torch.load(path, map_location="cpu", weights_only=True, mmap=True)["server_round"])
    except Exception:  # noqa: BLE001  (an unreadable best.ckpt is as good as none)
        saved_round = None
    if saved_round is not None and saved_round <= run.state.round:
        return
    with contextlib.suppress(OSError):
        path.unlink()
    best = run.state.history.best_round()
    if best is not None:
        warnings.warn(
            f"{path} was saved at round {saved_round}, after the resumed checkpoint (round "
            f"{run.state.round}), and is removed; the best validation round so far ({best}) has no "
            "checkpoint, a better round of the resumed run will write one.",
            stacklevel=3,
        )


def checkpoints(run: RecordedRun) -> dict[str, Any]:
    """``results.json``'s ``checkpoints``: the files, relative to ``out_dir``, and why there is no best one."""
    out: dict[str, Any] = {"last": f"checkpoints/{LAST}"}
    if best_path(run).is_file():
        out["best"] = f"checkpoints/{BEST}"
        out["best_round"] = run.state.history.best_round()
    elif run.state.history.best_round() is None:
        out["best"] = None
        out["why_no_best"] = "no validation split (or no finite validation value): the best round is not defined"
    else:
        out["best"] = None
        out["why_no_best"] = "best.ckpt was removed on resume (it came after the resumed checkpoint)"
    return out


# -------------------------------------------------------------------------------------------- evaluations
def write_evaluation(run: RecordedRun, split: str, ckpt_path: str | os.PathLike, result: Mapping[str, Any]) -> Path:
    """Save a checkpoint's evaluation as ``out_dir/evaluations/<split>_<checkpoint name>.json``."""
    from fedlit.core.version import __version__

    folder = run.out_dir / EVALUATIONS
    path = folder / f"{split}_{Path(ckpt_path).stem}.json"
    if not run.fabric.is_global_zero:  # rank 0 writes it
        return path
    folder.mkdir(parents=True, exist_ok=True)
    record = {
        "split": split,
        "checkpoint": str(ckpt_path),
        "evaluated": utc_now(),
        "fedlit_version": __version__,
        **result,
    }
    write_text_atomic(path, json.dumps(record, indent=1))
    return path
