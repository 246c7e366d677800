"""The guides run as written: every ``python`` block of docs/writing_a_strategy.md and docs/writing_a_task.md, and
the marked blocks of docs/runs.md on a tiny run folder; the guide's FedAvgM against values worked out by hand, the
guide's FedProx against the shipped one, the guide's CoxModule against the shipped one."""

from __future__ import annotations

import csv
import functools
import math
import re
import warnings
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from fedlit.cli import run
from fedlit.engine.loop import aggregation
from fedlit.strategies import ClientUpdate, FedAvg, FedProx
from tests.conftest import assert_resume_is_exact, make_federation

ROOT = Path(__file__).resolve().parents[2]
GUIDES = ("writing_a_strategy.md", "writing_a_task.md")
#: A fenced block: its info string, then its text.
FENCE = re.compile(r"^```([^\n]*)\n(.*?)^```[ \t]*$", re.M | re.S)
#: The HTML comment naming the test file that runs the block right below it.
MARKER = re.compile(r"<!-- (tests/\S+\.py)\b[^>]*-->\s*$")
THIS = "tests/docs/test_guides.py"
#: Languages of blocks that are not run (a recipe, a shell command, equations).
NOT_CODE = {"yaml", "bash", "text", ""}


def _blocks(name: str) -> list[tuple[str, str, str | None]]:
    """Each fenced block of ``docs/<name>``: ``(language, text, the test file its marker names or None)``."""
    text = (ROOT / "docs" / name).read_text(encoding="utf-8")
    found = []
    for match in FENCE.finditer(text):
        before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        marker = MARKER.search(before)
        found.append((match.group(1).strip(), match.group(2), marker.group(1) if marker else None))
    return found


def _python(name: str) -> list[str]:
    return [code for language, code, _ in _blocks(name) if language == "python"]


@functools.cache
def _run_guide(name: str) -> dict:
    """Every python block of the guide, in order, in one namespace (a later block may use an earlier one)."""
    namespace: dict = {"__name__": f"guide_{Path(name).stem}"}
    for i, code in enumerate(_python(name)):
        exec(compile(code, f"docs/{name} (python block {i + 1})", "exec"), namespace)  # noqa: S102
    return namespace


def _guide_class(name: str, cls: str) -> type:
    return _run_guide(name)[cls]


# --------------------------------------------------------------------------------------------- every block runs
@pytest.mark.parametrize("name", GUIDES)
def test_every_python_block_of_the_guides_runs(name):
    blocks = _blocks(name)
    assert _python(name), f"docs/{name} has no python block"
    for language, code, _ in blocks:
        # a block in another language must not be Python that escapes this test
        assert language in NOT_CODE | {"python"}, f"docs/{name}: a ```{language} block; use ```python to have it run"
        if language != "python":
            starts = [line for line in code.splitlines() if re.match(r"(import|from \S+ import|def|class) ", line)]
            assert not starts, f"docs/{name}: Python in a ```{language} block is not run: {starts[0]!r}"
    namespace = _run_guide(name)
    defined = {k for k, v in namespace.items() if isinstance(v, type) and v.__module__ == namespace["__name__"]}
    assert defined, f"docs/{name}: its blocks define no class"


def test_every_python_block_of_runs_md_is_run_by_a_named_test():
    blocks = [(code, marker) for language, code, marker in _blocks("runs.md") if language == "python"]
    unmarked = [code.splitlines()[0] for code, marker in blocks if marker is None]
    assert not unmarked, (
        f"docs/runs.md: python blocks without a `<!-- tests/... -->` marker naming the test that runs them: {unmarked}"
    )
    for _, marker in blocks:
        assert (ROOT / marker).is_file(), f"docs/runs.md names {marker}, which does not exist"
        if marker != THIS:  # run elsewhere: that test reads docs/runs.md or does what the block does
            named = (ROOT / marker).read_text(encoding="utf-8")
            assert "docs/runs.md" in named or "PeftModel.from_pretrained" in named, marker
    assert sum(marker == THIS for _, marker in blocks) == 2  # the metrics.csv and the load_export blocks


