"""``fedlit partition``: a recipe's data alone, counted per client, split and class, and plotted."""

from __future__ import annotations

import json
from pathlib import Path

from fedlit.cli import run
from fedlit.commands.partition_summary import summarize, table
from fedlit.data import SyntheticImages

ROOT = Path(__file__).resolve().parents[2]


def test_quickstart_counts_equal_class_counts_and_the_png_exists(tmp_path, capsys):
    summary = run(["partition", "--config", str(ROOT / "recipes" / "quickstart.yaml"), "--out", str(tmp_path)])
    data = SyntheticImages(num_clients=4, samples_per_client=200, num_classes=3, image_size=16, seed=0)
    data.setup()
    expected = data.class_counts()
    assert summary["classes"] == ["class 0", "class 1", "class 2"]
    for client_id, entry in summary["clients"].items():
        assert entry["classes"] == expected[client_id]
        assert entry["samples"] == {s: sum(expected[client_id][s]) for s in ("train", "val", "test")}
    assert sum(e["samples"]["train"] for e in summary["clients"].values()) == 4 * 120  # 60/20/20 of 200 per site
    assert json.loads((tmp_path / "partition.json").read_text()) == json.loads(json.dumps(summary))
    assert (tmp_path / "partition.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    out = capsys.readouterr().out
    row = next(line.split() for line in out.splitlines() if line.startswith("site_2  train"))
    assert row == ["site_2", "train", str(data.num_examples("site_2", "train")), *map(str, expected["site_2"]["train"])]


class _NoClasses:
    """A data module of a task without classes: class_counts() is None."""

    task, evaluation_only, client_ids, data = "segmentation", frozenset(), ["a", "b"], None

    def class_counts(self):
        return None

    def num_examples(self, client_id, split):
        return {"a": 3, "b": 5}[client_id] * {"train": 2, "val": 0, "test": 1}[split]


def test_a_task_without_classes_counts_samples_per_split(tmp_path):
    summary = summarize(_NoClasses())
    assert summary["classes"] is None
    assert summary["clients"]["b"] == {"samples": {"train": 10, "val": 0, "test": 5}}
    assert table(summary).splitlines()[0].split() == ["client", "split", "samples"]
    from fedlit.commands.partition_summary import plot

    assert plot(summary, tmp_path / "p.png").is_file()
