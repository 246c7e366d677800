"""What ``fedlit export`` writes for inference without fedlit: ``inference.safetensors`` (the whole model, LoRA
merged) and ``preprocessing.json``; the plain-PyTorch snippet of docs/runs.md, run as written on a tiny export."""

from __future__ import annotations

import json
import re
import warnings
from pathlib import Path

import pandas as pd
import pytest
import torch
import yaml
from lightning.fabric.utilities.seed import seed_everything
from safetensors.torch import load_file

from fedlit.cli import run
from fedlit.commands.export import load_export
from fedlit.commands.export_inference import merged_state_dict
from fedlit.core.roles import RoleRule
from fedlit.data import SiteTable, SyntheticImages
from fedlit.models import Identity, LoRA, SmallCNN, TimmBackbone
from fedlit.tasks import ClassificationModule, CoxModule

ROOT = Path(__file__).resolve().parents[2]
#: a real timm ViT shrunk to 2 blocks on 16 x 16 one-channel images: plain timm builds it without fedlit
VIT = {
    "name": "vit_tiny_patch16_224",
    "model_args": {"img_size": 16, "patch_size": 8, "depth": 2, "embed_dim": 16, "num_heads": 2, "in_chans": 1},
}
DATA = {"num_clients": 2, "samples_per_client": 30, "num_classes": 3, "image_size": 16, "seed": 0, "batch_size": 8}
PLACEHOLDER = '"runs/vit_lora/version_0/export/site_0"'


def _build(lora: LoRA | None) -> ClassificationModule:
    seed_everything(0, verbose=False)  # the run's seed: the same randomly initialized frozen tensors
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return ClassificationModule(backbone=TimmBackbone(**VIT, lora=lora), num_classes=3)


def _snippet() -> str:
    """The code block of docs/runs.md that follows the marker naming this file."""
    text = (ROOT / "docs" / "runs.md").read_text()
    marker = r"<!-- tests/commands/test_export_inference.py runs this block[^>]*-->"
    blocks = re.findall(marker + r"\n```python\n(.*?)```", text, re.S)
    assert len(blocks) == 1, "docs/runs.md: the marked plain-PyTorch block is missing or not unique"
    return blocks[0]


def test_the_plain_pytorch_snippet_of_the_docs_predicts_as_fedlit_does(tmp_path, capsys):
    recipe = {
        "model": {
            "class_path": "fedlit.tasks.ClassificationModule",
            "init_args": {
                "backbone": {"class_path": "fedlit.models.TimmBackbone", "init_args": {**VIT, "lora": {"r": 2}}},
                "num_classes": 3,
                "lr": 0.5,
                "roles": [{"pattern": "backbone.*lora_*", "role": "personal"}],
            },
        },
        "data": {"class_path": "fedlit.data.SyntheticImages", "init_args": DATA},
        "strategy": {"class_path": "FedAvg"},
        "federation": {"rounds": 1, "local_steps": 3, "seed": 0, "progress_bar": False},
    }
    (tmp_path / "vit.yaml").write_text(yaml.safe_dump(recipe))
    run(["fit", "--config", str(tmp_path / "vit.yaml"), "--out_dir", str(tmp_path / "run")])
    folder = run(["export", "--run", str(tmp_path / "run")])["site_1"]
    code = _snippet()
    assert code.count(PLACEHOLDER) == 1
    namespace: dict = {}
    capsys.readouterr()
    exec(compile(code.replace(PLACEHOLDER, repr(str(folder))), "docs/runs.md", "exec"), namespace)  # noqa: S102
    printed = capsys.readouterr().out.split(" ", 1)
    assert printed[0] == str(int(namespace["probabilities"].argmax()))  # the class name, then the probabilities
    # the same input through fedlit's own model of that client (LoRA unmerged) gives the same probabilities
    fedlit_model = _build(LoRA(r=2))
    load_export(folder, fedlit_model)
    with torch.no_grad():
        expected = fedlit_model.eval()(namespace["x"].unsqueeze(0))[0].softmax(0)
    assert torch.allclose(namespace["probabilities"], expected, atol=1e-5)
    assert not torch.allclose(namespace["model"].head.weight, _build(None).head.weight)  # trained, not fresh
    pre = json.loads((folder / "preprocessing.json").read_text())
    assert pre == {
        "task": "multiclass",
        "num_classes": 3,
        "class_names": ["0", "1", "2"],
        "normalization": None,
        "input": {"kind": "image", "shape": [1, 16, 16], "dtype": "float32", "channels": 1, "size": [16, 16]},
    }
    assert json.loads((folder / "export.json").read_text())["inference"] == {
        "weights": "inference.safetensors",
        "preprocessing": "preprocessing.json",
    }
    run(["export", "--run", str(tmp_path / "run"), "--out", str(tmp_path / "small"), "--full", "false"])
    assert sorted(p.name for p in (tmp_path / "small" / "site_0").iterdir()) == [
        "adapter",
        "export.json",
        "model.safetensors",
        "preprocessing.json",
    ]


