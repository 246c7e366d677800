"""ICBHI and SPRSound on generated sound files: cycles, labels, patients, splits, the clip reader, and errors."""

from __future__ import annotations

import json

import numpy as np
import pytest
import soundfile
import torch

from fedlit.core.errors import DataError
from fedlit.data import ICBHI, IID, Natural, SPRSound
from fedlit.data.audio_clips import AudioClip

# name -> (sample rate, seconds, cycles (start, end, crackles, wheezes))
ICBHI_FILES = {
    "101_1b1_Al_sc_Meditron": (4000, 3.0, [(0.0, 1.0, 0, 0), (1.0, 2.0, 1, 0), (2.0, 3.5, 0, 1)]),
    "101_2b1_Ar_sc_Meditron": (16000, 2.0, [(0.25, 0.75, 1, 1), (0.75, 1.25, 0, 0), (1.25, 1.75, 1, 0)]),
    "102_1b1_Tc_sc_LittC2SE": (8000, 2.0, [(0.0, 0.5, 0, 0), (0.5, 1.0, 0, 1), (1.0, 1.5, 0, 0), (1.5, 2.0, 1, 1)]),
}


def tone(rate: int, seconds: float, hz: float = 50.0) -> np.ndarray:
    t = np.arange(int(rate * seconds)) / rate
    return (0.5 * np.sin(2 * np.pi * hz * t)).astype(np.float32)


def write_icbhi(root, files=ICBHI_FILES, split: dict[str, str] | None = None):
    root.mkdir(parents=True, exist_ok=True)
    for name, (rate, seconds, cycles) in files.items():
        soundfile.write(root / f"{name}.wav", tone(rate, seconds), rate)
        (root / f"{name}.txt").write_text("".join(f"{a}\t{b}\t{c}\t{w}\n" for a, b, c, w in cycles))
    if split is not None:
        (root / "ICBHI_challenge_train_test.txt").write_text("".join(f"{n}\t{s}\n" for n, s in split.items()))
    return root


def test_icbhi_cycles_labels_and_patients(tmp_path):
    data = ICBHI(root=write_icbhi(tmp_path / "icbhi"))
    cycles = data.cycles()
    # 3 + 3 + 4 cycles in file-name order; label = crackles + 2 * wheezes
    assert [c.label for c in cycles] == [0, 1, 2, 3, 0, 1, 0, 2, 0, 3]
    assert [c.patient for c in cycles] == ["101"] * 6 + ["102"] * 4
    assert cycles[2].identity == "101_1b1_Al_sc_Meditron.wav@2.0:3.5"
    assert data.class_names == ("normal", "crackle", "wheeze", "both")


def test_icbhi_natural_split_by_patient_and_loaders(tmp_path):
    data = ICBHI(
        root=write_icbhi(tmp_path / "icbhi"), partitioner=Natural(), num_clients=2, clip_seconds=0.5, batch_size=8
    )
    built = data.data
    assert data.client_ids == ["patient_101", "patient_102"]
    assert len(built.samples["patient_101"]) == 6 and len(built.samples["patient_102"]) == 4
    # 4:3:3 of 6 -> 2.4, 1.8, 1.8 -> 2, 2, 2 (largest remainder); of 4 -> 1.6, 1.2, 1.2 -> 2, 1, 1
    assert [len(built.splits["patient_101"][s]) for s in ("train", "val", "test")] == [2, 2, 2]
    assert [len(built.splits["patient_102"][s]) for s in ("train", "val", "test")] == [2, 1, 1]
    for client, splits in built.splits.items():
        assert sorted(np.concatenate(list(splits.values())).tolist()) == list(range(len(built.samples[client])))
    x, y = next(iter(data.train_dataloader("patient_102", torch.Generator().manual_seed(0))))
    assert x.shape == (2, 8000) and x.dtype == torch.float32 and y.dtype == torch.int64
    assert data.preprocessing("patient_101")["normalization"]["sample_rate"] == 16000


def test_icbhi_fraction_and_official_split(tmp_path):
    root = write_icbhi(
        tmp_path / "icbhi",
        split={"101_1b1_Al_sc_Meditron": "train", "101_2b1_Ar_sc_Meditron": "test", "102_1b1_Tc_sc_LittC2SE": "train"},
    )
    half = ICBHI(root=root, partitioner=IID(), num_clients=1, fraction=0.5).data
    assert len(half.samples["client_0"]) == 5  # int(10 * 0.5)
    official = ICBHI(root=root, split="official", partitioner=IID(), num_clients=1).data
    samples, splits = official.samples["client_0"], official.splits["client_0"]
    assert sorted(samples[i] for i in splits["test"]) == sorted(
        f"101_2b1_Ar_sc_Meditron.wav@{a}:{b}" for a, b, _, _ in ICBHI_FILES["101_2b1_Ar_sc_Meditron"][2]
    )
    # the 7 others split 4:3 into train and val: 4, 3
    assert (len(splits["train"]), len(splits["val"])) == (4, 3)


