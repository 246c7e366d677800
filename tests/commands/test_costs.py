"""``fedlit cost`` and ``fedlit fit --dry_run``: parameters per role and communication, worked out by hand."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from torch import nn

from fedlit import RoleRule, cli
from fedlit.commands.cost import estimate_costs
from fedlit.models import Backbone
from fedlit.strategies import FedAvg, FedDBE, FedSCA
from fedlit.tasks import ClassificationModule
from tests.conftest import make_federation

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = str(ROOT / "recipes" / "quickstart.yaml")


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attn = nn.Linear(4, 4)  # 20 parameters, frozen
        # 4*2+2 + 2*4+4 = 22 parameters each
        self.Space_Adapter = nn.Sequential(nn.Linear(4, 2), nn.Linear(2, 4))  # noqa: N815  (Medical-SAM-Adapter's name)
        self.MLP_Adapter = nn.Sequential(nn.Linear(4, 2), nn.Linear(2, 4))  # noqa: N815

    def forward(self, x):
        x = self.attn(x)
        return x + self.MLP_Adapter(x + self.Space_Adapter(x))


class AdapterBackbone(Backbone):
    """4 blocks, each a frozen linear layer and two adapters of 22 parameters (8 adapters, as SAM's 24 blocks x 2
    adapters... in small): ``blocks.<i>.Space_Adapter`` and ``blocks.<i>.MLP_Adapter``."""

    def __init__(self, *, depth: int = 4) -> None:
        self.depth = depth

    def build(self) -> nn.Module:
        net = nn.Sequential()
        net.blocks = nn.ModuleList(_Block() for _ in range(self.depth))
        net.num_features = 4
        return net


ADAPTER_ROLES = [RoleRule("*_Adapter.*", "shared"), RoleRule("head.*", "personal")]


def adapter_module() -> ClassificationModule:
    return ClassificationModule(backbone=AdapterBackbone(), num_classes=2, roles=list(ADAPTER_ROLES))


def test_fedsca_with_one_adapter_uploads_an_eighth_of_fedavg():
    report = estimate_costs(
        adapter_module(),
        [FedSCA(num_shared_adapters=1), FedAvg()],
        num_clients=5,
        clients_per_round=0.6,
        rounds=3,
        eval_every=2,
    )
    assert report["clients"] == {"total": 5, "per_round": 3, "clients_per_round": 0.6}
    assert report["evaluated_rounds"] == 2  # rounds 2 and 3 (the last is always evaluated)
    sca, avg = report["strategies"]
    # FedSCA: only blocks.0.Space_Adapter (22 parameters, 4 tensors) is shared; the 7 other adapters and the
    # head (4*2+2 = 10) are personal; the 4 attention layers (4 x 20) are frozen.
    assert sca["roles"]["shared"] == {"tensors": 4, "parameters": 22, "bytes": 88}
    assert sca["roles"]["personal"] == {"tensors": 7 * 4 + 2, "parameters": 7 * 22 + 10, "bytes": (7 * 22 + 10) * 4}
    assert sca["roles"]["frozen"] == {"tensors": 8, "parameters": 80, "bytes": 320}
    assert sca["trainable_parameters"] == 22 + 7 * 22 + 10
    assert sca["per_client_per_round"] == {
        "upload_parameters": 22,
        "upload_bytes": 88,
        "download_parameters": 22,
        "download_bytes": 88,
    }
    assert sca["per_round"]["upload_bytes"] == 3 * 88
    assert sca["run"]["upload_bytes"] == 3 * 3 * 88
    assert sca["per_client_run"]["upload_bytes"] == round(3 * 3 / 5 * 88)  # 158: sampled 3 rounds x 3/5
    assert sca["eval_download_bytes"] == {"per_client_per_evaluation": 88, "run": 88 * 5 * 2}
    # FedAvg: the 8 adapters.
    assert avg["roles"]["shared"]["parameters"] == 8 * 22
    assert avg["per_client_per_round"]["upload_bytes"] == 8 * 22 * 4
    assert avg["upload_ratio"] == 8.0 and sca["upload_ratio"] == 1.0


def test_quickstart_costs_through_the_cli_as_json(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    report = cli.run(["cost", "--config", QUICKSTART, "--compare", "FedAvg", "SCAFFOLD", "Local", "--format", "json"])
    assert json.loads(capsys.readouterr().out) == json.loads(json.dumps(report))
    assert report["device"] == "meta"
    assert report["clients"] == {"total": 4, "per_round": 4, "clients_per_round": None}
    assert (report["rounds"], report["evaluated_rounds"]) == (10, 10)
    fedbn, fedavg, scaffold, local = report["strategies"]
    assert [s["name"] for s in report["strategies"]] == ["FedBN", "FedAvg", "SCAFFOLD", "Local"]
    # SmallCNN(1, 16, depth 2) + Linear(32, 3): conv 1->16 3x3 without bias (144), BN(16) (32 + buffers 16+16+1),
    # conv 16->32 (4608), BN(32) (64 + buffers 32+32+1), head 96+3. FedBN keeps the BatchNorm layers personal.
    shared = 144 + 4608 + 99
    bn_bytes = (32 + 64 + 16 + 16 + 32 + 32) * 4 + 2 * 8  # float32 tensors, and 2 int64 num_batches_tracked
    assert fedbn["roles"]["shared"] == {"tensors": 4, "parameters": shared, "bytes": shared * 4}
    assert fedbn["roles"]["personal"] == {"tensors": 10, "parameters": 96, "bytes": bn_bytes}
    assert fedbn["per_client_per_round"]["upload_bytes"] == shared * 4
    assert fedbn["run"]["upload_bytes"] == 10 * 4 * shared * 4
    assert fedbn["eval_download_bytes"]["run"] == 10 * 4 * shared * 4
    assert fedavg["per_client_per_round"] == {
        "upload_parameters": shared + 96 + 96 + 2,
        "upload_bytes": shared * 4 + bn_bytes,
        "download_parameters": shared + 96 + 96 + 2,
        "download_bytes": shared * 4 + bn_bytes,
    }
    assert fedavg["upload_ratio"] == pytest.approx((shared * 4 + bn_bytes) / (shared * 4))
    # SCAFFOLD also uploads delta c_i and downloads c: one value per shared parameter (buffers have none).
    control = (shared + 96) * 4
    assert scaffold["per_client_per_round"]["upload_bytes"] == shared * 4 + bn_bytes + control
    assert scaffold["per_client_per_round"]["download_bytes"] == shared * 4 + bn_bytes + control
    assert local["per_client_per_round"]["upload_bytes"] == 0 and local["upload_ratio"] == 0
    assert not (tmp_path / "runs").exists()


def _adapter_recipe(tmp_path: Path) -> Path:
    recipe = tmp_path / "sam_like.yaml"
    recipe.write_text(f"""