@pytest.mark.parametrize("fused_qkv", ["all", "qv"])
def test_merged_lora_loads_strictly_into_the_model_without_lora_and_computes_the_same(fused_qkv):
    adapted = _build(LoRA(r=2, alpha=4, fused_qkv=fused_qkv))
    with torch.no_grad():
        for name, parameter in adapted.named_parameters():
            if "lora_B" in name:
                parameter.normal_()  # B = 0 would merge to the base weight and prove nothing
    plain = _build(None)
    images = torch.randn(3, 1, 16, 16)
    with torch.no_grad():
        before = plain.eval()(images)
        plain.load_state_dict(merged_state_dict(adapted))  # strict
        assert torch.allclose(plain(images), adapted.eval()(images), atol=1e-5)
        assert not torch.allclose(before, plain(images), atol=1e-3)
    # by hand for block 0's qkv: W + (alpha / r) B A, q, k and v alike, or q and v slices only
    qkv = adapted.backbone.blocks[0].attn.qkv
    a, b = (
        (torch.cat([qkv.lora_A[s].weight for s in ("q", "v")]), None)
        if fused_qkv == "qv"
        else (qkv.lora_A["default"].weight, qkv.lora_B["default"].weight)
    )
    delta = torch.zeros_like(qkv.base_layer.weight)
    if fused_qkv == "qv":
        width = delta.shape[0] // 3
        delta[:width] = qkv.lora_B["q"].weight @ qkv.lora_A["q"].weight
        delta[2 * width :] = qkv.lora_B["v"].weight @ qkv.lora_A["v"].weight
    else:
        delta = b @ a
    assert torch.allclose(
        merged_state_dict(adapted)["backbone.blocks.0.attn.qkv.weight"], qkv.base_layer.weight + 2.0 * delta, atol=1e-6
    )
    assert not any("lora_" in k or "base_layer" in k for k in merged_state_dict(adapted))


def test_preprocessing_of_a_site_table_holds_its_columns_and_train_statistics(tmp_path):
    frame = pd.DataFrame(
        {
            "site": ["a"] * 6 + ["b"] * 6,
            "age": [30, 40, 50, 60, 70, 80, 1, 2, 3, 4, 5, 6],
            "dose": [1.0, 1.0, 2.0, 2.0, 3.0, 3.0, 0, 10, 0, 10, 0, 10],
            "y": [0, 1] * 6,
        }
    )
    frame.to_csv(tmp_path / "t.csv", index=False)
    data = SiteTable(
        path=tmp_path / "t.csv",
        site_column="site",
        target_column="y",
        task="binary",
        split_fractions=(0.5, 0.0, 0.5),
        seed=0,
    )
    data.setup()
    for site in ("a", "b"):
        train = frame.loc[data.data.details["rows"][site], ["age", "dose"]].to_numpy()[
            data.data.splits[site]["train"] - data.data.details["pool"][site][0]
        ]
        pre = data.preprocessing(site)
        assert pre["feature_columns"] == ["age", "dose"]
        assert pre["normalization"]["kind"] == "standardize"
        assert pre["normalization"]["mean"] == pytest.approx(train.mean(axis=0).tolist())
        assert pre["normalization"]["std"] == pytest.approx(train.std(axis=0, ddof=1).tolist())
        assert pre["class_names"] == ["0", "1"] and pre["input"] == {
            "kind": "features",
            "shape": [2],
            "dtype": "float32",
        }
    unscaled = SiteTable(
        path=tmp_path / "t.csv",
        site_column="site",
        target_column="y",
        task="binary",
        split_fractions=(0.5, 0.0, 0.5),
        seed=0,
        standardize=False,
    )
    assert unscaled.preprocessing("a")["normalization"] is None


