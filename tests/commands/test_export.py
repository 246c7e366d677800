"""``fedlit export``: each client's exported tensors, loaded into a freshly built model, give back the run's own
per-client test metrics; with LoRA the peft adapter folder loads with peft alone; bad input is one clear error."""

from __future__ import annotations

import json
import math
import re
import warnings
from pathlib import Path

import pytest
import torch
import yaml
from lightning.fabric.utilities.seed import seed_everything
from safetensors.torch import load_file, save_file

from fedlit import FedBN
from fedlit.cli import main, run
from fedlit.commands.export import export_federation, load_export
from fedlit.core.errors import CheckpointError, ConfigError, DataError
from fedlit.core.roles import RoleRule
from fedlit.data import SyntheticImages
from fedlit.models import LoRA, SmallCNN, TimmBackbone
from fedlit.tasks import ClassificationModule
from tests.conftest import make_federation

ROOT = Path(__file__).resolve().parents[2]
DATA = {"num_clients": 3, "samples_per_client": 40, "num_classes": 3, "image_size": 16, "seed": 0, "batch_size": 8}


def _vit(lora: bool = True) -> TimmBackbone:
    return TimmBackbone(name="fedlit_test_vit", lora=LoRA(r=2, alpha=4) if lora else None, model_args={"in_chans": 1})


def _lora_recipe(path: Path) -> Path:
    """A frozen tiny ViT with personal LoRA adapters and a shared head (FedAvg)."""
    recipe = {
        "model": {
            "class_path": "fedlit.tasks.ClassificationModule",
            "init_args": {
                "backbone": {
                    "class_path": "fedlit.models.TimmBackbone",
                    "init_args": {
                        "name": "fedlit_test_vit",
                        "lora": {"r": 2, "alpha": 4},
                        "model_args": {"in_chans": 1},
                    },
                },
                "num_classes": 3,
                "lr": 0.05,
                "momentum": 0.9,
                "roles": [{"pattern": "backbone.*lora_*", "role": "personal"}],
            },
        },
        "data": {"class_path": "fedlit.data.SyntheticImages", "init_args": DATA},
        "strategy": {"class_path": "FedAvg"},
        "federation": {"rounds": 2, "local_steps": 3, "seed": 0, "progress_bar": False},
    }
    path.write_text(yaml.safe_dump(recipe))
    return path


CASES = {
    # FedBN: the BatchNorm layers personal, the rest shared (no frozen tensor)
    "quickstart": (
        [
            "--config",
            str(ROOT / "recipes" / "quickstart.yaml"),
            "--data.init_args.samples_per_client",
            "40",
            "--federation.local_epochs",
            "1",
            "--federation.progress_bar",
            "false",
        ],
        lambda: ClassificationModule(
            backbone=SmallCNN(in_channels=1, width=16, depth=2), num_classes=3, roles=[RoleRule("backbone.*", "shared")]
        ),
        {**DATA, "num_clients": 4, "batch_size": 32},
    ),
    # a frozen random backbone: the export holds only LoRA and head, the rest is rebuilt from the seed
    "lora": (
        None,
        lambda: ClassificationModule(backbone=_vit(), num_classes=3, roles=[RoleRule("backbone.*lora_*", "personal")]),
        DATA,
    ),
}


def _fresh(build):
    seed_everything(0, verbose=False)  # the run's seed: the same frozen (randomly initialized) tensors
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return build()


def _test_metrics(module, data, client_id) -> dict[str, float]:
    module.eval()
    module.reset_metrics()
    with torch.no_grad():
        for i, batch in enumerate(data.test_dataloader(client_id)):
            module.validation_step(batch, i)
    return module.compute_metrics()


def _same(a: dict[str, float], b: dict[str, float | None]) -> bool:
    return a.keys() == b.keys() and all(
        (math.isnan(a[k]) and (b[k] is None or math.isnan(b[k]))) or a[k] == b[k] for k in a
    )


