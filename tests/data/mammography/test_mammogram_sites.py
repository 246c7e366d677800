"""Mammograms: Setting 2's four sources as clients, and generated images in the training split only."""

import numpy as np
import pytest
from PIL import Image

from fedlit.core.errors import ConfigError, DataError
from fedlit.data.mammography import Mammograms
from tests.data.mammography.layouts import make_cbis_ddsm, make_cmmd, make_rsna


@pytest.fixture(scope="module")
def roots(tmp_path_factory):
    base = tmp_path_factory.mktemp("sources")
    return {
        "rsna_root": make_rsna(base / "rsna"),
        "cbis_ddsm_root": make_cbis_ddsm(base / "cbis"),
        "cmmd_root": make_cmmd(base / "cmmd"),
    }


def _generated(folder, normal, cancer):
    for name, n in (("normal", normal), ("cancer", cancer)):
        (folder / name).mkdir(parents=True)
        for i in range(n):
            Image.fromarray(np.full((20, 20), 40 * i, dtype=np.uint8)).save(folder / name / f"g{i}.png")
    return folder


@pytest.mark.filterwarnings("ignore:CMMD")
def test_setting_2_has_four_sources_and_synthetic_images_join_train_only(roots, tmp_path):
    folder = _generated(tmp_path / "gen", normal=1, cancer=3)
    data = Mammograms(**roots, rsna_site_column="site_id", rsna_sites=[1, 2], image_size=16, synthetic={"cmmd": folder})
    assert data.client_ids == ["site_id_1", "site_id_2", "cbis_ddsm", "cmmd"]
    manifest = data.manifest()
    generated = {
        s: [p for p in manifest["clients"]["cmmd"][s] if p.startswith("synthetic_cmmd/")]
        for s in ("train", "val", "test")
    }
    assert sorted(generated["train"]) == ["synthetic_cmmd/cancer/g0.png", "synthetic_cmmd/cancer/g1.png",
                                          "synthetic_cmmd/cancer/g2.png", "synthetic_cmmd/normal/g0.png"]  # fmt: skip
    assert generated["val"] == generated["test"] == []
    assert manifest["details"]["synthetic"] == {"cmmd": {"folder": str(folder), "images": 4, "per_class": [1, 3]}}
    # cmmd: 7 patients x 2 images train, + 4 generated (1 normal, 3 cancer); the other clients have none
    assert data.class_counts()["cmmd"]["train"] == [6 + 1, 8 + 3]
    x, y = data.train_dataloader("cmmd", __import__("torch").Generator()).dataset[14]
    assert x.shape == (3, 16, 16) and float(y) == 0.0  # the generated normal image, read with PIL


@pytest.mark.filterwarnings("ignore:CMMD")
def test_a_synthetic_folder_of_an_unknown_client_or_wrong_layout_is_refused(roots, tmp_path):
    with pytest.raises(ConfigError, match=r"synthetic: \['cmd'\] are not clients.*'cmmd'"):
        Mammograms(cmmd_root=roots["cmmd_root"], synthetic={"cmd": str(tmp_path)}).setup()
    (tmp_path / "benign").mkdir()
    with pytest.raises(DataError, match=r"benign is not a class folder"):
        Mammograms(cmmd_root=roots["cmmd_root"], synthetic={"cmmd": str(tmp_path)}).setup()


def test_a_test_fraction_holds_patients_out_and_a_node_builds_its_own_site(roots):
    data = Mammograms(rsna_root=roots["rsna_root"], rsna_sites=[21, 29], split_fractions=(0.5, 0.25, 0.25), seed=3)
    data.only_site("machine_id_29")
    data.setup()
    splits = data.manifest()["clients"]["machine_id_29"]
    # 8 patients: 4 / 2 / 2, two images each; no patient in two splits
    assert [len(splits[s]) for s in ("train", "val", "test")] == [8, 4, 4]
    patients = [{p.split("/")[2] for p in splits[s]} for s in ("train", "val", "test")]
    assert not (patients[0] & patients[1] or patients[0] & patients[2] or patients[1] & patients[2])
    assert data.client_ids == ["machine_id_29"] and data.manifest()["details"]["test"] == "held out"


def test_bad_options_are_named_together():
    with pytest.raises(ConfigError, match=r"at least one of .*rsna_root.*; .*split_fractions needs train > 0"):
        Mammograms(split_fractions=(0.0, 1.0, 0.0))
