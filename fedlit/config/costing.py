"""What a run costs before it trains: the estimate that ``fedlit cost`` and ``fedlit fit --dry_run`` both print
(:mod:`fedlit.commands.cost`, :mod:`fedlit.commands.fit`; neither command calls the other).

Both build the recipe's model (on the meta device: no memory is allocated and, inside
:func:`~fedlit.models.dry.skip_weight_loading`, no weight file is read), its roles and the strategy
(:meth:`~fedlit.strategies.base.Strategy.configure_roles`), read no data and train nothing, and report:

- the model's tensors, parameters and bytes per role (frozen / shared / personal) under the strategy;
- the clients (from the data module's arguments: :meth:`~fedlit.data.FederatedDataModule.expected_num_clients`)
  and the clients per round (``federation.clients_per_round``);
- per round and over the whole run, the parameters and bytes each client and all clients upload and download,
  counted as the loop counts them (``comm/upload_bytes``, ``comm/download_bytes``, ``comm/eval_download_bytes``;
  :func:`~fedlit.core.tensors.nbytes`): a selected client downloads ``configure_client`` and the extras
  :meth:`~fedlit.strategies.base.Strategy.expected_download_extras` declares (round 1's, then round 2's for
  every later round: pFedMoAP's experts and FedDBE's global mean start in round 2; "per round" figures are a
  later round's) and uploads its ``shared`` tensors plus the extras the strategy adds after training
  (:meth:`~fedlit.strategies.base.Strategy.expected_upload_extras`); every client downloads ``configure_evaluate``
  once per evaluated round, and ``global_model_state`` too where the strategy has one (PGFed, EPFL);
- the local steps a strategy that fine-tunes before evaluating (FedAvg-FT:
  :attr:`~fedlit.strategies.base.Strategy.eval_finetune_steps`) adds, per client and evaluation and over the run.

What a client uploads is what its roles make ``shared``: a strategy that shares a subset (FedSCA's lowest
adapters) is counted by the roles it sets. The figures are those of a run that goes to its last round (an early
stop costs less). ``fedlit cost --compare FedAvg FedProx ...`` adds one row per strategy (built with its
default arguments) and the ratio of its upload to the recipe strategy's.
"""

from __future__ import annotations

import difflib
import importlib
import json
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any, Literal

import torch
from jsonargparse import ArgumentParser, Namespace

from fedlit.config.build import instantiate
from fedlit.config.cost_table import format_table
from fedlit.config.parser import Recipe, subclasses
from fedlit.core.errors import ConfigError, DataError
from fedlit.core.roles import ROLES, ParameterRoles, role_summary
from fedlit.core.seeding import num_selected
from fedlit.core.tensors import nbytes as state_nbytes
from fedlit.core.tensors import numel as state_numel
from fedlit.data import FederatedDataModule
from fedlit.engine.loop.settings import Settings
from fedlit.models.dry import skip_weight_loading
from fedlit.module import FederatedModule
from fedlit.strategies.base import Strategy

__all__ = ["CostJob", "estimate", "estimate_costs"]


