"""Export each client's personalized model from a finished run, and load it back.

A checkpoint holds no backbone: the frozen tensors are rebuilt from the recipe. What makes client k's model its
own is the set of trainable tensors it evaluates with: its personal tensors from the client store, plus what the
strategy gives it for evaluation (:meth:`~fedlit.strategies.base.Strategy.configure_evaluate`: the global head
for FedBN, FedDyn's server model, ...), then what ``on_client_evaluate_start`` puts in place (FedMetaMed's personal
model). :func:`export_federation` writes exactly those, per client::

    <out>/<client_id>/model.safetensors   # shared + personal tensors, named as in the FederatedModule
    <out>/<client_id>/export.json         # roles, round, checkpoint, model section of the recipe, metrics
    <out>/<client_id>/adapter/            # only with peft LoRA: adapter_model.safetensors + adapter_config.json
    <out>/<client_id>/inference.safetensors  # the whole model, LoRA merged: plain PyTorch loads it
    <out>/<client_id>/preprocessing.json     # input kind, shape, normalization, class names (tables: columns)

The last two are for inference without fedlit (:mod:`fedlit.commands.export_inference`).

Client ids are safe file names (the data module refuses others, :mod:`fedlit.core.names`); as a second guard,
each client's folder must resolve inside ``<out>`` (no symbolic link out of it), checked for every client before
anything is written.

The ``adapter`` folder is a standard peft adapter (as ``PeftModel.save_pretrained`` writes it) of the backbone
module the LoRA layers were injected into, so ``PeftModel.from_pretrained(plain_backbone, folder)`` rebuilds the
client's adapted backbone without fedlit. It holds the LoRA tensors only; the head and any other trainable tensor
are in ``model.safetensors`` (``export.json`` lists them under ``adapter.not_included``).
"""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch
from jsonargparse import ArgumentParser, Namespace
from safetensors.torch import load_file, save_file
from torch import nn

from fedlit.commands.export_inference import INFERENCE, PREPROCESSING, merged_state_dict, preprocessing
from fedlit.commands.export_load import checkpoint_of, load_run
from fedlit.config.imports import split as split_imports
from fedlit.config.parser import root_parser
from fedlit.core.errors import CheckpointError, ConfigError, DataError
from fedlit.core.files import write_text_atomic
from fedlit.core.names import check_client_ids

if TYPE_CHECKING:
    from fedlit.federation import Federation

WEIGHTS = "model.safetensors"
META = "export.json"
ADAPTER = "adapter"
#: The peft adapter name fedlit's LoRA uses (``inject_adapter_in_model``'s default).
ADAPTER_NAME = "default"


def export_run(
    run_dir: str | Path,
    *,
    ckpt_path: str | Path = "last",
    clients: Iterable[str] | None = None,
    out: str | Path | None = None,
    full: bool = True,
    imports: Iterable[str] = (),
) -> dict[str, Path]:
    """Export every client (or ``clients``) of the run in ``run_dir`` into ``out`` (default ``run_dir/export``),
    from its ``last`` or ``best`` checkpoint or the file ``ckpt_path`` (``imports``: as for :func:`load_run`).

    Returns:
        The folder written for each client.
    """
    path = checkpoint_of(run_dir, ckpt_path)
    fed = load_run(run_dir, path, imports)
    return export_federation(
        fed, Path(out) if out is not None else Path(run_dir) / "export", clients, checkpoint=path, full=full
    )


