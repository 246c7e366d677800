"""The eICU loader on a generated folder in the FedPxN authors' layout (tests/data/eicu_files.py)."""

from __future__ import annotations

import gzip
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from fedlit.core.errors import ConfigError, DataError
from fedlit.data import EICU
from fedlit.data.eicu import URL, mean_over_hospitals, pack_stay, rank_hospitals
from tests.data.eicu_files import SERIES, STATICS, write_eicu, write_stay


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_eicu(tmp_path_factory.mktemp("eicu"))


def test_clients_are_the_largest_hospitals_in_the_papers_order_with_their_cached_stays(folder):
    data = EICU(root=folder, clients_top_k=5, max_hours=8)
    assert data.client_ids == ["hospital_73", "hospital_264", "hospital_420", "hospital_243", "hospital_458"]
    # the stay listed in patient.csv without a cached file is left out
    assert [len(data.data.samples[c]) for c in data.client_ids] == [10, 9, 8, 7, 6]
    assert data.data.samples["hospital_73"][:2] == [73001, 73002]
    assert data.task == "multitask" and data.num_classes == 6
    details = data.data.details
    assert details["test_hospitals"] == data.client_ids
    assert (details["series_features"], details["static_features"]) == (SERIES, STATICS)


def test_targets_of_a_stay_worked_out_by_hand(folder):
    data = EICU(root=folder, clients_top_k=5)
    targets = dict(zip(data.data.samples["hospital_73"], data.data.targets["hospital_73"].tolist(), strict=True))
    # 73001: odd -> mort_24h 1; 73001 % 3 = 2 -> mort_48h 0; % 4 = 1 -> LOS 1; disch_24h 1; 73001 % 7 = 5 (known)
    # -> disch_48h 36500 % 10 = 0; acuity 73001 % 12 = 5
    assert targets[73001] == [1.0, 0.0, 1.0, 1.0, 0.0, 5.0]
    # 73003: 73003 % 7 = 0 -> disch_48h unknown (-1); 73005: % 5 = 0 -> LOS NaN -> unknown (-1)
    assert targets[73003] == [1.0, 0.0, 0.0, 3.0, -1.0, 7.0]
    # 73005: odd; digit sum 15 -> % 3 = 0; % 7 = 2 -> disch_48h 36502 % 10 = 2; acuity % 12 = 9
    assert targets[73005] == [1.0, 1.0, -1.0, 5.0, 2.0, 9.0]


def test_a_stays_input_is_mask_series_and_statics_padded_to_max_hours(folder):
    data = EICU(root=folder, clients_top_k=5, max_hours=8)
    x = data.data.read(73002)  # k = 2: 6 hours
    assert x.shape == (8, 1 + SERIES + STATICS) and x.dtype == torch.float32
    assert x[:, 0].tolist() == [1.0] * 6 + [0.0] * 2
    # ts = 73002 % 100 + hour / 10 + feature / 100 (stored as float16)
    assert x[1, 1 : 1 + SERIES].tolist() == pytest.approx([2.1, 2.11, 2.12, 2.13], abs=2e-3)
    assert x[6:, 1 : 1 + SERIES].abs().sum() == 0
    # statics = stay * 0.01 + i on every row, padding included
    assert x[7, 1 + SERIES :].tolist() == pytest.approx([730.02, 731.02, 732.02], abs=0.3)
    assert torch.equal(EICU(root=folder, max_hours=3).data.read(73002), x[:3])


def test_pack_stay_cuts_pads_and_zeroes_non_finite_values():
    out = pack_stay(torch.tensor([[1.0, float("nan")], [2.0, 3.0], [4.0, 5.0]]), torch.tensor([7.0]), 2)
    assert out.tolist() == [[1.0, 1.0, 0.0, 7.0], [1.0, 2.0, 3.0, 7.0]]
    assert pack_stay(torch.ones(1, 1), torch.zeros(0), 2).tolist() == [[1.0, 1.0], [0.0, 0.0]]


def test_splits_cover_each_hospital_and_do_not_depend_on_the_other_hospitals(folder):
    five = EICU(root=folder, clients_top_k=5, split_fractions=(0.6, 0.2, 0.2))
    seven = EICU(root=folder, clients_top_k=7, split_fractions=(0.6, 0.2, 0.2))
    for client in five.client_ids:
        parts = five.data.splits[client]
        assert sorted(np.concatenate(list(parts.values())).tolist()) == list(range(len(five.data.samples[client])))
        for split in ("train", "val", "test"):
            assert np.array_equal(parts[split], seven.data.splits[client][split])
    assert [len(five.data.splits["hospital_73"][s]) for s in ("train", "val", "test")] == [6, 2, 2]
    other_seed = EICU(root=folder, clients_top_k=5, split_fractions=(0.6, 0.2, 0.2), seed=1)
    assert not np.array_equal(other_seed.data.splits["hospital_73"]["test"], five.data.splits["hospital_73"]["test"])