# ----------------------------------------------------------------------------------------------- estimate
def estimate_costs(
    module: FederatedModule,
    strategies: Sequence[Strategy],
    *,
    num_clients: int | None,
    clients_per_round: int | float | None = None,
    rounds: int = 1,
    eval_every: int = 1,
) -> dict[str, Any]:
    """The costs of ``module`` under each of ``strategies`` (the first is the reference of the upload ratios).

    Each strategy refines the module's own roles and is initialized (on placeholder client ids, and placeholder
    class counts of the right length) to ask what it sends and receives; the module ends with the roles of the
    first strategy. Nothing is trained.

    Args:
        module: The model (on any device, the meta device included).
        strategies: The strategies to cost, fresh (not yet initialized).
        num_clients: Clients of the federation, or None when unknown.
        clients_per_round: ``federation.clients_per_round``.
        rounds: ``federation.rounds``.
        eval_every: ``federation.eval_every``.

    Returns:
        ``{"clients": {...}, "rounds", "evaluated_rounds", "strategies": [...]}`` (see
        :func:`~fedlit.config.cost_table.format_table`).
    """
    if isinstance(clients_per_round, int) and num_clients is not None and clients_per_round > num_clients:
        raise ConfigError(
            f"federation.clients_per_round={clients_per_round} but the data has only {num_clients} clients."
        )
    if num_clients is not None:
        per_round: int | None = num_selected(clients_per_round, num_clients)
    else:  # a count is known without the clients; a fraction or "all" is not
        per_round = clients_per_round if isinstance(clients_per_round, int) else None
    evaluated = sum(1 for r in range(1, rounds + 1) if r % eval_every == 0 or r == rounds)
    base_roles = module.parameter_roles()
    rows = [
        _strategy_costs(module, base_roles, strategy, num_clients, per_round, rounds, evaluated)
        for strategy in reversed(strategies)
    ][::-1]  # the first strategy's roles are set last, and kept
    reference = rows[0]["per_client_per_round"]["upload_bytes"] if rows else 0
    for row in rows:
        up = row["per_client_per_round"]["upload_bytes"]
        row["upload_ratio"] = up / reference if reference else (1.0 if up == 0 else None)
    return {
        "model": type(module).__name__,
        "clients": {"total": num_clients, "per_round": per_round, "clients_per_round": clients_per_round},
        "rounds": rounds,
        "evaluated_rounds": evaluated,
        "strategies": rows,
    }


def _strategy_costs(
    module: FederatedModule,
    base_roles: ParameterRoles,
    strategy: Strategy,
    num_clients: int | None,
    per_round: int | None,
    rounds: int,
    evaluated: int,
) -> dict[str, Any]:
    roles = strategy.configure_roles(base_roles)
    module.set_parameter_roles(roles)
    client_ids = [f"client_{i}" for i in range(max(num_clients or 1, 1))]
    try:
        strategy.initialize(
            module.named_tensors("shared"), client_ids, _placeholder_counts(module, client_ids), roles=roles
        )
    except (ConfigError, DataError):
        raise
    except Exception as err:  # noqa: BLE001  (a strategy whose set-up needs real values: say which one)
        raise ConfigError(
            f"{strategy!r}: its server state cannot be set up before training ({type(err).__name__}: "
            f"{err}), so its costs cannot be estimated."
        ) from err
    client = client_ids[0]
    upload = {"tensors": module.named_tensors("shared"), "extras": strategy.expected_upload_extras(client)}
    evaluation = strategy.configure_evaluate(1, client)

    def in_round(server_round: int) -> dict[str, int]:  # round 2 stands for every later round
        download = {
            "tensors": strategy.configure_client(server_round, client),
            "extras": strategy.expected_download_extras(server_round, client),
        }
        return {
            "upload_parameters": state_numel(upload),
            "upload_bytes": state_nbytes(upload),
            "download_parameters": state_numel(download),
            "download_bytes": state_nbytes(download),
        }

    first = in_round(1)
    per_client = in_round(2) if rounds > 1 else first  # a round after the first: what most rounds cost
    over_run = {k: first[k] + (rounds - 1) * per_client[k] for k in per_client}  # one client in every round

    def times(factor: float | None, base: Mapping[str, int]) -> dict[str, Any]:
        return {k: None if factor is None else round(v * factor) for k, v in base.items()}

    share = None if per_round is None or not num_clients else per_round / num_clients
    global_model = strategy.global_model_state(client)  # evaluated beside the personalized model when not None
    eval_bytes = state_nbytes(evaluation) + (0 if global_model is None else state_nbytes(global_model))
    summary: dict[Any, dict[str, Any]] = {
        r["role"]: {"tensors": r["tensors"], "parameters": r["parameters"]} for r in role_summary(module, roles)
    }
    for role in ROLES:
        summary[role]["bytes"] = state_nbytes(module.named_tensors(role))
    summary["total"]["bytes"] = sum(summary[role]["bytes"] for role in ROLES)
    return {
        "strategy": repr(strategy),
        "name": type(strategy).__name__,
        "roles": summary,
        "trainable_parameters": summary["shared"]["parameters"] + summary["personal"]["parameters"],
        "per_client_per_round": per_client,
        "per_client_first_round": first,
        "per_round": times(per_round, per_client),
        "per_client_run": times(share, over_run),
        "run": times(per_round, over_run),
        "eval_download_bytes": {
            "per_client_per_evaluation": eval_bytes,
            "run": None if num_clients is None else eval_bytes * num_clients * evaluated,
        },
        "eval_finetune_steps": {  # local steps before each evaluation (FedAvg-FT), beside the rounds' training
            "per_client_per_evaluation": strategy.eval_finetune_steps,
            "run": None if num_clients is None else strategy.eval_finetune_steps * num_clients * evaluated,
        },
    }