def test_the_marked_blocks_of_runs_md_run_on_a_tiny_run(tmp_path, monkeypatch):
    # The run the blocks name: the quickstart (FedBN, a SmallCNN) on fewer samples, 2 rounds of 1 local epoch.
    run_dir = tmp_path / "runs" / "quickstart_fedbn" / "version_0"
    run(
        [
            "fit",
            "--config",
            str(ROOT / "recipes" / "quickstart.yaml"),
            "--data.init_args.samples_per_client",
            "40",
            "--federation.local_epochs",
            "1",
            "--federation.rounds",
            "2",
            "--federation.progress_bar",
            "false",
            "--out_dir",
            str(run_dir),
        ]
    )
    written = run(["export", "--run", str(run_dir)])
    monkeypatch.chdir(tmp_path)  # the blocks name the run folder relative to the working directory
    namespace: dict = {}
    for language, code, marker in _blocks("runs.md"):
        if language == "python" and marker == THIS:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)
                exec(compile(code, "docs/runs.md", "exec"), namespace)  # noqa: S102
    # metrics.csv: one mean validation accuracy per round, the mean of the clients' rows of that round
    m = namespace["m"]
    means = m[(m.client == "") & (m.split == "val") & (m.metric == "accuracy_mean")]
    assert means["round"].tolist() == [1, 2]
    with open(run_dir / "metrics.csv", newline="", encoding="utf-8") as f:
        rows = [r for r in csv.DictReader(f) if r["client"] and r["split"] == "val" and r["metric"] == "accuracy"]
    for server_round, mean in zip(means["round"], means["value"], strict=True):
        values = [float(r["value"]) for r in rows if int(r["round"]) == server_round]
        assert len(values) == 4 and mean == pytest.approx(sum(values) / 4)
    # load_export: site_0's exported tensors are in the model the block built
    assert namespace["meta"]["client"] == "site_0" and namespace["meta"]["round"] == 2
    exported = load_file(written["site_0"] / "model.safetensors")
    state = namespace["model"].state_dict()
    assert exported and all(torch.equal(state[n], t) for n, t in exported.items())
    assert not namespace["model"].training


# ---------------------------------------------------------------------------------------------------- FedAvgM
def _fedavgm(**kwargs):
    return _guide_class("writing_a_strategy.md", "FedAvgM")(**kwargs)


def _up(client_id, n, w, count):
    return ClientUpdate(client_id, n, {"w": torch.tensor(w), "n": torch.tensor(count)})


def test_fedavgm_of_the_guide_against_three_rounds_worked_out_by_hand():
    strategy = _fedavgm(server_lr=0.5, beta=0.9)
    strategy.initialize({"w": torch.tensor([1.0, -2.0]), "n": torch.tensor(0)}, ["a", "b"])
    # Round 1: avg = 1/4 [2, 0] + 3/4 [0, -4] = [0.5, -3]; v = w0 - avg = [0.5, 1];
    # w1 = [1, -2] - 0.5 [0.5, 1] = [0.75, -2.5]; the integer n takes the mean (4 + 3 * 8) / 4 = 7.
    ups = [_up("a", 1, [2.0, 0.0], 4), _up("b", 3, [0.0, -4.0], 8)]
    returned = strategy.aggregate(1, ups)
    assert strategy.global_state["w"].tolist() == [1.0, -2.0]  # returned, not stored: the loop stores it
    assert returned["w"].tolist() == pytest.approx([0.75, -2.5])
    strategy.velocity = {}  # the direct call above moved v: start round 1 again, through the loop's own store
    aggregation.aggregate(strategy, 1, ups)
    assert strategy.global_state["w"].tolist() == pytest.approx([0.75, -2.5], abs=1e-7)
    assert strategy.global_state["n"].item() == 7 and strategy.global_state["w"].dtype == torch.float32
    assert strategy.velocity["w"].tolist() == pytest.approx([0.5, 1.0])
    # Round 2: avg = [0.75, -2.5] = w1, so w1 - avg = 0 and v = 0.9 [0.5, 1] = [0.45, 0.9];
    # w2 = [0.75, -2.5] - 0.5 [0.45, 0.9] = [0.525, -2.95]: momentum alone moves the model; n = (10 + 20) / 2 = 15.
    aggregation.aggregate(strategy, 2, [_up("a", 2, [0.75, -0.5], 10), _up("b", 2, [0.75, -4.5], 20)])
    assert strategy.velocity["w"].tolist() == pytest.approx([0.45, 0.9])
    assert strategy.global_state["w"].tolist() == pytest.approx([0.525, -2.95], abs=1e-6)
    assert strategy.global_state["n"].item() == 15
    # Round 3, a alone uploads [1.525, -2.95]: w2 - avg = [-1, 0]; v = 0.9 [0.45, 0.9] + [-1, 0] = [-0.595, 0.81];
    # w3 = [0.525, -2.95] - 0.5 [-0.595, 0.81] = [0.8225, -3.355].
    aggregation.aggregate(strategy, 3, [_up("a", 5, [1.525, -2.95], 3)])
    assert strategy.velocity["w"].tolist() == pytest.approx([-0.595, 0.81], abs=1e-6)
    assert strategy.global_state["w"].tolist() == pytest.approx([0.8225, -3.355], abs=1e-6)
    assert strategy.global_state["n"].item() == 3
    # A round without uploads changes nothing.
    velocity = strategy.velocity["w"].clone()
    aggregation.aggregate(strategy, 4, [])
    assert strategy.global_state["w"].tolist() == pytest.approx([0.8225, -3.355], abs=1e-6)
    assert torch.equal(strategy.velocity["w"], velocity)


