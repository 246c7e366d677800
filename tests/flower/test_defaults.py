"""A Flower deployment's server defaults: ``federation.max_update_norm_vs_median: 10`` unless the recipe or the run's
overrides say otherwise, so a 500x update among honest ones is rejected (the same recipe in a simulation, where the
bound is off, aggregates it). Driven in-process: the server is :func:`run_server` with the run config a ServerApp
gets; the nodes are :func:`~fedlit.flower.client.node_run`, site_1's patched to scale its round-2 update 500 times."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

pytest.importorskip("flwr.app", reason="flwr is not installed (pip install 'fedlit[flower]'): no Flower deployment")

from fedlit.flower.client import node_run  # noqa: E402
from fedlit.flower.defaults import deployment_argv  # noqa: E402
from fedlit.flower.inprocess import InProcessTransport  # noqa: E402
from fedlit.flower.server import run_server, server_argv  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
CLIENTS = ["site_0", "site_1", "site_2"]
TINY = (
    "--data.init_args.num_clients 3 --data.init_args.samples_per_client 20 --data.init_args.image_size 8 "
    "--model.init_args.backbone.init_args.width 4 --federation.rounds 2 --federation.local_epochs 1"
)
SCALED = (
    "\ncallbacks:\n  - class_path: tests.flower.faults.ScaleUpdateAt\n"
    "    init_args: {client_id: site_1, server_round: 2, factor: 500.0}\n"
)


def test_the_defaults_come_before_the_recipe_so_that_it_wins():
    argv = server_argv({"overrides": "--federation.rounds 3"}, Path("/r.yaml"))
    assert argv == [
        "fit",
        "--federation.max_update_norm_vs_median",
        "10",
        "--config",
        "/r.yaml",
        "--federation.rounds",
        "3",
    ]
    assert deployment_argv() == ["--federation.max_update_norm_vs_median", "10"]


def _deploy(tmp_path, overrides=""):
    recipe = (ROOT / "recipes" / "quickstart.yaml").read_text().replace("class_path: FedBN", "class_path: FedAvg")
    run_config = {
        "recipe": recipe + SCALED,
        "overrides": f"{TINY} {overrides}",
        "out-dir": str(tmp_path / "server"),
        "connect-timeout": 5,
        "client-ids": ",".join(CLIENTS),
    }
    transport = InProcessTransport(
        {c: (lambda c=c: node_run(run_config, {"client-id": c}, tmp_path / "node")) for c in CLIENTS}
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return run_server(transport, run_config)


def test_a_500x_update_among_honest_ones_is_rejected_under_the_deployment_defaults(tmp_path):
    results = _deploy(tmp_path / "default")
    assert [(f["round"], f["client"], f["kind"]) for f in results["faults"]] == [(2, "site_1", "rejected")]
    assert "over federation.max_update_norm_vs_median=10" in results["faults"][0]["detail"]
    # the run's overrides turn the bound off: the scaled update is aggregated (the ratio bound of 1000 lets it by)
    assert "faults" not in _deploy(tmp_path / "off", "--federation.max_update_norm_vs_median null")