def _placeholder_counts(module: FederatedModule, client_ids: list[str]) -> dict[str, list[int]] | None:
    """Class counts of the right length (one per class; two for a binary task), for strategies that size their
    server state by them (FedSLD's prior): only their shapes matter here."""
    classes = getattr(module, "num_classes", None)
    if not isinstance(classes, int) or classes < 1:
        return None
    length = 2 if getattr(module, "task", None) == "binary" else classes
    return {c: [1] * length for c in client_ids}


# ----------------------------------------------------------------------------------------------- the job
@dataclass
class CostJob:
    """``fedlit cost`` / ``fedlit fit --dry_run``: the report, ready to print."""

    report: dict[str, Any]
    format: Literal["table", "json"] = "table"
    title: str = "fedlit cost"

    def __call__(self) -> dict[str, Any]:
        if self.format == "json":
            print(json.dumps(self.report, indent=1), flush=True)
        else:
            print(f"{self.title} (nothing trained, no data read)\n{format_table(self.report)}", flush=True)
        return self.report


def estimate(recipe: Recipe, compare: Sequence[str] = (), not_given: Sequence[str] = ()) -> dict[str, Any]:
    """The cost report of a loaded recipe, and of the strategies ``compare`` (short names or import paths, built
    with their default arguments): the model is built on the meta device (no weight file read), the strategies
    and, if it can be built without its files, the data module (never set up). ``not_given``: the data module's
    required options that the recipe leaves out (its data folder: ``root``): the data module is not built and its
    clients are counted from its options (:meth:`~fedlit.data.FederatedDataModule.clients_in_options`).
    Configuration errors are raised here."""
    parser, cfg, subcommand = recipe.parser, recipe.cfg, recipe.subcommand
    sub = recipe.options
    federation = sub.federation
    # every federation setting checked as a fit checks it, from its one declaration
    problems = Settings.problems({f.name: federation.get(f.name, f.default) for f in fields(Settings)})
    if problems:
        raise ConfigError("Invalid federation settings: " + "; ".join(problems) + ".")
    others = [_compare_strategy(name) for name in compare]
    notes: list[str] = []
    objects, device = _build_without_data(parser, cfg, subcommand)
    if not_given:
        num_clients, where = _clients_in_options(cfg[subcommand].data)
        given = " and ".join(f"data.init_args.{o}" for o in not_given)
        note: str | None = f"the data module was not built ({given} not given): {where}."
    else:
        num_clients, note = _expected_clients(parser, cfg, subcommand)
    notes += [n for n in (note, device) if n]
    report = estimate_costs(
        objects.model,
        [objects.strategy, *others],
        num_clients=num_clients,
        clients_per_round=federation.clients_per_round,
        rounds=federation.rounds,
        eval_every=federation.eval_every,
    )
    notes += [note for s in [objects.strategy, *others] for note in s.cost_notes]
    if any(
        type(s).expected_upload_extras is Strategy.expected_upload_extras and s.communicates
        for s in [objects.strategy, *others]
    ):
        notes.append(
            "uploads are each selected client's shared tensors (plus the extras a strategy declares); a "
            "strategy that uploads a subset chosen during training is counted by the roles it sets."
        )
    report["device"] = "meta" if device is None else "cpu"
    report["notes"] = notes
    return report


