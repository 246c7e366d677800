"""The generated data sets are the same bytes whatever the number of threads: quickstart results must not depend
on ``OMP_NUM_THREADS`` (torch's CPU reductions and convolutions split their sums by thread)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from tests.children import run_child

ROOT = Path(__file__).resolve().parents[2]

#: Builds each generated data set (the quickstart's data section, and the other generators at their defaults)
#: and prints a SHA-256 of its inputs, targets and splits.
BUILD = """
import hashlib, json, sys
import torch, yaml
torch.set_num_threads(int(sys.argv[1]))
from fedlit.data import SyntheticImages, SyntheticSegmentation, SyntheticSignals, SyntheticSurvival
recipe = yaml.safe_load(open(sys.argv[2]))
out = {}
for data in (SyntheticImages(**recipe["data"]["init_args"]), SyntheticSegmentation(seed=0), SyntheticSurvival(seed=0),
             SyntheticSignals(channels=2, length=300, seed=0)):
    built = data.build()
    digest = hashlib.sha256(built.inputs.numpy().tobytes() + built.targets.numpy().tobytes())
    digest.update(json.dumps({c: {s: list(map(int, r)) for s, r in p.items()} for c, p in built.splits.items()},
                             sort_keys=True).encode())
    out[type(data).__name__] = digest.hexdigest()
print(json.dumps(out))
"""


def _digests(threads: int) -> dict[str, str]:
    env = {
        **os.environ,
        "OMP_NUM_THREADS": str(threads),
        "MKL_NUM_THREADS": str(threads),
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    done = run_child(
        [sys.executable, "-c", BUILD, str(threads), str(ROOT / "recipes" / "quickstart.yaml")], cwd=ROOT, env=env
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("threads", [2, 4])
@pytest.mark.long
def test_generated_data_is_the_same_bytes_with_one_thread_or_several(threads):
    one = _digests(1)
    assert set(one) == {"SyntheticImages", "SyntheticSegmentation", "SyntheticSurvival", "SyntheticSignals"}
    assert _digests(threads) == one
