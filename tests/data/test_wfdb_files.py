"""read_wfdb on real PhysioNet records (MIT-BIH 100, PTB s0010_re), checked against their bytes and headers read by
hand, and WFDBRecord's checks."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedlit.core.errors import DataError
from fedlit.data.wfdb_files import WFDBRecord, read_wfdb

wfdb = pytest.importorskip("wfdb", reason="wfdb is not installed (pip install -e '.[dev]')")


def test_mit_bih_100_format_212(shared_data):
    # 100.hea: "100 2 360 650000", both signals "212 200 11 1024 <first value>": gain 200 adu/mV, baseline 1024,
    # first values 995 (MLII) and 1011 (V5).
    folder = shared_data / "physionet"
    signal, fs = read_wfdb(folder / "100")
    assert (signal.shape, signal.dtype, fs) == ((2, 650000), np.float32, 360.0)
    # Format 212 packs two 12-bit samples into 3 bytes: s0 = b0 | (b1 & 0x0F) << 8, s1 = b2 | (b1 >> 4) << 8.
    raw = np.fromfile(folder / "100.dat", dtype=np.uint8)[:30].astype(np.int64).reshape(-1, 3)
    adu = np.stack([raw[:, 0] | (raw[:, 1] & 0x0F) << 8, raw[:, 2] | (raw[:, 1] >> 4) << 8])
    adu = np.where(adu >= 2048, adu - 4096, adu)  # 12-bit two's complement
    assert adu[:, 0].tolist() == [995, 1011]
    np.testing.assert_allclose(signal[:, :10], (adu - 1024) / 200, atol=1e-6)
    assert signal[:, 0].tolist() == pytest.approx([(995 - 1024) / 200, (1011 - 1024) / 200])  # -0.145, -0.065 mV


def test_ptb_s0010_re_two_signal_files(shared_data):
    # s0010_re.hea: 15 signals at 1000 Hz, 38400 samples; 12 leads in s0010_re.dat, vx vy vz in s0010_re.xyz, all
    # format 16, gain 2000 adu/mV, baseline 0; the header's first values and 16-bit checksums are checked below.
    folder = shared_data / "physionet"
    signal, fs = read_wfdb(folder / "s0010_re.hea")
    assert (signal.shape, fs) == ((15, 38400), 1000.0)
    dat = np.fromfile(folder / "s0010_re.dat", dtype="<i2").reshape(-1, 12)
    xyz = np.fromfile(folder / "s0010_re.xyz", dtype="<i2").reshape(-1, 3)
    first = [-489, -458, 31, 474, -260, -214, -88, -241, -112, 212, 393, 390, -3, 120, -18]
    checksums = [
        -8337,
        -16369,
        6829,
        4582,
        11687,
        -16657,
        -12469,
        5636,
        -14299,
        -17916,
        -6668,
        -17545,
        -13009,
        7109,
        -1992,
    ]
    adu = np.concatenate([dat, xyz], axis=1).T.astype(np.int64)
    assert adu[:, 0].tolist() == first
    assert ((adu.sum(axis=1) + 32768) % 65536 - 32768).tolist() == checksums
    np.testing.assert_array_equal(signal, (adu / 2000).astype(np.float32))
    assert signal[0, 0] == pytest.approx(-0.2445)
    lead_v5, _ = read_wfdb(folder / "s0010_re", channels=[10])
    np.testing.assert_array_equal(lead_v5[0], signal[10])


def test_missing_and_damaged_records_are_named(tmp_path):
    with pytest.raises(DataError, match=r"nothing\.hea: WFDB header not found"):
        read_wfdb(tmp_path / "nothing")
    wfdb.wrsamp(
        "rec",
        fs=100,
        units=["mV"],
        sig_name=["I"],
        p_signal=np.zeros((50, 1)),
        fmt=["16"],
        adc_gain=[1000],
        baseline=[0],
        write_dir=str(tmp_path),
    )
    (tmp_path / "rec.dat").write_bytes(b"\x00")  # truncated: 1 byte of the 100 the header promises
    with pytest.raises(DataError, match=r"rec\.hea: the WFDB record cannot be read"):
        read_wfdb(tmp_path / "rec")


def test_wfdb_record_checks_rate_and_length(tmp_path):
    values = np.arange(200, dtype=np.float64).reshape(100, 2) / 1000
    wfdb.wrsamp(
        "r",
        fs=100,
        units=["mV", "mV"],
        sig_name=["I", "II"],
        p_signal=values,
        fmt=["16", "16"],
        adc_gain=[1000, 1000],
        baseline=[0, 0],
        write_dir=str(tmp_path),
    )
    x = WFDBRecord(str(tmp_path), fs=100.0, samples=100)("r")
    assert x.dtype == torch.float32 and x.shape == (2, 100)
    np.testing.assert_allclose(x.numpy(), values.T, atol=1e-7)
    with pytest.raises(DataError, match=r"r\.hea: sampled at 100 Hz, expected 500 Hz"):
        WFDBRecord(str(tmp_path), fs=500.0)("r")
    with pytest.raises(DataError, match=r"r\.hea: 100 samples, expected 1000"):
        WFDBRecord(str(tmp_path), samples=1000)("r")
    assert WFDBRecord(str(tmp_path)).missing(["r", "s"]) == ["s"]
