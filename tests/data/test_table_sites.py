"""SiteTable on a node that holds one site: only that site built, as among all; classes numbered by the recipe."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from fedlit.core.errors import ConfigError, DataError
from fedlit.data import SiteTable


def _frame(site: str, labels: list[str], start: int = 0) -> pd.DataFrame:
    n = len(labels)
    return pd.DataFrame(
        {
            "site": [site] * n,
            "f1": np.arange(start, start + n, dtype=float),
            "f2": np.arange(n, dtype=float) ** 2,
            "label": labels,
        }
    )


def _all(data: SiteTable, client: str, split: str) -> tuple[torch.Tensor, torch.Tensor]:
    loader = (
        data.test_dataloader(client)
        if split == "test"
        else data.val_dataloader(client)
        if split == "val"
        else data.train_dataloader(client, torch.Generator().manual_seed(0))
    )
    xs, ys = zip(*loader, strict=True)
    return torch.cat(xs), torch.cat(ys)


@pytest.fixture
def files(tmp_path):
    """Site a holds x, y and z; site b only x and z (10 rows each)."""
    a = _frame("a", ["x", "y", "z"] * 3 + ["x"])
    b = _frame("b", ["x", "z"] * 5, start=100)
    a.to_csv(tmp_path / "a.csv", index=False)
    b.to_csv(tmp_path / "b.csv", index=False)
    pd.concat([a, b]).to_csv(tmp_path / "all.csv", index=False)
    return tmp_path


def test_a_site_lacking_a_class_keeps_the_recipe_numbers(files):
    data = SiteTable(path=files / "b.csv", class_names=["x", "y", "z"], split_fractions=(0.6, 0.2, 0.2))
    data.only_site("b")
    data.setup()
    assert data.num_classes == 3 and data.data.details["class_names"] == ["x", "y", "z"]
    assert sorted(data.data.targets.unique().tolist()) == [0, 2]  # z is class 2, as on site a
    # without the label map the site numbers its own values: z becomes 1 (what class_names prevents)
    own = SiteTable(path=files / "b.csv")
    with pytest.warns(UserWarning, match=r"numbered by the values this node reads \(\['x', 'z'\]\).*class_names"):
        own.only_site("b")
        own.setup()
    assert own.num_classes == 2 and sorted(own.data.targets.unique().tolist()) == [0, 1]


def test_a_label_outside_the_recipe_list_is_refused_naming_its_line(files):
    data = SiteTable(path=files / "a.csv", class_names=["x", "z"])
    with pytest.raises(
        DataError,
        match=r"a\.csv: column 'label' holds values that are not in "
        r"data\.init_args\.class_names \['x', 'z'\]: line 3: 'y'; line 6: 'y'; "
        r"line 9: 'y'",
    ):
        data.setup()


@pytest.mark.parametrize("names", [["x"], ["x", "x"], ["x", ""]])
def test_bad_class_names_are_refused(files, names):
    with pytest.raises(ConfigError, match="class_names"):
        SiteTable(path=files / "a.csv", task="binary" if names == ["x"] else "multiclass", class_names=names)


def test_a_node_with_its_own_file_builds_its_site_as_the_pooled_file_does(files):
    pooled = SiteTable(path=files / "all.csv", class_names=["x", "y", "z"])
    alone = SiteTable(path=files / "b.csv", class_names=["x", "y", "z"])
    alone.only_site("b")
    assert alone.client_ids == ["b"] and pooled.client_ids == ["a", "b"]
    for split in ("train", "val", "test"):
        xa, ya = _all(alone, "b", split)
        xp, yp = _all(pooled, "b", split)
        assert torch.equal(xa, xp) and torch.equal(ya, yp), split
    assert alone.data.details["train_statistics"]["b"] == pooled.data.details["train_statistics"]["b"]


def test_a_node_whose_site_is_not_in_the_file_is_refused(files):
    data = SiteTable(path=files / "a.csv")
    data.only_site("b")
    with pytest.raises(
        DataError,
        match=r"client-id='b' is not a site of SiteTable \(the sites of column 'site' "
        r"of .*a\.csv: \['a'\]\)",
    ):
        data.setup()
