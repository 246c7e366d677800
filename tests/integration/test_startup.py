"""Start-up cost: `fedlit --help`, `fedlit --version` and the quickstart never import the heavy model libraries.

Each check runs in a fresh interpreter, where ``sys.modules`` shows what an import really pulled in.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import fedlit
from tests.children import run_child

ROOT = Path(__file__).resolve().parents[2]
MODEL_LIBRARIES = ("transformers", "peft", "timm", "segment_anything")


def _python(code: str, cwd: Path = ROOT) -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = run_child([sys.executable, "-c", code], cwd=cwd, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip().splitlines()[-1]


def test_help_and_version_import_neither_torch_nor_the_model_libraries():
    loaded = json.loads(
        _python(
            "import json, sys\n"
            "import fedlit, fedlit.cli\n"
            "for argv in (['--help'], ['--version']):\n"
            "    try:\n"
            "        fedlit.cli.main(argv)\n"
            "    except SystemExit as exit:\n"
            "        assert exit.code in (0, None), exit.code\n"
            "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))"
        )
    )
    assert not {"torch", "lightning", "torchmetrics", *MODEL_LIBRARIES} & set(loaded)


def test_version_prints_the_package_version_and_exits_0():
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = run_child([sys.executable, "-m", "fedlit", "--version"], cwd=ROOT, env=env)
    assert (done.returncode, done.stdout.strip()) == (0, f"fedlit {fedlit.__version__}")


def test_building_the_quickstart_imports_no_model_library_from_fedlit(tmp_path):
    # Lightning imports torchmetrics, which imports transformers (and through it timm) when they are installed:
    # fedlit cannot change that. A spy on `import` statements records every model library that a fedlit module
    # asks for, whether or not it was already loaded.
    report = json.loads(
        _python(
            "import builtins, json, sys\n"
            f"HEAVY = {MODEL_LIBRARIES!r}\n"
            "asked, real = [], builtins.__import__\n"
            "def spy(name, globals=None, locals=None, fromlist=(), level=0):\n"
            "    importer = (globals or {}).get('__name__') or ''\n"
            "    if level == 0 and name.split('.')[0] in HEAVY and importer.split('.')[0] == 'fedlit':\n"
            "        asked.append(f'{importer} imports {name}')\n"
            "    return real(name, globals, locals, fromlist, level)\n"
            "builtins.__import__ = spy\n"
            "import fedlit.cli\n"
            f"job = fedlit.cli.prepare(['fit', '--config', {str(ROOT / 'recipes' / 'quickstart.yaml')!r},\n"
            f"                          '--out_dir', {str(tmp_path / 'run')!r}])\n"
            "assert type(job.federation.module).__name__ == 'ClassificationModule'\n"
            "print(json.dumps({'asked': asked,\n"
            "                  'fedlit_models': sorted(m for m in sys.modules if m.startswith('fedlit.models.'))}))",
            cwd=tmp_path,
        )
    )
    assert report["asked"] == []
    assert not {"fedlit.models.hf", "fedlit.models.tiny", "fedlit.models.registry"} & set(report["fedlit_models"])


def test_lazy_names_still_import_and_resolve_as_class_paths():
    from jsonargparse import ArgumentParser

    from fedlit.models import Backbone, HFEncoder, SmallCNN, tiny_bert_config

    parser = ArgumentParser()
    parser.add_argument("--backbone", type=Backbone)
    cfg = parser.parse_args(
        [
            "--backbone",
            json.dumps({"class_path": "fedlit.models.HFEncoder", "init_args": {"config": tiny_bert_config()}}),
        ]
    )
    assert isinstance(parser.instantiate_classes(cfg).backbone, HFEncoder)
    assert SmallCNN.__module__ == "fedlit.models.backbones"
    assert {"Federation", "FedAvg", "RoleRule"} <= set(dir(fedlit)) and fedlit.Federation.__name__ == "Federation"