@pytest.mark.parametrize("case", CASES)
def test_exported_clients_reproduce_the_runs_test_metrics(case, tmp_path):
    argv, build, data_args = CASES[case]
    argv = argv if argv is not None else ["--config", str(_lora_recipe(tmp_path / "lora.yaml"))]
    run_dir = tmp_path / "run"
    run(["fit", *argv, "--out_dir", str(run_dir), "--federation.rounds", "2"])
    written = run(["export", "--run", str(run_dir)])
    results = json.loads((run_dir / "results.json").read_text())["last"]
    assert results["round"] == 2 and sorted(written) == sorted(results["clients"])
    data = SyntheticImages(**data_args)
    data.setup()
    trained = {}
    for client_id, folder in written.items():
        assert folder == run_dir / "export" / client_id
        module = _fresh(build)
        untouched = _test_metrics(module, data, client_id)
        meta = load_export(folder, module)
        metrics = _test_metrics(module, data, client_id)
        assert _same(metrics, results["clients"][client_id]), (client_id, metrics, results["clients"][client_id])
        assert not _same(untouched, results["clients"][client_id])  # the export is what made the difference
        assert meta["round"] == 2 and meta["client"] == client_id
        assert _same(metrics, meta["metrics"]["test"])
        exported = load_file(folder / "model.safetensors")
        roles = module.parameter_roles()
        if case == "lora":  # exactly the trainable tensors: LoRA personal, the head shared, nothing frozen
            assert sorted(exported) == sorted(n for n, _ in module.named_parameters() if "lora_" in n or "head" in n)
            assert {meta["roles"][n] for n in exported if "lora_" in n} == {"personal"}
        else:
            assert {n for n in exported if meta["roles"][n] == "personal"} == {n for n in exported if ".bn." in n}
        assert all(roles[n] != "frozen" for n in exported)
        trained[client_id] = exported
    # personal tensors differ between clients, shared ones are the server's
    first, second = list(trained.values())[:2]
    personal = [n for n in first if ".bn." in n or "lora_" in n]
    assert personal and all(not torch.equal(first[n], second[n]) for n in personal if n.endswith("weight"))
    assert torch.equal(first["head.weight"], second["head.weight"])


def test_the_peft_adapter_folder_loads_with_peft_alone(tmp_path, capsys):
    from peft import PeftModel, get_peft_model_state_dict

    run_dir = tmp_path / "run"
    run(["fit", "--config", str(_lora_recipe(tmp_path / "lora.yaml")), "--out_dir", str(run_dir)])
    config = json.loads((run_dir / "config.json").read_text())  # as after a resume: the record is not a setting
    config["resumed"] = [{"from_round": 1, "changed": {"federation.rounds": [1, 2]}}]
    (run_dir / "config.json").write_text(json.dumps(config))
    with pytest.raises(SystemExit):
        main(["export", "--run", str(run_dir), "--clients", "site_1,site_7"])
    assert "--clients: ['site_7'] are not clients of this run; its clients are site_0, site_1, site_2" in (
        capsys.readouterr().err
    )
    written = run(["export", "--run", str(run_dir), "--clients", "site_1"])
    assert list(written) == ["site_1"]
    folder = written["site_1"]
    assert sorted(p.name for p in (folder / "adapter").iterdir()) == [
        "adapter_config.json",
        "adapter_model.safetensors",
    ]
    meta = json.loads((folder / "export.json").read_text())
    assert meta["adapter"]["not_included"] == ["head.bias", "head.weight"]
    images = torch.randn(4, 1, 16, 16)
    fedlit_model = _fresh(lambda: ClassificationModule(backbone=_vit(), num_classes=3))
    load_export(folder, fedlit_model)
    plain = _fresh(lambda: _vit(lora=False).build()).eval()  # the backbone without LoRA, as timm builds it
    before = plain(images)
    adapted = PeftModel.from_pretrained(plain, folder / "adapter").eval()
    with torch.no_grad():
        expected = fedlit_model.eval().backbone(images)
        assert torch.allclose(adapted(images), expected, atol=1e-6)
        assert not torch.allclose(before, expected, atol=1e-3)  # training moved the adapters away from B = 0
    loaded = get_peft_model_state_dict(adapted)
    assert len(loaded) == 4  # 2 blocks x (A, B)
    assert all(
        torch.equal(
            v,
            fedlit_model.backbone.get_parameter(
                k.removeprefix("base_model.model.").replace(".weight", ".default.weight")
            ),
        )
        for k, v in loaded.items()
    )