model:
  class_path: fedlit.tasks.ClassificationModule
  init_args:
    backbone: {{class_path: tests.commands.test_costs.AdapterBackbone}}
    num_classes: 2
    roles:
      - {{pattern: "*_Adapter.*", role: shared}}
      - {{pattern: "head.*", role: personal}}
data:
  class_path: fedlit.data.MedMNIST
  init_args: {{path: {tmp_path / "absent" / "pneumoniamnist.npz"}, num_clients: 6}}
strategy:
  class_path: FedSCA
  init_args: {{num_shared_adapters: 1}}
federation: {{rounds: 2, clients_per_round: 3}}
""")
    return recipe


def test_cost_and_dry_run_of_a_recipe_whose_data_is_absent(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    recipe = _adapter_recipe(tmp_path)
    cli.main(["cost", "--config", str(recipe), "--compare", "FedAvg"])
    table = capsys.readouterr().out
    assert "FedAvg / FedSCA = 8.0x" in table
    assert "6 clients, 3 per round" in table and "6 clients from data.init_args.num_clients" in table
    assert "no MedMNIST .npz file" in table
    cli.main(["fit", "--config", str(recipe), "--dry_run"])
    dry = capsys.readouterr().out
    assert dry.startswith("fedlit fit --dry_run")
    row = next(line for line in dry.splitlines() if line.startswith("| FedSCA |"))
    # 22 parameters (88 B) per client per round; x 3 clients per round = 264 B; x 2 rounds = 528 B.
    assert row.split(" | ")[2:5] == ["22 (88 B)", "22 (88 B)", "264 B"]
    assert row.split(" | ")[6] == "528 B"
    assert list(tmp_path.iterdir()) == [recipe]  # no run folder, nothing written


def test_cost_of_a_recipe_without_its_data_folder_counts_the_recipes_sites(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    recipe = tmp_path / "sites.yaml"
    quickstart = Path(QUICKSTART).read_text()
    recipe.write_text(
        quickstart.split("data:")[0]
        + "data:\n  class_path: fedlit.data.SiteFolders\n  init_args: {sites: [north, south, east]}\n"
        + "strategy:"
        + quickstart.split("strategy:")[1]
    )
    report = cli.run(["cost", "--config", str(recipe), "--format", "json"])
    assert report["clients"] == {"total": 3, "per_round": 3, "clients_per_round": None}
    assert report["notes"][0] == "the data module was not built (data.init_args.root not given): 3 clients from " + (
        "data.init_args.sites."
    )
    # a data set with its own sites (FLamby's four Heart Disease centers), its folder absent
    heart = str(ROOT / "recipes" / "heart_disease_fedavg.yaml")
    report = cli.run(["cost", "--config", heart, "--data.init_args.root", str(tmp_path / "absent"), "--format", "json"])
    assert report["clients"]["total"] == 4 and report["notes"][0].endswith(": 4 clients, FedHeartDisease's sites.")
    # fit still needs the folder, and says which option is missing
    with pytest.raises(SystemExit):
        cli.main(["fit", "--config", str(recipe)])
    assert capsys.readouterr().err == (
        "fedlit: error: data.init_args.root is required by fedlit.data.SiteFolders and not given: set it in the "
        "recipe or on the command line (--data.init_args.root VALUE).\n"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sites.yaml"]


def test_cost_errors_are_one_line(capsys, tmp_path):
    for argv, expected in (
        (
            ["cost", "--config", QUICKSTART, "--compare", "FedAvgg"],
            "--compare 'FedAvgg' is not a known Strategy. Did you mean 'FedAvg'?",
        ),
        (["cost", "--config", QUICKSTART, "--federation.rounds", "0"], "federation.rounds=0 must be >= 1"),
        (["cost", "--config", QUICKSTART, "--compare", "FedSCA"], "no shared tensor of the model has 'adapter'"),
    ):
        with pytest.raises(SystemExit) as exit_info:
            cli.main(argv)
        err = capsys.readouterr().err
        assert exit_info.value.code == 2
        assert err.startswith("fedlit: error: ") and expected in err and err.count("\n") == 1, err


def test_data_modules_count_their_clients_from_their_arguments():
    from fedlit.data import FedProstateSlices, SiteDataset, SyntheticImages

    synthetic = SyntheticImages(num_clients=3, samples_per_client=12, image_size=8)
    assert synthetic.expected_num_clients() == 3 and synthetic._data is None  # nothing built
    synthetic.setup()
    assert synthetic.expected_num_clients() == len(synthetic.client_ids) == 3
    prostate = ROOT.parent / "shared" / "data" / "site_samples" / "ProstateSlice"
    if prostate.is_dir():
        sites = FedProstateSlices(root=str(prostate), sites=["BIDMC", "HK"], image_size=16)
        assert sites.expected_num_clients() == 2
    samples = SiteDataset(dataset=[(float(i), i % 2) for i in range(8)], sites=[i % 4 for i in range(8)])
    assert samples.expected_num_clients() is None  # its sites are known only by reading them


def test_pfedmoap_tiny_recipe_counts_the_experts_it_downloads(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    report = cli.run(["cost", "--config", str(ROOT / "recipes" / "pfedmoap_tiny.yaml"), "--format", "json"])
    row = report["strategies"][0]
    prompt = 16 * 32 * 4  # one prompt: 16 context tokens x width 32, float32
    # round 1: the global prompt, no expert (no prompt stored yet); round 2: the prompt and K - 1 = 2 peers' prompts
    assert row["per_client_first_round"]["download_bytes"] == prompt
    assert row["per_client_per_round"]["download_bytes"] == prompt + 2 * prompt
    assert row["per_client_per_round"]["download_parameters"] == 3 * 16 * 32
    assert row["run"]["download_bytes"] == 4 * prompt + 4 * 3 * prompt  # 4 clients, 2 rounds
    assert row["run"]["upload_bytes"] == 2 * 4 * prompt  # the prompt only: the gate stays
    capsys.readouterr()
    cli.run(["cost", "--config", str(ROOT / "recipes" / "pfedmoap_tiny.yaml")])
    assert "pFedMoAP in round 1: download 2.00 KB / client" in capsys.readouterr().out


@pytest.mark.long
def test_feddbe_estimate_equals_a_real_run_but_the_noted_warm_up_upload(tmp_path):
    federation = make_federation(tmp_path / "dbe", FedDBE(kappa=0.5), rounds=3)
    estimate = estimate_costs(federation.module, [FedDBE(kappa=0.5)], num_clients=3, rounds=3)["strategies"][0]
    measured = federation.fit()["comm"]
    mean = 8 * 4  # the global mean: one float32 per input of the head (TinyMLP's 8 hidden features)
    assert (
        estimate["per_client_first_round"]["download_bytes"] + mean
        == estimate["per_client_per_round"]["download_bytes"]
    )
    assert measured["download_bytes"] == estimate["run"]["download_bytes"]
    # the warm-up's running means (3 clients, round 1) are the note's, not the table's
    assert measured["upload_bytes"] == estimate["run"]["upload_bytes"] + 3 * mean
    assert "warm-up" in FedDBE.cost_notes[0]