def export_federation(
    fed: Federation,
    out: str | Path,
    clients: Iterable[str] | None = None,
    *,
    checkpoint: str | Path | None = None,
    full: bool = True,
) -> dict[str, Path]:
    """Write each client's evaluation tensors (see the module docstring) from a set-up :class:`Federation`.

    Args:
        fed: A federation after ``fit``, or after ``setup(ckpt_path)``.
        out: The folder that receives one sub-folder per client.
        clients: The clients to export (default: all).
        checkpoint: Recorded in ``export.json``.
        full: Also write ``inference.safetensors``, the whole model with LoRA merged (frozen tensors included:
            as large as the model, per client).

    Raises:
        ConfigError: If the federation was not set up, or a client is not one of its clients.
        DataError: If a client id is not a safe file name (:mod:`fedlit.core.names`; the data module refuses such
            ids, a federation built around it by hand may not), or its folder would resolve outside ``out`` (a
            symbolic link there): nothing is written then.
    """
    from fedlit.engine.loop.client import load_client

    if not fed.state.identity:  # set by setup(): before it, the store and the strategy hold nothing of the run
        raise ConfigError(
            "export_federation needs a federation after fit() or setup(ckpt_path=...); this one has not been set up."
        )
    wanted = list(fed.client_ids if clients is None else clients)
    unknown = [c for c in wanted if c not in fed.client_ids]
    if unknown:
        raise ConfigError(
            f"--clients: {unknown} are not clients of this run; its clients are {', '.join(fed.client_ids)}."
        )
    folders = _client_folders(Path(out), wanted)
    roles = fed.module.parameter_roles()
    buffers = {n for n, _ in fed.module.named_buffers()}
    evaluated = fed.state.history.rounds.get(fed.state.round, {})
    written = {}
    for client_id in wanted:
        ctx = fed.client_context(client_id)
        load_client(ctx, fed.strategy.configure_evaluate(fed.state.round, client_id))
        ctx.hooks.call(
            "on_client_evaluate_start",
            client_states=ctx.store,
            **ctx.hook_args(),
            server_round=fed.state.round,
            client_id=client_id,
        )  # the model it evaluates
        live = fed.module.named_tensors("shared", "personal")
        tensors = {n: t.detach().cpu().contiguous().clone() for n, t in live.items()}
        folder = folders[client_id]
        folder.mkdir(parents=True, exist_ok=True)
        save_file(tensors, folder / WEIGHTS, metadata={"format": "pt"})
        meta: dict[str, Any] = {
            "client": client_id,
            "round": fed.state.round,
            "checkpoint": str(checkpoint) if checkpoint is not None else None,
            "model": fed.config.get("model", type(fed.module).__qualname__),
            "strategy": repr(fed.strategy),
            "roles": {n: roles[n] for n in tensors},
            "buffers": sorted(n for n in tensors if n in buffers),
            "frozen_fingerprint": fed.state.identity.get("frozen_fingerprint"),
            "metrics": {
                split: _finite(values[client_id]) for split, values in evaluated.items() if client_id in values
            },
        }
        adapters = _peft_modules(fed.module)
        if adapters:
            meta["adapter"] = _save_adapters(adapters, folder, set(tensors))
        meta["inference"] = _save_inference(fed, client_id, folder, full)
        write_text_atomic(folder / META, json.dumps(meta, indent=1))
        written[client_id] = folder
    return written


def _client_folders(out: Path, client_ids: list[str]) -> dict[str, Path]:
    """Each client's folder ``out/<client_id>``, all checked before anything is written: the id is a safe name,
    and the folder, once resolved (symbolic links followed), is a sub-folder of ``out``."""
    check_client_ids(client_ids, "fedlit export: the federation's clients")
    check_out(out)
    root = out.resolve()
    folders = {c: out / c for c in client_ids}
    outside = [
        f"{c!r} -> {f.resolve()}"
        for c, f in folders.items()
        if f.resolve() == root or not f.resolve().is_relative_to(root)
    ]
    if outside:
        raise DataError(
            f"export --out {out}: the folders of clients {', '.join(outside)} are not inside {root} "
            "(a symbolic link?); nothing was written. Remove the links, or export into a new folder."
        )
    return folders


def check_out(out: Path) -> None:
    """Refuse an ``--out`` that is a file, or lies under one, before anything is rebuilt or written."""
    for path in (out, *out.parents):
        if path.exists() or path.is_symlink():
            if path.is_dir():
                return
            where = "is a file" if path == out else f"lies under {path}, which is a file"
            raise ConfigError(
                f"export --out {out} {where}, not a folder: give a folder for the clients' exports (created if "
                f"missing), e.g. --out {path.parent / (path.stem + '_export')}; nothing was written."
            )


