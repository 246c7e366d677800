"""The final report of a run, and the evaluation of a checkpoint: tables printed and saved, results.json,
the final scalars and TensorBoard's HParams view (see :mod:`fedlit.engine.loop.evaluate` for what is evaluated)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedlit.core.checkpoint_io import BEST
from fedlit.core.errors import DataError, broken
from fedlit.core.files import write_text_atomic
from fedlit.engine.loop import resume
from fedlit.engine.loop.evaluate import GLOBAL, UNSEEN, evaluate_unseen, pooled_metrics, unseen_scalars
from fedlit.engine.loop.tasks import evaluate_tasks
from fedlit.engine.records import baseline, hparams, record
from fedlit.engine.records.history import markdown_table, summarize

if TYPE_CHECKING:
    from fedlit.engine.loop.run import Run


def _unseen_tables(unseen: Mapping[str, Any], metrics: list[str]) -> list[str]:
    sections = [
        "## Unseen clients\n",
        "_Held out of training (federation.unseen_clients), tested with the last round's server state; not "
        "in the means above._\n",
    ]
    if "global" in unseen:
        sections.append(
            markdown_table(
                f"Unseen clients: {unseen['split']} with the model a new client receives", unseen["global"], metrics
            )
        )
    if "finetuned" in unseen:
        sections.append(
            markdown_table(
                f"Unseen clients: {unseen['split']} after {unseen['finetune_steps']} local fine-tuning steps",
                unseen["finetuned"],
                metrics,
            )
        )
    return sections


def evaluate_checkpoint(run: Run, split: str, ckpt_path: str | Path) -> dict[str, Any]:
    """Every client's ``split`` (``val`` or ``test``) with the checkpoint's state (and with the global model, and
    the unseen clients, as in :func:`report`); prints the tables."""
    per_client: dict[str, dict[str, float]] = {}
    global_per_client: dict[str, dict[str, float]] = {}
    predictions: dict[str, dict[str, Any]] = {split: {}, f"{GLOBAL}/{split}": {}}
    clients = run.evaluated_client_ids
    pooled = (split,) if run.settings.pooled_metrics else ()
    tasks = evaluate_tasks(run.strategy, run.state.round, clients, (split,), pooled=pooled)
    if not (run.executor is not None):  # chosen by setup
        raise broken("the executor is chosen when the run is set up")
    for client_id, evaluation in zip(clients, run.executor.evaluate(run, run.state.round, tasks), strict=True):
        if evaluation.metrics.get(split):
            per_client[client_id] = evaluation.metrics[split]
        if evaluation.metrics.get(f"{GLOBAL}/{split}"):
            global_per_client[client_id] = evaluation.metrics[f"{GLOBAL}/{split}"]
        for key, kept in evaluation.pooled.items():
            predictions[key][client_id] = kept
    if not per_client:
        raise DataError(f"The data set has no {split!r} split to evaluate.")
    weights = {c: run.datamodule.num_examples(c, split) for c in run.client_ids}
    metric_names = list(run.module.higher_is_better)
    result: dict[str, Any] = {
        "round": run.state.round,
        "clients": per_client,
        "summary": summarize(per_client, weights, run.module.higher_is_better),
    }
    if values := pooled_metrics(run, per_client, predictions[split]):
        result["pooled"] = values
    tables = [markdown_table(f"{split} of {ckpt_path}", result, metric_names)]
    if global_per_client:
        result[GLOBAL] = {
            "round": run.state.round,
            "clients": global_per_client,
            "summary": summarize(global_per_client, weights, run.module.higher_is_better),
        }
        if values := pooled_metrics(run, global_per_client, predictions[f"{GLOBAL}/{split}"]):
            result[GLOBAL]["pooled"] = values
        tables.append(markdown_table(f"{split} of {ckpt_path}, global model", result[GLOBAL], metric_names))
    unseen = evaluate_unseen(run, split)
    if unseen is not None:
        result[UNSEEN] = unseen
        tables += _unseen_tables(unseen, metric_names)
    if run.baseline_run is not None and split == "test":
        selection = "best" if Path(ckpt_path).name == BEST else "last"
        gain = baseline.gain(run, per_client, run.state.round, selection)
        result[baseline.KEY] = gain
        tables.append(baseline.markdown(gain, metric_names))
    if run.fabric.is_global_zero:
        print("\n".join(tables))
    return result


def report(run: Run) -> dict[str, Any]:
    """Print and save (Markdown, JSON, TensorBoard) the final per-client test results: of the personalized models,
    of the global model (when the strategy has one), of the unseen clients, and the gain over Local (with
    ``baseline_run``)."""
    weights = {c: run.datamodule.num_examples(c, "test") for c in run.client_ids}
    results = run.state.history.results("test", weights)
    global_results = run.state.history.results(f"{GLOBAL}/test", weights)
    if "last" in global_results:
        results[GLOBAL] = global_results
    if getattr(run.strategy, "per_client_selection", False):  # EPFL's FHBench protocol: each client's own best round
        per_client_best = run.state.history.best_per_client("test", weights)
        if per_client_best is not None:
            results["best_per_client"] = per_client_best
    unseen = evaluate_unseen(run) if run.state.history.last_round is not None else None
    if unseen is not None:
        results[UNSEEN] = unseen
    gain = None
    if run.baseline_run is not None and ("best" in results or "last" in results):
        selection = "best" if "best" in results else "last"
        gain = baseline.gain(run, results[selection]["clients"], results[selection]["round"], selection)
        results[baseline.KEY] = gain
    results[baseline.PROTOCOL] = baseline.protocol(run)  # what a later --baseline_run compares
    results["comm"] = dict(run.state.comm)
    results["compute"] = dict(run.state.compute)
    results["checkpoints"] = record.checkpoints(run)
    results.update(record.describe(run))
    # each metric's direction, as the module declares it: `fedlit report` ranks by it (a custom `mse` is
    # lower-is-better without "loss" in its name)
    results["higher_is_better"] = {m: bool(v) for m, v in run.module.higher_is_better.items()}
    for callback in run.callbacks:  # sections a callback adds (fedlit.privacy's ``privacy``), merged by key
        sections = getattr(callback, "results_json", None)
        for key, value in (sections(run.server_context()) if callable(sections) else {}).items():
            results.setdefault(key, {}).update(value)
    for key, value in resume.dropped_reports(run).items():  # what callbacks dropped on resume reported, marked
        for name, block in value.items():
            results.setdefault(key, {}).setdefault(name, block)
    if run.state.dropped_callbacks:
        results["dropped_callbacks"] = [
            {"callback": key, "after_round": entry["after_round"]} for key, entry in run.state.dropped_callbacks.items()
        ]
    if run.state.faults:
        results["faults"] = run.state.faults
    results["train_sizes"] = run.state.train_sizes  # each round's weights, as the clients claimed them
    if run.state.stopped_early is not None:
        results["stopped_early"] = dict(run.state.stopped_early)
    metrics = list(run.module.higher_is_better)
    sections = [f"# Results: {run.strategy!r}\n"]
    if "last" in results:
        sections.append(markdown_table("Test, last round", results["last"], metrics))
    if "best" in results:
        sections.append(
            markdown_table(
                f"Test at the best mean validation {run.state.history.selection_metric}", results["best"], metrics
            )
        )
    elif run.state.history.best_round() is None:
        sections.append("_No validation split: the best-validation round is not defined (no best.ckpt)._\n")
    if GLOBAL in results:
        sections.append(
            "## Global model\n\n_Each client with the server's global shared tensors and its own personal "
            "tensors; the best round is the one chosen above._\n"
        )
        for key, title in (
            ("last", "Global model: test, last round"),
            ("best", f"Global model: test at the best mean validation {run.state.history.selection_metric}"),
        ):
            if key in results[GLOBAL]:
                sections.append(markdown_table(title, results[GLOBAL][key], metrics))
    if unseen is not None:
        sections += _unseen_tables(unseen, metrics)
    if gain is not None:
        sections.append(baseline.markdown(gain, metrics))
    comm = run.state.comm
    sections.append(
        f"Communication: {comm['upload_bytes']:,} bytes up, {comm['download_bytes']:,} bytes "
        f"down in training; {comm.get('eval_download_bytes', 0):,} bytes down for evaluation.\n"
    )
    if run.state.compute.get("eval_finetune_steps"):
        sections.append(
            f"Fine-tuning before evaluation: {run.state.compute['eval_finetune_steps']:,} local steps over "
            "the run (beside the rounds' training).\n"
        )
    if run.state.stopped_early is not None:
        sections.append(
            f"Stopped after round {run.state.stopped_early['round']} of {run.settings.rounds}: "
            f"{run.state.stopped_early['reason']}.\n"
        )
    if run.state.dropped_callbacks:
        sections.append(
            "Callbacks dropped on resume (federation.allow_dropped_callbacks): "
            + "; ".join(
                f"{key} after round {entry['after_round']} (what it reports covers only the rounds up to "
                f"{entry['after_round']})"
                for key, entry in run.state.dropped_callbacks.items()
            )
            + ".\n"
        )
    if run.state.faults:
        lines = [f"- round {f['round']}, client {f['client']}: {f['kind']} ({f['detail']})" for f in run.state.faults]
        sections.append("Clients left out of aggregation:\n\n" + "\n".join(lines) + "\n")
    text = "\n".join(sections)
    if run.fabric.is_global_zero:  # over several ranks, every rank has the results and rank 0 writes them
        print(text)
        run.out_dir.mkdir(parents=True, exist_ok=True)
        write_text_atomic(run.out_dir / "results.md", text)
        write_text_atomic(run.out_dir / "results.json", json.dumps(results, indent=1))
    final: dict[str, float] = {}
    for section, block in (("", results), (f"{GLOBAL}/", results.get(GLOBAL, {}))):
        for key, split_key in (("last", "test"), ("best", "test_at_best_val")):
            if key in block:
                for client_id, values in block[key]["clients"].items():
                    final.update({f"{section}client/{client_id}/{split_key}/{m}": v for m, v in values.items()})
                final.update({f"{section}server/{split_key}/{m}": v for m, v in block[key]["summary"].items()})
                pooled = block[key].get("pooled", {})
                final.update({f"{section}server/{split_key}/{m}_pooled": v for m, v in pooled.items()})
    if unseen is not None and run.state.history.last_round is not None:
        unseen_log = unseen_scalars(run, unseen)
        final.update(unseen_log)
        record.append_final(run, run.state.history.last_round, unseen_log)
    if gain is not None:
        final.update({f"{baseline.KEY}/{m}_{agg}": gain[agg][m] for agg in ("mean", "std") for m in gain[agg]})
    if final and run.state.history.last_round is not None:
        run.fabric.log_dict(final, step=run.state.history.last_round)
        hparams.log(run)
    for logger in run.fabric.loggers:
        logger.finalize("success")
    return results