def test_ties_go_to_the_smaller_id_and_a_different_top_k_than_the_papers_warns(folder):
    assert rank_hospitals({5: [1, 2], 3: [1, 2], 9: [1, 2, 3]}) == [9, 3, 5]
    with pytest.warns(UserWarning, match=r"are \[73, 264, 420, 243, 458, 338, 443\], not the FedPxN paper's"):
        data = EICU(root=folder, clients_top_k=7)
        ids = data.client_ids
    assert ids[-2:] == ["hospital_338", "hospital_443"]  # both 5 stays
    assert EICU(root=folder, hospitals=[443, 73]).client_ids == ["hospital_443", "hospital_73"]


def test_a_gzipped_patient_table_as_physionet_ships_it(tmp_path):
    root = write_eicu(tmp_path, stays={73: 3, 264: 3})
    (root / "patient.csv.gz").write_bytes(gzip.compress((root / "patient.csv").read_bytes()))
    (root / "patient.csv").unlink()
    assert EICU(root=root, clients_top_k=2).client_ids == ["hospital_73", "hospital_264"]


def test_missing_files_are_named_with_the_download_page(tmp_path):
    with pytest.raises(DataError) as info:
        EICU(root=tmp_path / "absent")
    message = str(info.value)
    assert f"no folder {tmp_path / 'absent'}" in message and "patient.csv" in message and URL in message
    assert "cached_data/<patientunitstayid>.pt" in message
    (tmp_path / "patient.csv").write_text("patientunitstayid,hospitalid\n1,73\n")
    with pytest.raises(DataError, match=r"lacks cached_data/\. It must hold"):
        EICU(root=tmp_path)


def test_a_wrong_layout_is_refused_naming_the_file(tmp_path):
    root = write_eicu(tmp_path, stays={73: 3, 264: 3})
    (root / "patient.csv").write_text("patientunitstayid,hospital\n73001,73\n")
    with pytest.raises(DataError, match=r"patient\.csv: no column \['hospitalid'\]"):
        EICU(root=root, clients_top_k=1).setup()
    write_eicu(root, stays={73: 3, 264: 3})
    stay = torch.load(root / "cached_data" / "73002.pt")
    del stay["Final Acuity Outcome"]
    torch.save(stay, root / "cached_data" / "73002.pt")
    with pytest.raises(DataError, match=r"73002\.pt: no tensor \['Final Acuity Outcome'\]"):
        EICU(root=root, clients_top_k=1).setup()
    write_stay(root / "cached_data", 73002)
    stay = torch.load(root / "cached_data" / "73002.pt")
    stay["disch_24h"] = torch.tensor([10])
    torch.save(stay, root / "cached_data" / "73002.pt")
    with pytest.raises(DataError, match=r"73002\.pt: 'disch_24h' is 10\.0, not a class 0\.\.9"):
        EICU(root=root, clients_top_k=1).setup()
    write_stay(root / "cached_data", 73002, series=SERIES + 1)
    with pytest.raises(DataError, match=r"73002\.pt: ts has 5 features and statics 3, but the first stay read has 4"):
        EICU(root=root, clients_top_k=1).setup()


def test_options_are_checked(folder):
    with pytest.raises(ConfigError, match=r"clients_top_k must be an integer >= 1 .* got 0"):
        EICU(root=folder, clients_top_k=0)
    with pytest.raises(DataError, match=r"clients_top_k=8 but .* only 7 hospitals"):
        EICU(root=folder, clients_top_k=8).setup()
    with pytest.raises(DataError, match=r"hospitals: \[999\] have no stay"):
        EICU(root=folder, hospitals=[73, 999]).setup()


def test_the_top_5_mean_of_a_results_section_leaves_out_other_hospitals_and_undefined_values():
    clients = {
        "hospital_73": {"auroc": 0.9},
        "hospital_264": {"auroc": float("nan")},
        "hospital_420": {"auroc": 0.6},
        "hospital_443": {"auroc": 0.0},  # trained on, not one of the top 5
    }
    top5 = ["hospital_73", "hospital_264", "hospital_420", "hospital_243", "hospital_458"]
    assert mean_over_hospitals(clients, top5, "auroc") == pytest.approx(0.75)
    assert math.isnan(mean_over_hospitals(clients, ["hospital_264"], "auroc"))