def test_fedavgm_of_the_guide_refuses_bad_options():
    with pytest.raises(Exception, match=r"server_lr=0 must be > 0 and beta=1\.0 in \[0, 1\)"):
        _fedavgm(server_lr=0, beta=1.0)


def _final(federation):
    results = federation.fit()
    return results["last"], {n: t.clone() for n, t in federation.strategy.global_state.items()}


def _same_state(a, b) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[n], b[n]) for n in a)


def test_fedavgm_of_the_guide_runs_moves_away_from_fedavg_and_is_fedavg_without_momentum(tmp_path):
    fedavg = _final(make_federation(tmp_path / "fedavg", FedAvg(), rounds=3))
    momentum = _final(make_federation(tmp_path / "momentum", _fedavgm(server_lr=1.0, beta=0.5), rounds=3))
    plain = _final(make_federation(tmp_path / "plain", _fedavgm(server_lr=1.0, beta=0.0), rounds=3))
    assert plain[0] == fedavg[0] and _same_state(plain[1], fedavg[1])  # beta = 0, server_lr = 1: FedAvg
    floats = [n for n, t in fedavg[1].items() if t.is_floating_point()]
    assert all(not torch.allclose(momentum[1][n], fedavg[1][n]) for n in floats if "weight" in n)
    assert momentum[0] != fedavg[0]
    assert all(math.isfinite(v["loss"]) for v in momentum[0]["clients"].values())  # it did not diverge


def test_fedavgm_of_the_guide_resumes_exactly(tmp_path):
    straight, resumed = assert_resume_is_exact(tmp_path, lambda: _fedavgm(server_lr=1.0, beta=0.5))
    assert straight.strategy.velocity and _same_state(straight.strategy.velocity, resumed.strategy.velocity)


def test_fedavgm_of_the_guide_can_aggregate_securely():
    from fedlit.flower.secagg import check_secure_aggregation

    check_secure_aggregation(_fedavgm())  # raises a ConfigError when it cannot


# ---------------------------------------------------------------------------------------------------- FedProx
def test_fedprox_of_the_guide_is_the_shipped_fedprox(tmp_path):
    guide = _final(make_federation(tmp_path / "guide", _guide_class("writing_a_strategy.md", "FedProx")(mu=0.5)))
    shipped = _final(make_federation(tmp_path / "shipped", FedProx(mu=0.5)))
    fedavg = _final(make_federation(tmp_path / "fedavg", FedAvg()))
    assert guide[0] == shipped[0] and _same_state(guide[1], shipped[1])
    assert not _same_state(guide[1], fedavg[1])  # the proximal term acted


# -------------------------------------------------------------------------------------------------- CoxModule
def test_cox_module_of_the_guide_computes_what_the_shipped_one_does():
    from fedlit.models import Identity
    from fedlit.tasks import CoxModule

    guide_cls = _guide_class("writing_a_task.md", "CoxModule")
    torch.manual_seed(0)
    guide = guide_cls(backbone=Identity(num_features=3))
    shipped = CoxModule(backbone=Identity(num_features=3))
    shipped.load_state_dict(guide.state_dict())
    g = torch.Generator().manual_seed(1)
    inputs = torch.randn(12, 3, generator=g)
    # times with ties, about half the samples censored
    targets = torch.stack([torch.randint(1, 6, (12,), generator=g).float(), torch.tensor([1.0, 0.0] * 6)], dim=1)
    a, b = guide.training_step((inputs, targets), 0), shipped.training_step((inputs, targets), 0)
    assert torch.equal(a["loss"], b["loss"]) and a["loss"].item() > 0
    for module in (guide, shipped):
        module.reset_metrics()
        with torch.no_grad():
            module.validation_step((inputs[:6], targets[:6]), 0)
            module.validation_step((inputs[6:], targets[6:]), 1)
    ours, theirs = guide.compute_metrics(), shipped.compute_metrics()
    assert ours == pytest.approx(theirs) and 0.0 <= ours["c_index"] <= 1.0
    assert guide.default_selection_metric == "c_index" and guide.higher_is_better == shipped.higher_is_better