def test_clip_reader_resamples_fades_and_pads(tmp_path):
    rate = 8000
    soundfile.write(tmp_path / "a.wav", tone(rate, 2.0, hz=100.0), rate)
    reader = AudioClip(root=str(tmp_path), sample_rate=16000, clip_seconds=1.0, fade_seconds=0.0)
    x = reader("a.wav@0.5:1.0").numpy()  # 0.5 s -> 8000 samples at 16 kHz, repeated twice
    t = 0.5 + np.arange(8000) / 16000
    expected = 0.5 * np.sin(2 * np.pi * 100 * t)
    assert x.shape == (16000,)
    assert np.abs(x[500:7500] - expected[500:7500]).max() < 0.01  # polyphase filter edges aside
    assert np.array_equal(x[:8000], x[8000:])
    zero = AudioClip(root=str(tmp_path), clip_seconds=1.0, pad="zero", fade_seconds=0.0)("a.wav@0.5:1.0").numpy()
    assert not zero[:4000].any() and not zero[12000:].any() and np.array_equal(zero[4000:12000], x[:8000])
    long = AudioClip(root=str(tmp_path), clip_seconds=0.25, fade_seconds=0.0)("a.wav@0.5:1.0").numpy()
    assert np.array_equal(long, x[:4000])


def test_clip_fades_are_linear_ramps():
    reader = AudioClip(root=".", sample_rate=10, clip_seconds=2.0, fade_seconds=0.4)  # 4-sample fades, 20 samples
    wave = np.ones(10, dtype=np.float32)
    ramp_in, ramp_out = [0, 1 / 3, 2 / 3, 1], [1, 2 / 3, 1 / 3, 0]
    once = np.array(ramp_in + [1, 1] + ramp_out, dtype=np.float32)
    expected = np.concatenate([once, once[:6], once[6:] * ramp_out])  # repeated, then the last 4 faded out again
    assert np.allclose(reader.fit(wave), expected, atol=1e-7)


def test_icbhi_errors_name_the_file_and_line(tmp_path):
    with pytest.raises(DataError, match=r"no folder .*nowhere.*<patient>_<index>.*bhichallenge\.med\.auth\.gr"):
        ICBHI(root=tmp_path / "nowhere")
    root = write_icbhi(tmp_path / "icbhi")
    (root / "101_1b1_Al_sc_Meditron.txt").write_text("0.0\t1.0\t0\n")
    with pytest.raises(DataError, match=r"101_1b1_Al_sc_Meditron\.txt, line 1: expected 'start end crackles"):
        ICBHI(root=root).cycles()
    (root / "101_1b1_Al_sc_Meditron.txt").unlink()
    with pytest.raises(DataError, match=r"has no annotation file 101_1b1_Al_sc_Meditron\.txt"):
        ICBHI(root=root).cycles()
    with pytest.raises(DataError, match=r"split=official needs .*ICBHI_challenge_train_test\.txt"):
        ICBHI(root=root, split="official")


def write_sprsound(root):
    events = {
        "train_json/40000001_3.3_0_p1_11": [
            (0, 1000, "Normal"),
            (1000, 2000, "Wheeze & Crackle"),
            (2000, 3000, "Rhonchi"),
        ],
        "train_json/40000001_3.3_0_p2_12": [(500, 1500, "Fine Crackle"), (1500, 2500, "Stridor")],
        "train_json/40000002_5.0_1_p1_13": [],  # a poor-quality recording: no event
        "test2022_json/40000003_7.1_1_p3_14": [
            (0, 800, "Coarse Crackle"),
            (800, 1600, "Wheeze+Crackle"),
            (1600, 2400, "Wheeze"),
        ],
    }
    for name, items in events.items():
        notes = root / f"{name}.json"
        notes.parent.mkdir(parents=True, exist_ok=True)
        notes.write_text(
            json.dumps(
                {
                    "record_annotation": "Normal",
                    "event_annotation": [{"start": str(a), "end": str(b), "type": kind} for a, b, kind in items],
                }
            )
        )
        wav = root / "wav" / f"{notes.stem}.wav"
        wav.parent.mkdir(exist_ok=True)
        soundfile.write(wav, tone(8000, 3.0), 8000)
    return root


def test_sprsound_events_labels_and_official_split(tmp_path):
    root = write_sprsound(tmp_path / "sprs")
    cycles = SPRSound(root=root).cycles()
    # json files in path order: test2022_json/... first, then train_json/...; FHBench's numbering
    assert [c.label for c in cycles] == [3, 4, 2, 0, 4, 5, 1, 6]
    assert [c.patient for c in cycles] == ["40000003"] * 3 + ["40000001"] * 5
    assert cycles[0].identity == "wav/40000003_7.1_1_p3_14.wav@0.0:0.8"
    official = SPRSound(root=root, split="official", partitioner=IID(), num_clients=1).data
    samples, splits = official.samples["client_0"], official.splits["client_0"]
    assert sorted(samples[i] for i in splits["test"]) == sorted(c.identity for c in cycles[:3])
    (root / "train_json" / "40000001_3.3_0_p2_12.json").write_text(
        json.dumps({"event_annotation": [{"start": "0", "end": "10", "type": "Squeak"}]})
    )
    with pytest.raises(DataError, match=r"40000001_3\.3_0_p2_12\.json, event 0: type 'Squeak' is not one of"):
        SPRSound(root=root).cycles()
    with pytest.raises(DataError, match=r"no folder .*SJTU-YONGFU-RESEARCH-GRP/SPRSound"):
        SPRSound(root=tmp_path / "absent")
