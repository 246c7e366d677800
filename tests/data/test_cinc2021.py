"""CinC2021: the challenge's training folders read as five clients, 5-s segments, the 26 scored classes."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedlit.core.errors import ConfigError, DataError
from fedlit.data import CinC2021
from fedlit.data.cinc2021_labels import CLASS_NAMES, NORMAL_INDEX, WEIGHTS, read_header, scored_targets
from tests.data.cinc2021_files import LEADS, write_layout, write_record

CLIENTS = ["chapman_shaoxing", "cpsc_2018", "georgia", "ningbo", "ptb-xl"]
URL = "https://physionet.org/content/challenge-2021/"


def test_five_sources_become_five_clients_of_5_s_segments(tmp_path):
    write_layout(tmp_path / "training", records=10, seconds=10.0)
    data = CinC2021(root=tmp_path, seed=3)  # the folder above training/ works too
    data.setup()
    samples = data.data
    assert data.client_ids == CLIENTS and data.task == "multilabel" and data.num_classes == 26
    # 10 records of 10 s = 2 segments each; records split 8/1/1 (cpsc_2018 holds cpsc_2018_extra too: 16/2/2)
    sizes = {c: tuple(len(samples.splits[c][s]) for s in ("train", "val", "test")) for c in CLIENTS}
    assert sizes == {c: (32, 4, 4) if c == "cpsc_2018" else (16, 2, 2) for c in CLIENTS}
    for client in CLIENTS:
        split = samples.splits[client]
        owners = {s: {samples.samples[client][i].rpartition("#")[0] for i in split[s]} for s in split}
        assert not (owners["train"] & owners["val"]) and not (owners["train"] & owners["test"])
    # record 2 of each folder: RBBB (scored as CRBBB|RBBB, class 5) and an unscored code; record 3: VPB (PVC|VPB,
    # class 18) and sinus bradycardia (class 22)
    georgia = samples.samples["georgia"]
    position = georgia.index("georgia/g1/R30002#1")
    assert torch.equal(samples.targets["georgia"][position].nonzero().flatten(), torch.tensor([5]))
    position = georgia.index("georgia/g1/R30003#0")
    assert samples.targets["georgia"][position].nonzero().flatten().tolist() == [18, 22]
    x = samples.read(georgia[0])
    assert x.shape == (12, 2500) and x.dtype == torch.float32


def test_a_segment_is_in_mv_in_standard_lead_order(tmp_path):
    t = np.arange(6000)
    leads = tuple(reversed(LEADS))  # the file's row j holds lead LEADS[11 - j]
    val = np.stack([j * 100 + t % 7 for j in range(12)])
    write_record(tmp_path / "georgia", "E1", val, leads=leads, gain=200.0, baseline=10, dx="164889003")
    for folder in ("chapman_shaoxing", "cpsc_2018", "cpsc_2018_extra", "ningbo", "ptb-xl"):
        for r in range(3):
            write_record(tmp_path / folder, f"{folder[:2]}{r}", np.zeros((12, 2500)))
    write_record(tmp_path / "georgia", "E2", np.zeros((12, 2500)))
    write_record(tmp_path / "georgia", "E3", np.zeros((12, 2500)))
    data = CinC2021(root=tmp_path)
    data.setup()
    # 6000 samples = 12 s: two 5-s segments, the last 2 s dropped
    assert [s for s in data.data.samples["georgia"] if s.startswith("georgia/E1")] == ["georgia/E1#0", "georgia/E1#1"]
    segment = data.data.read("georgia/E1#1").numpy()
    # lead LEADS[i] is the file's row 11 - i; segment 1 starts at sample 2500; mV = (digital - 10) / 200
    expected = np.stack([((11 - i) * 100 + (np.arange(2500, 5000) % 7) - 10) / 200 for i in range(12)])
    np.testing.assert_allclose(segment, expected, rtol=1e-6)
    assert segment[0, 0] == pytest.approx((1100 + 2500 % 7 - 10) / 200)  # lead I, from row 11: 5.5 (2500 % 7 = 1)


def test_a_250_hz_record_is_resampled_and_a_short_one_left_out(tmp_path):
    for folder in ("chapman_shaoxing", "cpsc_2018", "cpsc_2018_extra", "georgia", "ningbo", "ptb-xl"):
        for r in range(3):
            write_record(tmp_path / folder, f"{folder[:2]}{r}", np.zeros((12, 2500)))
    write_record(tmp_path / "ningbo", "slow", np.full((12, 2500), 300), fs=250)  # 10 s at 250 Hz
    write_record(tmp_path / "ningbo", "short", np.zeros((12, 2000)))  # 4 s: no whole segment
    data = CinC2021(root=tmp_path)
    data.setup()
    ningbo = data.data.samples["ningbo"]
    assert "ningbo/slow#0" in ningbo and "ningbo/slow#1" in ningbo and "ningbo/slow#2" not in ningbo
    assert not any(s.startswith("ningbo/short") for s in ningbo)
    assert data.data.details["left_out_shorter_than_a_segment"]["ningbo"] == 1
    x = data.data.read("ningbo/slow#0")
    assert x.shape == (12, 2500)
    np.testing.assert_allclose(x[:, 100:2400].numpy(), 0.3, atol=1e-3)  # 300 / 1000 mV away from the edges


def test_scored_classes_merge_the_equivalent_codes():
    assert len(CLASS_NAMES) == 26 and CLASS_NAMES[NORMAL_INDEX] == "NSR"
    both = scored_targets(["733534002", "164909002"])  # complete LBBB and LBBB: one class, CLBBB|LBBB (index 4)
    assert both.nonzero()[0].tolist() == [4] and scored_targets(["284470004"]).nonzero()[0].tolist() == [15]
    assert scored_targets(["251173003"]).sum() == 0  # not scored
    w = np.asarray(WEIGHTS)
    # published values of weights.csv: AF x AFL, NSR x QAb, PAC|SVPB x LAD, SB x STach
    assert (w[0, 1], w[14, 19], w[15, 8], w[22, 23]) == (0.5, 0.15, 0.4875, 0.425)
    assert w.shape == (26, 26) and (w == w.T).all() and (np.diag(w) == 1).all()


def test_header_comments_are_read_with_or_without_a_space(tmp_path):
    path = write_record(tmp_path, "A1", np.zeros((12, 10)), dx="164889003,59118001")
    text = path.read_text().replace("#Age: 63", "# Age: 71").replace("#Sex", "# Sex")
    path.write_text(text)
    header = read_header(path)
    assert (header.age, header.sex, header.dx, header.fs, header.num_samples) == (
        71.0,
        "Female",
        ("164889003", "59118001"),
        500.0,
        10,
    )


def test_a_missing_or_wrong_layout_is_refused_naming_it(tmp_path):
    with pytest.raises(DataError) as missing:
        CinC2021(root=tmp_path / "nowhere")
    assert f"no folder {tmp_path / 'nowhere'}" in str(missing.value) and URL in str(missing.value)
    (tmp_path / "georgia").mkdir()
    with pytest.raises(DataError) as lacking:
        CinC2021(root=tmp_path)
    message = str(lacking.value)
    assert "lacks chapman_shaoxing, cpsc_2018, cpsc_2018_extra, ningbo, ptb-xl" in message and URL in message
    assert "georgia," not in message.split("It must hold")[0]


def test_a_header_without_its_mat_or_malformed_is_refused_naming_the_file(tmp_path):
    write_layout(tmp_path, records=3, seconds=5.0)
    (tmp_path / "ningbo" / "g1" / "R40001.mat").unlink()
    with pytest.raises(DataError, match="R40001.hea: its signal file R40001.mat is missing"):
        CinC2021(root=tmp_path).setup()
    write_layout(tmp_path, records=3, seconds=5.0)
    bad = tmp_path / "ptb-xl" / "g1" / "R50000.hea"
    bad.write_text("R50000 twelve 500 2500\n")
    with pytest.raises(DataError, match=r"R50000.hea, line 1 'R50000 twelve 500 2500': invalid literal"):
        CinC2021(root=tmp_path).setup()


def test_bad_options_are_named():
    with pytest.raises(ConfigError) as err:
        CinC2021(root=".", fs=0, seconds=-1, max_records_per_source=0, sources={"a": []})
    message = str(err.value)
    for option in ("fs", "seconds", "max_records_per_source", "sources.a"):
        assert f"data.init_args.{option}" in message


def test_a_sources_mapping_names_the_clients_and_their_folders(tmp_path):
    write_layout(tmp_path, records=4, seconds=5.0)
    data = CinC2021(root=tmp_path, sources={"shaoxing": ["chapman_shaoxing", "ningbo"], "cpsc": ["cpsc_2018"]})
    data.setup()
    assert data.client_ids == ["shaoxing", "cpsc"]
    assert len(data.data.samples["shaoxing"]) == 8 and len(data.data.samples["cpsc"]) == 4  # one segment a record
    assert data.data.samples["shaoxing"][4] == "ningbo/g1/R40000#0"
