"""ADFTD on generated EEGLAB files in ds004504's layout: windows, labels, subject-level partitions, splits, lazy
reading through open recordings, errors."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest
import torch

from fedlit.core.errors import ConfigError, DataError
from fedlit.data import ADFTD, IID, Natural
from fedlit.data.common.splits import split_sizes

mne = pytest.importorskip("mne", reason="mne is not installed (pip install -e '.[dev]')")
pytest.importorskip("eeglabio", reason="eeglabio is not installed (pip install -e '.[dev]')")

RATE = 50.0
# subject -> (Group, seconds): 6 subjects, 2 per group, of different lengths.
SUBJECTS = {
    "sub-001": ("A", 9),
    "sub-002": ("A", 10),
    "sub-003": ("F", 11),
    "sub-004": ("F", 8),
    "sub-005": ("C", 12),
    "sub-006": ("C", 9),
}


def signal_of(subject: str, derivatives: bool) -> np.ndarray:
    """(3, samples) in microvolts, integers (exact in EEGLAB's float32): subject, channel and sample coded."""
    i, seconds = int(subject[-3:]), SUBJECTS[subject][1]
    t = np.arange(int(seconds * RATE))
    return np.stack([i * 1000 + c * 100 + t % 97 + (0 if derivatives else 50) for c in range(3)]).astype(float)


def make_adftd(root: Path, subjects=SUBJECTS) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    lines = ["participant_id\tGender\tAge\tGroup\tMMSE"] + [f"{s}\tF\t66\t{g}\t20" for s, (g, _) in subjects.items()]
    (root / "participants.tsv").write_text("\n".join(lines) + "\n")
    info = mne.create_info(["Fp1", "Cz", "O2"], RATE, "eeg")
    for subject in subjects:
        for derivatives in (True, False):
            folder = root / ("derivatives" if derivatives else "") / subject / "eeg"
            folder.mkdir(parents=True, exist_ok=True)
            raw = mne.io.RawArray(signal_of(subject, derivatives) * 1e-6, info, verbose="error")
            mne.export.export_raw(folder / f"{subject}_task-eyesclosed_eeg.set", raw, fmt="eeglab", verbose="error")
    return root


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    return make_adftd(tmp_path_factory.mktemp("ds004504"))


def windows_of(seconds: int, window: float, stride: float) -> list[int]:
    """Window starts in samples, worked out on their own: every stride while the window fits."""
    starts, start = [], 0.0
    while start + window <= seconds:
        starts.append(int(round(start * RATE)))
        start += stride
    return starts


def test_subjects_become_clients_whole_and_windows_are_labelled_by_group(root):
    data = ADFTD(root=root, window_seconds=2, num_clients=6, partitioner=Natural(), batch_size=2)
    built = data.data
    assert data.client_ids == list(SUBJECTS)  # one client per subject, named after it
    assert built.class_names == ["AD", "FTD", "CN"] and built.num_classes == 3
    for subject, (group, seconds) in SUBJECTS.items():
        expected = [
            [f"derivatives/{subject}/eeg/{subject}_task-eyesclosed_eeg.set", s] for s in windows_of(seconds, 2, 2)
        ]
        assert built.samples[subject] == expected
        assert built.targets[subject].tolist() == [{"A": 0, "F": 1, "C": 2}[group]] * len(expected)
        sizes = [len(built.splits[subject][s]) for s in ("train", "val", "test")]
        assert sizes == split_sizes(len(expected), (0.4, 0.3, 0.3)).tolist()
        assert built.details["subjects"][subject] == [subject]
    assert (built.details["sampling_rate"], built.details["channels"], built.details["window_samples"]) == (50, 3, 100)


def test_a_window_is_the_recordings_slice_in_microvolts(root):
    data = ADFTD(root=root, window_seconds=1.5, stride_seconds=1, num_clients=2, partitioner=IID(), batch_size=3)
    client = data.client_ids[0]
    x, y = next(iter(data.test_dataloader(client)))
    assert x.dtype == torch.float32 and x.shape == (3, 3, 75)
    file, start = data.data.samples[client][int(data.data.splits[client]["test"][0])]
    subject = Path(file).parent.parent.name
    np.testing.assert_allclose(x[0].numpy(), signal_of(subject, True)[:, start : start + 75], atol=1e-3)
    assert y[0].item() == {"A": 0, "F": 1, "C": 2}[SUBJECTS[subject][0]]
    raw = ADFTD(root=root, derivatives=False, window_seconds=2, num_clients=1, partitioner=IID()).data
    file, start = raw.samples["client_0"][0]
    assert file.startswith("sub-") and raw.read([file, start])[0, 0].item() == pytest.approx(
        signal_of(file[:7], False)[0, start], abs=1e-3
    )


def test_subject_unit_keeps_every_subject_in_one_client_window_unit_does_not(root):
    by_subject = ADFTD(root=root, window_seconds=1, num_clients=3, partitioner=IID(), seed=1).data
    owners = {}
    for client, subjects in by_subject.details["subjects"].items():
        for subject in subjects:
            owners.setdefault(subject, []).append(client)
    assert sorted(owners) == sorted(SUBJECTS) and all(len(c) == 1 for c in owners.values())
    assert sum(len(s) for s in by_subject.samples.values()) == sum(
        len(windows_of(s, 1, 1)) for _, s in SUBJECTS.values()
    )
    by_window = ADFTD(root=root, window_seconds=1, num_clients=3, partitioner=IID(), unit="window", seed=1).data
    assert all(len(s) >= 4 for s in by_window.details["subjects"].values())


def test_the_reader_pickles_and_keeps_a_bounded_number_of_recordings_open(root):
    read = ADFTD(root=root, window_seconds=2, num_clients=1, partitioner=IID(), open_files=2).data.read
    files = [f"derivatives/{s}/eeg/{s}_task-eyesclosed_eeg.set" for s in SUBJECTS]
    for file in files * 2:
        expected = signal_of(Path(file).name[:7], True)[:, 100:200]
        np.testing.assert_allclose(read([file, 100]).numpy(), expected, atol=1e-3)
        assert len(read._open) <= 2
    copy = pickle.loads(pickle.dumps(read))
    assert len(copy._open) == 0
    np.testing.assert_allclose(copy([files[0], 0]).numpy(), signal_of("sub-001", True)[:, :100], atol=1e-3)


def test_absent_data_and_bad_files_say_what_to_do(root, tmp_path):
    with pytest.raises(
        DataError,
        match=r"no folder .*participants.tsv \(participant_id, Group A/F/C\) and "
        r"derivatives/sub-XXX/eeg/sub-XXX_task-eyesclosed_eeg.set .*"
        r"https://openneuro.org/datasets/ds004504",
    ):
        ADFTD(root=tmp_path / "absent")
    partial = make_adftd(tmp_path / "partial", {"sub-001": ("A", 9)})
    (partial / "participants.tsv").write_text("participant_id\tGroup\nsub-001\tA\nsub-002\tX\n")
    with pytest.raises(DataError, match=r"line 3: Group 'X' is not one of \['A', 'F', 'C'\]"):
        ADFTD(root=partial, num_clients=1, partitioner=IID()).build_samples()
    (partial / "participants.tsv").write_text("participant_id\tGroup\nsub-001\tA\nsub-002\tC\n")
    with pytest.raises(DataError, match=r"1 of the 2 recordings .* are missing \(derivatives/sub-002/eeg/"):
        ADFTD(root=partial, num_clients=1, partitioner=IID()).build_samples()
    with pytest.raises(ConfigError, match="window_seconds must be a number of seconds > 0, got 0.*unit must be"):
        ADFTD(root=root, window_seconds=0, unit="subjects")