def _build_without_data(parser: ArgumentParser, cfg: Namespace, subcommand: str) -> tuple[Namespace, str | None]:
    """Model, strategy and the rest of the recipe, without the data; on the meta device when the model allows it
    (a model that loads pretrained weights through a library that refuses the meta device is built on the CPU)."""
    rest = cfg.clone()
    rest[subcommand].pop("data")
    with skip_weight_loading():
        try:
            with torch.device("meta"), warnings.catch_warnings():
                # A backbone that still reads its weights copies them into meta tensors: a no-op, said once per tensor.
                warnings.filterwarnings("ignore", message=".*copying from a non-meta parameter")
                return parser.instantiate_classes(rest.clone())[subcommand], None
        except Exception as err:  # noqa: BLE001  (any failure on meta: build as usual; its errors are the real ones)
            lines = [line.strip(" -") for line in str(err).splitlines() if line.strip(" -")]
            reason = next((line for line in lines if "meta" in line), lines[0] if lines else type(err).__name__)
        objects = instantiate(parser, rest)
    return objects[subcommand], f"the model was built on the CPU, not on the meta device ({reason[:160]})."


def _expected_clients(parser: ArgumentParser, cfg: Namespace, subcommand: str) -> tuple[int | None, str | None]:
    """The number of clients from the data module's arguments; the module is built (its settings checked) but
    never set up. A data set whose files are absent still gets a count from ``num_clients`` or ``sites``."""
    only_data = cfg.clone()
    for key in ("model", "strategy", "callbacks"):
        only_data[subcommand].pop(key, None)
    try:
        data: FederatedDataModule = parser.instantiate_classes(only_data)[subcommand].data
    except Exception as err:
        missing = _missing_files(err)
        if missing is None:
            raise
        count, where = _clients_in_options(cfg[subcommand].data)
        return count, f"the data module was not built ({missing}): {where}."
    count = data.expected_num_clients()
    if count is None:
        return None, (
            f"{type(data).__name__} cannot tell its number of clients before it reads its data: totals "
            "over all clients are unknown."
        )
    return count, None


def _clients_in_options(data: Namespace) -> tuple[int | None, str]:
    """The number of clients that the data section's options give without building it (its ``sites`` list,
    ``num_clients``, or the data set's own sites: :meth:`~fedlit.data.FederatedDataModule.clients_in_options`),
    and where it comes from."""
    args = (data.get("init_args") or Namespace()).as_dict()
    module_name, _, name = str(data.class_path).rpartition(".")
    count = getattr(importlib.import_module(module_name), name).clients_in_options(args)
    if count is None:
        return None, "the number of clients is unknown"
    if isinstance(args.get("sites"), list | tuple):
        return count, f"{count} clients from data.init_args.sites"
    if args.get("num_clients") is not None:
        return count, f"{count} clients from data.init_args.num_clients"
    return count, f"{count} clients, {name}'s sites"


def _missing_files(err: BaseException) -> str | None:
    """The message of the FileNotFoundError or DataError behind ``err`` (jsonargparse wraps it), or None."""
    node: BaseException | None = err
    seen = []
    while node is not None and node not in seen:
        if isinstance(node, (FileNotFoundError, DataError)):
            return str(node)
        seen.append(node)
        node = node.__cause__ or node.__context__
    return None


def _compare_strategy(name: str) -> Strategy:
    """A strategy of ``--compare`` (a short name or an import path), built with its default arguments."""
    known = {c.__name__: c for c in subclasses(Strategy) if not getattr(c, "__abstractmethods__", None)}
    if "." in name:
        module_name, _, attr = name.rpartition(".")
        try:
            cls = getattr(importlib.import_module(module_name), attr, None)
        except ImportError:
            cls = None
        if not (isinstance(cls, type) and issubclass(cls, Strategy)):
            raise ConfigError(
                f"--compare {name!r} is not a Strategy class. Give a short name "
                f"({', '.join(sorted(known))}) or the import path of a Strategy subclass."
            )
    elif name in known:
        cls = known[name]
    else:
        close = difflib.get_close_matches(name, sorted(known), n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise ConfigError(f"--compare {name!r} is not a known Strategy.{hint} Valid names: {', '.join(sorted(known))}.")
    try:
        return cls()
    except TypeError as err:
        raise ConfigError(
            f"--compare {name}: it cannot be built with its default arguments ({err}); cost it as the "
            f"recipe's strategy instead (--strategy {name} --strategy.init_args...)."
        ) from None