def test_preprocessing_of_synthetic_images_describes_the_input():
    data = SyntheticImages(**{**DATA, "num_classes": 2, "image_size": 8})
    pre = data.preprocessing("site_0")
    assert pre["input"] == {"kind": "image", "shape": [1, 8, 8], "dtype": "float32", "channels": 1, "size": [8, 8]}
    assert pre["task"] == "multiclass" and pre["class_names"] == ["0", "1"]


def test_a_full_export_is_the_whole_model(tmp_path):
    """Every tensor of the module's state dict (frozen ones too) is in inference.safetensors, LoRA merged."""
    adapted = _build(LoRA(r=2))
    state = merged_state_dict(adapted)
    plain_keys = set(_build(None).state_dict())
    assert set(state) == plain_keys
    from safetensors.torch import save_file

    save_file(state, tmp_path / "x.safetensors")
    assert set(load_file(tmp_path / "x.safetensors")) == plain_keys


def _run_snippet(folder: Path, capsys) -> tuple[dict, str]:
    """The docs/runs.md block run as written on the export ``folder``: its namespace and what it printed."""
    namespace: dict = {}
    capsys.readouterr()
    code = _snippet().replace(PLACEHOLDER, repr(str(folder)))
    exec(compile(code, "docs/runs.md", "exec"), namespace)  # noqa: S102
    return namespace, capsys.readouterr().out


COX_FEATURES = Identity(num_features=8)  # survival_cox.yaml's linear Cox model on 8 features


def _quickstart_model() -> ClassificationModule:
    return ClassificationModule(
        backbone=SmallCNN(in_channels=1, width=16, depth=2), num_classes=3, roles=[RoleRule("backbone.*", "shared")]
    )


@pytest.mark.parametrize(
    "recipe, overrides, build",
    [
        ("quickstart.yaml", ["--data.init_args.samples_per_client", "30"], _quickstart_model),
        ("survival_cox.yaml", ["--data.init_args.samples_per_client", "60"], lambda: CoxModule(backbone=COX_FEATURES)),
    ],
)
def test_the_plain_pytorch_snippet_runs_on_fedlits_own_backbones_and_a_survival_model(
    recipe, overrides, build, tmp_path, capsys
):
    out = tmp_path / "run"
    argv = ["fit", "--config", str(ROOT / "recipes" / recipe), *overrides, "--out_dir", str(out)]
    run([*argv, "--federation.rounds", "1", "--federation.local_epochs", "1", "--federation.progress_bar", "false"])
    folder = run(["export", "--run", str(out), "--clients", "site_1"])["site_1"]
    namespace, printed = _run_snippet(folder, capsys)
    seed_everything(0, verbose=False)  # the run's seed
    fedlit_model = build()
    load_export(folder, fedlit_model)  # the client's trained tensors, into fedlit's own module
    with torch.no_grad():
        expected = fedlit_model.eval()(namespace["x"].unsqueeze(0)).reshape(-1)
    assert torch.allclose(namespace["out"].reshape(-1), expected, atol=1e-5)
    if recipe == "quickstart.yaml":
        assert namespace["head"].bias is not None and tuple(namespace["head"].weight.shape) == (3, 32)
        assert printed.split(" ", 1)[0] == str(int(namespace["probabilities"].argmax()))
    else:  # a Cox model: one risk score, a head without bias, no class names
        assert namespace["head"].bias is None and tuple(namespace["head"].weight.shape) == (1, 8)
        assert namespace["pre"]["class_names"] is None
        assert printed == f"survival [{float(expected[0])!r}]\n"