def load_export(folder: str | Path, module: nn.Module) -> dict[str, Any]:
    """Copy a client's exported tensors into ``module`` (built as in the run: same recipe, same frozen tensors).

    Strict: every exported tensor must exist in ``module`` with the same shape; tensors of ``module`` that are not
    in the export (the frozen backbone) are left as they are.

    Args:
        folder: A client's export folder (``<run>/export/<client_id>``) or its ``model.safetensors``.
        module: The freshly built module (a :class:`~fedlit.module.FederatedModule`, or any module whose
            parameter and buffer names are the exported ones).

    Returns:
        The export's ``export.json`` (an empty dict if the file is absent).

    Raises:
        CheckpointError: If the folder holds no export, or a tensor is missing in ``module`` or has another shape.
    """
    folder = Path(folder)
    weights = folder if folder.suffix == ".safetensors" else folder / WEIGHTS
    if not weights.is_file():
        raise CheckpointError(
            f"{weights}: no exported model. Give a folder written by `fedlit export` (<run>/export/<client_id>)."
        )
    exported = load_file(weights)
    own = {**dict(module.named_parameters()), **dict(module.named_buffers())}
    missing = [n for n in exported if n not in own]
    wrong = [
        f"{n} {list(t.shape)} in the export, {list(own[n].shape)} in the module"
        for n, t in exported.items()
        if n in own and own[n].shape != t.shape
    ]
    if missing or wrong:
        problems = (
            [f"{len(missing)} exported tensors are not in the module ({', '.join(missing[:3])})"] if missing else []
        ) + ([f"{len(wrong)} tensors differ in shape ({'; '.join(wrong[:3])})"] if wrong else [])
        raise CheckpointError(
            f"{weights} does not fit {type(module).__name__}: " + "; ".join(problems) + ". Build "
            "the module with the model section of the run's recipe (export.json's `model`)."
        )
    with torch.no_grad():
        for name, tensor in exported.items():
            own[name].copy_(tensor)
    meta_file = weights.parent / META
    return json.loads(meta_file.read_text()) if meta_file.is_file() else {}


def _peft_modules(module: nn.Module) -> dict[str, nn.Module]:
    """The sub-modules peft injected LoRA into (they carry peft's ``peft_config``), by qualified name."""
    return {
        name: m
        for name, m in module.named_modules()
        if isinstance(getattr(m, "peft_config", None), Mapping) and ADAPTER_NAME in m.peft_config
    }


def _save_adapters(adapters: Mapping[str, nn.Module], folder: Path, exported: set[str]) -> dict[str, Any]:
    """Write each injected module's LoRA adapter as peft's ``save_pretrained`` would (keys under
    ``base_model.model.``, adapter name removed), so ``PeftModel.from_pretrained(base, folder)`` loads it."""
    from peft import get_peft_model_state_dict

    info: dict[str, Any] = {"folders": {}, "not_included": []}
    covered: set[str] = set()
    for prefix, module in adapters.items():
        target = folder / (ADAPTER if len(adapters) == 1 else f"{ADAPTER}_{prefix.replace('.', '_')}")
        target.mkdir(parents=True, exist_ok=True)
        state = get_peft_model_state_dict(module, adapter_name=ADAPTER_NAME)
        save_file(
            {f"base_model.model.{k}": v.detach().cpu().contiguous().clone() for k, v in state.items()},
            target / "adapter_model.safetensors",
            metadata={"format": "pt"},
        )
        peft_config = cast("dict[str, Any]", module.peft_config)  # set on the module by peft's injection
        peft_config[ADAPTER_NAME].save_pretrained(target)
        info["folders"][target.name] = {"module": prefix, "tensors": len(state)}
        covered |= {f"{prefix}.{n}" for n, _ in module.named_parameters() if ".lora_" in n}
    info["not_included"] = sorted(exported - covered)
    return info