def test_a_run_folder_without_checkpoint_is_one_clear_error(tmp_path, capsys):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(SystemExit) as exit_info:
        main(["export", "--run", str(tmp_path)])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert f"--ckpt_path last: no checkpoint at {tmp_path / 'checkpoints' / 'last.ckpt'}" in err
    assert "--ckpt_path" in err
    (tmp_path / "config.json").unlink()  # a checkpoint, but no recipe to rebuild the model from
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "last.ckpt").write_bytes(b"")
    with pytest.raises(SystemExit):
        main(["export", "--run", str(tmp_path)])
    assert f"--run {tmp_path}: no config.json in that folder" in capsys.readouterr().err


def test_a_tensor_of_another_shape_is_refused(tmp_path):
    module = ClassificationModule(backbone=SmallCNN(in_channels=1, width=16, depth=2), num_classes=3)
    tensors = {n: t.detach().clone() for n, t in module.named_parameters()}
    save_file({**tensors, "head.weight": torch.zeros(4, 32)}, tmp_path / "model.safetensors")
    before = module.head.weight.detach().clone()
    with pytest.raises(
        CheckpointError,
        match=r"1 tensors differ in shape \(head.weight \[4, 32\] in the export, "
        r"\[3, 32\] in the module\)",
    ):
        load_export(tmp_path, module)
    assert torch.equal(module.head.weight, before)  # nothing was copied
    save_file({"backbone.extra.weight": torch.zeros(2)}, tmp_path / "model.safetensors")
    with pytest.raises(CheckpointError, match=r"not in the module \(backbone.extra.weight\)"):
        load_export(tmp_path, module)
    with pytest.raises(CheckpointError, match="no exported model"):
        load_export(tmp_path / "nowhere", module)


def test_a_bert_adapter_is_relative_to_the_transformers_model(tmp_path):
    """HFEncoder injects LoRA into the transformers model it wraps (``backbone.bert``): the adapter loads onto a
    plain ``BertModel`` with peft, as one loaded with ``AutoModel.from_pretrained``."""
    from peft import PeftModel
    from transformers import BertConfig, BertModel

    from fedlit.commands.export import _peft_modules, _save_adapters
    from fedlit.models import HFEncoder, tiny_bert_config

    module = _fresh(
        lambda: ClassificationModule(backbone=HFEncoder(config=tiny_bert_config(), lora=LoRA(r=2)), num_classes=2)
    )
    with torch.no_grad():
        for name, parameter in module.named_parameters():
            if "lora_B" in name:
                parameter.normal_()
    adapters = _peft_modules(module)
    assert list(adapters) == ["backbone.bert"]
    info = _save_adapters(adapters, tmp_path, {"head.weight", "head.bias"})
    assert info == {
        "folders": {"adapter": {"module": "backbone.bert", "tensors": 8}},
        "not_included": ["head.bias", "head.weight"],
    }
    tokens = {"input_ids": torch.tensor([[101, 2023, 2003, 102]]), "attention_mask": torch.ones(1, 4, dtype=torch.long)}
    plain = _fresh(
        lambda: BertModel(
            BertConfig(**{k: v for k, v in tiny_bert_config().items() if k != "model_type"}), add_pooling_layer=False
        )
    ).eval()
    plain.load_state_dict(
        {k.replace(".base_layer.", "."): v for k, v in module.backbone.bert.state_dict().items() if "lora_" not in k}
    )
    before = plain(**tokens).last_hidden_state
    adapted = PeftModel.from_pretrained(plain, tmp_path / "adapter").eval()
    with torch.no_grad():
        expected = module.eval().backbone.bert(**tokens).last_hidden_state
        assert torch.allclose(adapted(**tokens).last_hidden_state, expected, atol=1e-5)
        assert not torch.allclose(before, expected, atol=1e-3)


