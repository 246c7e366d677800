"""PTBXL on generated files in PhysioNet's PTB-XL layout: labels, partitions, splits, lazy WFDB reading, errors."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from fedlit.core.errors import ConfigError, DataError
from fedlit.data import IID, PTBXL, Dirichlet, Natural
from fedlit.data.common.splits import split_sizes
from fedlit.data.ptbxl import label_records, read_statements

wfdb = pytest.importorskip("wfdb", reason="wfdb is not installed (pip install -e '.[dev]')")

LEADS = ["I", "II", "III", "AVR", "AVL", "AVF", "V1", "V2", "V3", "V4", "V5", "V6"]
# scp_statements.csv as PhysioNet ships it (first column unnamed: the code), cut to a few statements.
STATEMENTS = [
    ["", "description", "diagnostic", "form", "rhythm", "diagnostic_class", "diagnostic_subclass"],
    ["NORM", "normal ECG", "1.0", "", "", "NORM", "NORM"],
    ["IMI", "inferior myocardial infarction", "1.0", "", "", "MI", "IMI"],
    ["NDT", "non-diagnostic T abnormalities", "1.0", "1.0", "", "STTC", "STTC"],
    ["LAFB", "left anterior fascicular block", "1.0", "", "", "CD", "LAFB/LPFB"],
    ["LVH", "left ventricular hypertrophy", "1.0", "", "", "HYP", "LVH"],
    ["SR", "sinus rhythm", "", "", "1.0", "", ""],
]
SINGLE = ["NORM", "IMI", "NDT", "LAFB", "LVH"]


def record_codes(i: int) -> dict[str, float]:
    """Record i's scp_codes: 30 single-superclass records (class i % 5), then 4 with two, then 2 with none."""
    if i < 30:
        return {SINGLE[i % 5]: 100.0, "SR": 0.0}
    if i < 34:
        return {"NORM": 50.0, "IMI": 80.0} if i % 2 else {"LVH": 100.0, "NDT": 100.0}
    return {"SR": 0.0}


def signal_of(i: int) -> np.ndarray:
    """Record i's (1000, 12) signal in mV, on the 1/1000 mV grid that format 16 with gain 1000 stores exactly."""
    rng = np.random.default_rng(i)
    return rng.integers(-2000, 2000, size=(1000, 12)) / 1000


def make_ptbxl(root: Path, count: int = 36, sites=None) -> Path:
    """A PTB-XL folder: the two CSV files and ``count`` 10-second 12-lead records at 100 Hz."""
    (root / "records100" / "00000").mkdir(parents=True)
    with (root / "scp_statements.csv").open("w", newline="") as handle:
        csv.writer(handle).writerows(STATEMENTS)
    columns = [
        "ecg_id",
        "patient_id",
        "age",
        "sex",
        "site",
        "device",
        "report",
        "scp_codes",
        "strat_fold",
        "filename_lr",
        "filename_hr",
    ]
    with (root / "ptbxl_database.csv").open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(columns)
        for i in range(count):
            ecg_id = i + 1
            site = "" if sites is None and i == 0 else (sites[i] if sites else f"{float(i % 3)}")
            writer.writerow(
                [
                    ecg_id,
                    f"{1000.0 + i // 2}",
                    "56.0",
                    "1",
                    site,
                    "CS-12   E",
                    "sinusrhythmus, normal",
                    repr(record_codes(i)),
                    i % 10 + 1,
                    f"records100/00000/{ecg_id:05d}_lr",
                    f"records500/00000/{ecg_id:05d}_hr",
                ]
            )
            wfdb.wrsamp(
                f"{ecg_id:05d}_lr",
                fs=100,
                units=["mV"] * 12,
                sig_name=LEADS,
                p_signal=signal_of(i),
                fmt=["16"] * 12,
                adc_gain=[1000.0] * 12,
                baseline=[0] * 12,
                write_dir=str(root / "records100" / "00000"),
            )
    return root


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    return make_ptbxl(tmp_path_factory.mktemp("ptbxl"))


def test_label_modes_by_hand(root):
    superclass = read_statements(root / "scp_statements.csv")
    assert superclass == {"NORM": "NORM", "IMI": "MI", "NDT": "STTC", "LAFB": "CD", "LVH": "HYP"}
    codes = [{"IMI": 100.0, "SR": 0.0}, {"NORM": 50.0, "IMI": 80.0}, {"LVH": 100.0, "NDT": 100.0}, {"SR": 0.0}]
    y, kept, left = label_records(codes, superclass, "single")
    assert (y.tolist(), kept.tolist(), left) == ([1], [0], {"no_superclass": 1, "several_superclasses": 2})
    y, kept, _ = label_records(codes, superclass, "max_likelihood")
    # IMI (80) beats NORM (50); LVH and NDT tie at 100: the code written first, LVH (HYP = 4), wins.
    assert (y.tolist(), kept.tolist()) == ([1, 1, 4], [0, 1, 2])
    y, _, _ = label_records(codes, superclass, "multilabel")
    assert y.dtype == np.float32
    assert y.tolist() == [[0, 1, 0, 0, 0], [1, 1, 0, 0, 0], [0, 0, 1, 0, 1]]


