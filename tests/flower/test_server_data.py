"""The server of a deployment constructs no data module, and each node builds only its own site.

Driven in-process (:class:`~fedlit.flower.inprocess.InProcessTransport`): the server is :func:`run_server` with the
run config a ServerApp gets; each node is :func:`~fedlit.flower.client.node_run` with its node config, as a SuperNode
builds it. The server's data section names a folder that does not exist on the server.
"""

from __future__ import annotations

import shutil
import warnings
from pathlib import Path

import pytest

pytest.importorskip("flwr.app", reason="flwr is not installed (pip install 'fedlit[flower]'): no Flower deployment")

from fedlit.core.errors import InputFileError  # noqa: E402
from fedlit.data import SyntheticImages  # noqa: E402
from fedlit.flower.client import node_run  # noqa: E402
from fedlit.flower.inprocess import InProcessTransport  # noqa: E402
from fedlit.flower.server import run_server  # noqa: E402
from tests.flower.test_inprocess import _close, _without_pooled  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SHARED_DATA = ROOT.parent / "shared" / "data"
TINY = (
    "--data.init_args.num_clients 2 --data.init_args.samples_per_client 20 --data.init_args.image_size 8 "
    "--model.init_args.backbone.init_args.width 4 --federation.rounds 1"
)


class NodeOnlyImages(SyntheticImages):
    """Synthetic images whose constructor needs a folder (as ``SiteFolders`` does): only the nodes have it.

    Args:
        root: a folder that must exist.
        **kwargs: as :class:`~fedlit.data.SyntheticImages`.
    """

    def __init__(
        self,
        *,
        root: str,
        num_clients: int = 4,
        samples_per_client: int = 200,
        num_classes: int = 3,
        image_size: int = 16,
        batch_size: int = 32,
        seed: int = 0,
    ) -> None:
        if not Path(root).is_dir():
            raise InputFileError(f"data.init_args.root: no folder {root}")
        super().__init__(
            num_clients=num_clients,
            samples_per_client=samples_per_client,
            num_classes=num_classes,
            image_size=image_size,
            batch_size=batch_size,
            seed=seed,
        )


def _nodes(run_config, clients, node_overrides, tmp_path):
    return InProcessTransport(
        {
            c: (lambda c=c: node_run(run_config, {"client-id": c, "overrides": node_overrides(c)}, tmp_path / "node"))
            for c in clients
        }
    )


def test_the_server_builds_its_run_without_constructing_the_data_module(tmp_path):
    recipe = (
        (ROOT / "recipes" / "quickstart.yaml")
        .read_text()
        .replace("class_path: fedlit.data.SyntheticImages", "class_path: tests.flower.test_server_data.NodeOnlyImages")
        .replace("init_args: {num_clients: 4,", f"init_args: {{root: {tmp_path / 'not_on_the_server'}, num_clients: 4,")
    )
    assert "NodeOnlyImages" in recipe and "not_on_the_server" in recipe
    (tmp_path / "site").mkdir()
    run_config = {"recipe": recipe, "overrides": TINY, "out-dir": str(tmp_path / "server"), "connect-timeout": 5}
    transport = _nodes(
        run_config, ["site_0", "site_1"], lambda c: f"--data.init_args.root {tmp_path / 'site'}", tmp_path
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        results = run_server(transport, run_config)
    assert set(results["last"]["clients"]) == {"site_0", "site_1"}
    # the server waited for the 2 clients the data section's options name (num_clients), and asked each node
    assert [k for _, k in transport.sent][:2] == ["query", "query"]


def test_each_heart_disease_node_holding_only_its_file_gives_the_simulation_results(tmp_path):
    """Four hospitals, each node's folder holding its own processed file only, the server none: the deployment's
    results equal the simulation's on the four files together."""
    heart = SHARED_DATA / "heart_disease"
    if not heart.is_dir():
        pytest.skip(f"real heart disease folder {heart} is absent (shared/data beside the repository)")
    from fedlit.cli import prepare
    from fedlit.data.heart_disease import CENTERS

    recipe = (ROOT / "recipes" / "heart_disease_fedavg.yaml").read_text()
    overrides = "--federation.rounds 2 --federation.local_steps 5 --data.init_args.val_fraction 0.2"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        simulated = prepare(
            [
                "fit",
                "--config",
                str(ROOT / "recipes" / "heart_disease_fedavg.yaml"),
                *overrides.split(),
                "--data.init_args.root",
                str(heart),
                "--out_dir",
                str(tmp_path / "sim"),
            ]
        )()
    for center in CENTERS:
        (tmp_path / center).mkdir()
        shutil.copy(heart / f"processed.{center}.data", tmp_path / center)
    run_config = {
        "recipe": recipe,
        "overrides": f"{overrides} --data.init_args.root {tmp_path / 'none'}",
        "out-dir": str(tmp_path / "dep"),
        "connect-timeout": 5,
    }
    transport = _nodes(run_config, CENTERS, lambda c: f"--data.init_args.root {tmp_path / c}", tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        deployed = run_server(transport, run_config)
    assert not (tmp_path / "none").exists()
    for key in ("last", "best", "global", "comm"):
        assert (key in simulated) == (key in deployed), key
        if key in simulated:  # a node never sends the predictions the simulation's pooled metrics need
            _close(_without_pooled(simulated[key]), deployed[key], key)