def test_export_from_python_is_the_store_plus_the_servers_tensors(tmp_path):
    fed = make_federation(tmp_path / "run", FedBN(), rounds=1)
    with pytest.raises(ConfigError, match="after fit"):
        export_federation(fed, tmp_path / "out")
    fed.fit()
    written = export_federation(fed, tmp_path / "out", ["c2", "c0"])
    assert sorted(written) == ["c0", "c2"] and not (tmp_path / "out" / "c1").exists()
    for client_id, folder in written.items():
        exported = load_file(folder / "model.safetensors")
        personal, shared = fed.store.tensors(client_id), fed.strategy.global_state
        assert sorted(exported) == sorted([*personal, *shared]) and personal.keys().isdisjoint(shared)
        assert all(torch.equal(exported[n], t) for n, t in {**personal, **shared}.items())
        assert any(".1." in n for n in personal)  # FedBN: the BatchNorm layer (backbone.1) is personal
        meta = json.loads((folder / "export.json").read_text())
        assert meta["round"] == 1 and meta["checkpoint"] is None and "adapter" not in meta


def test_export_never_writes_outside_out_even_for_unchecked_client_ids(tmp_path, monkeypatch):
    # a federation around data whose ids escaped the data module's check (built by hand): export checks them again
    monkeypatch.setattr("fedlit.data.common.datamodule.check_client_ids", lambda *args, **kwargs: None)
    monkeypatch.setattr("fedlit.engine.loop.lifecycle.check_client_ids", lambda *args, **kwargs: None)
    fed = make_federation(tmp_path / "run", FedBN(), rounds=1, names=["c0", "../escaped", str(tmp_path / "abs")])
    fed.setup()
    out = tmp_path / "out"
    with pytest.raises(
        DataError,
        match=re.escape(
            "fedlit export: the federation's clients: client ids that are not safe as file names: '../escaped' "
            f"holds a path separator; {str(tmp_path / 'abs')!r} holds a path separator."
        ),
    ):
        export_federation(fed, out)
    assert not (tmp_path / "escaped").exists() and not (tmp_path / "abs").exists()
    assert not out.exists()  # checked before anything is written, c0 included


def test_export_refuses_a_client_folder_that_links_outside_out(tmp_path):
    fed = make_federation(tmp_path / "run", FedBN(), rounds=1)
    fed.setup()
    out, elsewhere = tmp_path / "out", tmp_path / "elsewhere"
    elsewhere.mkdir()
    out.mkdir()
    (out / "c1").symlink_to(elsewhere, target_is_directory=True)
    with pytest.raises(DataError, match=re.escape(f"the folders of clients 'c1' -> {elsewhere} are not inside {out}")):
        export_federation(fed, out)
    assert list(elsewhere.iterdir()) == [] and sorted(p.name for p in out.iterdir()) == ["c1"]


def test_client_ids_with_spaces_and_signs_are_exported_under_their_own_names(tmp_path):
    names = ["site a 50%", "$x_1$ Zürich", 'O\'Brien "n"']
    fed = make_federation(tmp_path / "run", FedBN(), rounds=1, names=names)
    fed.setup()
    written = export_federation(fed, tmp_path / "out")
    assert written == {c: tmp_path / "out" / c for c in names}
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == sorted(names)
    assert json.loads((tmp_path / "out" / "site a 50%" / "export.json").read_text())["client"] == "site a 50%"


@pytest.mark.parametrize("under", [False, True])
def test_an_out_that_is_a_file_is_one_clear_error(tmp_path, capsys, under):
    taken = tmp_path / "notes.txt"
    taken.write_text("mine")
    out = taken / "export" if under else taken
    with pytest.raises(SystemExit) as exit_info:
        main(["export", "--run", str(tmp_path / "no_run"), "--out", str(out)])
    assert exit_info.value.code == 2
    where = f"lies under {taken}, which is a file" if under else "is a file"
    assert capsys.readouterr().err == (
        f"fedlit: error: export --out {out} {where}, not a folder: give a folder for the clients' exports "
        f"(created if missing), e.g. --out {tmp_path / 'notes_export'}; nothing was written.\n"
    )
    assert taken.read_text() == "mine"