def test_single_label_clients_split_433_and_read_their_records(root):
    data = PTBXL(root=root, num_clients=2, partitioner=IID(), batch_size=4, seed=3)
    built = data.data
    assert (data.task, data.num_classes, built.class_names) == ("multiclass", 5, ["NORM", "MI", "STTC", "CD", "HYP"])
    assert built.details["left_out"] == {"no_superclass": 2, "several_superclasses": 4}
    names = [name for client in built.samples.values() for name in client]
    assert sorted(names) == [f"records100/00000/{i + 1:05d}_lr" for i in range(30)]  # each single-label record once
    for client, identities in built.samples.items():
        expected = [int(Path(n).name[:5]) - 1 for n in identities]
        assert built.targets[client].tolist() == [i % 5 for i in expected]
        assert built.details["ecg_id"][client] == [i + 1 for i in expected]
        assert built.details["patient_id"][client] == [1000 + i // 2 for i in expected]
        sizes = [len(built.splits[client][s]) for s in ("train", "val", "test")]
        assert sizes == split_sizes(len(identities), (0.4, 0.3, 0.3)).tolist()
    client = data.client_ids[0]
    x, y = next(iter(data.test_dataloader(client)))
    assert x.dtype == torch.float32 and x.shape == (4, 12, 1000)
    first = built.samples[client][int(built.splits[client]["test"][0])]
    i = int(Path(first).name[:5]) - 1
    np.testing.assert_allclose(x[0].numpy(), signal_of(i).T, atol=1e-6)
    assert y[0].item() == i % 5


def test_strat_fold_keeps_folds_1_8_9_10(root):
    # One client, so that it surely holds records of folds 9 and 10 (3 each).
    data = PTBXL(root=root, num_clients=1, partitioner=IID(), split="strat_fold", seed=0)
    built = data.data
    for client, identities in built.samples.items():
        folds = {
            s: sorted({(int(Path(identities[p]).name[:5]) - 1) % 10 + 1 for p in built.splits[client][s]})
            for s in ("train", "val", "test")
        }
        assert set(folds["train"]) <= set(range(1, 9)) and folds["val"] == [9] and folds["test"] == [10]
        assert [len(built.splits[client][s]) for s in ("train", "val", "test")] == [24, 3, 3]


def test_dirichlet_default_and_multilabel(root):
    data = PTBXL(root=root, num_clients=2, labels="multilabel", seed=0)
    assert repr(data.partitioner) == "Dirichlet(alpha=0.1, min_size=2)"
    built = data.data
    assert data.task == "multilabel" and built.details["left_out"]["no_superclass"] == 2
    assert sum(len(v) for v in built.samples.values()) == 34
    by_name = {n: t.tolist() for c in built.samples for n, t in zip(built.samples[c], built.targets[c], strict=True)}
    assert by_name["records100/00000/00032_lr"] == [1, 1, 0, 0, 0]  # record 31: NORM and IMI
    assert by_name["records100/00000/00031_lr"] == [0, 0, 1, 0, 1]  # record 30: LVH and NDT


def test_natural_sites_leave_out_records_without_one(root):
    data = PTBXL(root=root, num_clients=3, partitioner=Natural(), seed=0)
    with pytest.warns(UserWarning, match="1 records have no 'site'"):
        built = data.data
    assert data.client_ids == ["site_0", "site_1", "site_2"]
    for client, identities in built.samples.items():
        assert {(int(Path(n).name[:5]) - 1) % 3 for n in identities} == {int(client[-1])}
    assert built.details["left_out"]["no_site"] == 1
    with pytest.warns(UserWarning), pytest.raises(ConfigError, match="3 sites but data.init_args.num_clients=2"):
        PTBXL(root=root, num_clients=2, partitioner=Natural()).setup()


def test_manifest_is_json(root):
    manifest = PTBXL(root=root, num_clients=2, partitioner=IID(), max_samples=12, seed=1).manifest()
    json.dumps(manifest)
    assert sum(len(c["train"]) + len(c["val"]) + len(c["test"]) for c in manifest["clients"].values()) == 12


def test_absent_folder_names_the_layout_and_the_download_page(tmp_path):
    with pytest.raises(DataError) as error:
        PTBXL(root=tmp_path / "ptb-xl")
    message = str(error.value)
    assert "\n" not in message and f"no folder {tmp_path / 'ptb-xl'}" in message
    assert "ptbxl_database.csv, scp_statements.csv and the WFDB records records100/" in message
    assert "https://physionet.org/content/ptb-xl/" in message
    with pytest.raises(DataError, match=r"lacks ptbxl_database.csv, scp_statements.csv, records500/"):
        PTBXL(root=tmp_path, sampling_rate=500)


def test_missing_record_and_bad_scp_codes_are_named(tmp_path):
    root = make_ptbxl(tmp_path / "a", count=12)
    (root / "records100/00000/00004_lr.hea").unlink()
    with pytest.raises(
        DataError,
        match=r"1 of the 12 records used from ptbxl_database.csv are missing \(records100/"
        r"00000/00004_lr.hea\)",
    ):
        PTBXL(root=root, num_clients=2, partitioner=IID()).setup()
    root = make_ptbxl(tmp_path / "b", count=12)
    text = (root / "ptbxl_database.csv").read_text().replace("{'NORM': 100.0, 'SR': 0.0}", "{'NORM': 100.0", 1)
    (root / "ptbxl_database.csv").write_text(text)
    with pytest.raises(DataError, match=r"ptbxl_database.csv, line 2: .*ecg_id '1'"):
        PTBXL(root=root, num_clients=2, partitioner=IID()).setup()


def test_options_are_checked():
    with pytest.raises(ConfigError) as error:
        PTBXL(root="nowhere", sampling_rate=250, labels="superclass", num_clients=0, partitioner=Dirichlet)
    message = str(error.value)
    for part in (
        "sampling_rate must be one of [100, 500], got 250",
        "labels must be one of ['single', 'max_likelihood', 'multilabel'], got 'superclass'",
        "num_clients must be an integer >= 1",
        "partitioner must be a Partitioner",
    ):
        assert part in message