def _save_inference(fed: Federation, client_id: str, folder: Path, full: bool) -> dict[str, Any]:
    """``preprocessing.json`` and (with ``full``) ``inference.safetensors`` of the client's live model; what was
    written, for ``export.json``."""
    info: dict[str, Any] = {"weights": None, "preprocessing": None}
    record = preprocessing(fed.datamodule, client_id)
    if record is not None:
        write_text_atomic(folder / PREPROCESSING, json.dumps(record, indent=1))
        info["preprocessing"] = PREPROCESSING
    if full:
        try:
            state = merged_state_dict(fed.module)
        except TypeError as err:  # LoRA on a convolution: the other files are still written
            warnings.warn(
                f"fedlit export: {client_id}: no {INFERENCE} ({err}); load model.safetensors and the adapter instead.",
                UserWarning,
                stacklevel=3,
            )
            info["why_no_weights"] = str(err)
        else:
            save_file(state, folder / INFERENCE, metadata={"format": "pt"})
            info["weights"] = INFERENCE
    return info


def _finite(values: Mapping[str, float]) -> dict[str, float | None]:
    """Metrics for JSON: NaN (an undefined AUROC on a one-class split) as null."""
    return {k: None if isinstance(v, float) and math.isnan(v) else v for k, v in values.items()}


# ------------------------------------------------------------------------------------------ command
HELP = "Write each client's personalized tensors of a run (safetensors, and a peft adapter with LoRA)."


def parser(name: str = "export") -> ArgumentParser:
    parser = ArgumentParser(description=HELP, exit_on_error=False)
    parser.add_argument("--run", type=str, required=True, help="The run folder (the out_dir of `fedlit fit`).")
    parser.add_argument(
        "--ckpt_path",
        type=str,
        default="last",
        help="`last` (checkpoints/last.ckpt), `best` (checkpoints/best.ckpt) or a .ckpt file.",
    )
    parser.add_argument(
        "--clients", type=str | None, default=None, help="Comma-separated client ids to export (default: every client)."
    )
    parser.add_argument("--out", type=str | None, default=None, help="Output folder (default: <run>/export).")
    parser.add_argument(
        "--import",
        type=str | None,
        default=None,
        dest="import_",
        help="A module or .py file (relative to the current folder) to import before the run is "
        "rebuilt, for classes of your own the run's recorded imports do not find; repeat it "
        "for more. A run's recipe `imports:` are recorded in its config.json and need none.",
    )
    parser.add_argument(
        "--full",
        type=bool,
        default=True,
        help="Also write inference.safetensors per client: the whole model, LoRA merged, frozen "
        "tensors included (as large as the model); `--full false` skips it.",
    )
    return parser


@dataclass
class ExportJob:
    """``fedlit export``: the run rebuilt and restored, ready to write."""

    federation: Federation
    checkpoint: Path
    clients: list[str] | None
    out: Path
    full: bool = True

    def __call__(self) -> dict[str, Path]:
        written = export_federation(self.federation, self.out, self.clients, checkpoint=self.checkpoint, full=self.full)
        print(
            f"fedlit export: round {self.federation.state.round} of {self.checkpoint}, {len(written)} clients "
            f"-> {self.out}",
            flush=True,
        )
        return written


def prepare(cfg: Namespace, imports: Iterable[str] = ()) -> ExportJob:
    """Rebuild the run and restore its checkpoint (configuration errors are raised here, as for the others);
    ``imports``: modules or ``.py`` files to import first (``--import``)."""
    out = Path(cfg.out) if cfg.out else Path(cfg.run) / "export"
    check_out(out)
    ckpt = checkpoint_of(cfg.run, cfg.ckpt_path)
    clients = [c.strip() for c in cfg.clients.split(",") if c.strip()] if cfg.clients else None
    return ExportJob(load_run(cfg.run, ckpt, imports), ckpt, clients, out, cfg.full)


def command(argv: list[str]) -> ExportJob:
    """``fedlit export ...`` parsed and its run rebuilt and restored (configuration errors are raised here)."""
    rest, entries = split_imports(argv)  # --import may be repeated: each is one entry
    cfg = root_parser({"export": (HELP, parser())}).parse_args(rest).export
    return prepare(cfg, [entry.value for entry in entries])
