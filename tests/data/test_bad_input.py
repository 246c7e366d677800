"""Bad input data is refused when a data set is built, naming the file and row (or the client) and the fix.

Corrupted copies of the real files are written into ``tmp_path``; the shared data is never modified.
"""

from __future__ import annotations

import re
import shutil
import warnings
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

from fedlit.core.errors import DataError
from fedlit.data import FederatedDataModule, FedHeartDisease, MedMNIST, PartitionedData
from fedlit.data.heart_disease import FILES

SHARED_DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data"
HEART = SHARED_DATA / "heart_disease"
PNEUMONIA = SHARED_DATA / "pneumoniamnist" / "pneumoniamnist.npz"
KEYS = [f"{s}_{k}" for s in ("train", "val", "test") for k in ("images", "labels")]


# Fed-Heart-Disease ---------------------------------------------------------------------------------------------


@pytest.fixture
def heart_copy(tmp_path: Path) -> Path:
    if not HEART.is_dir():
        pytest.skip(f"real heart disease folder {HEART} is absent (shared/data beside the repository)")
    root = tmp_path / "heart"
    root.mkdir()
    for name in FILES:
        shutil.copy(HEART / name, root / name)
    return root


def _set_field(path: Path, line: int, column: int, value: str) -> None:
    """Write ``value`` into field ``column`` of line ``line`` (1-based, the header is line 1) of a copy."""
    lines = path.read_text().splitlines()
    fields = lines[line - 1].split(",")
    fields[column] = value
    lines[line - 1] = ",".join(fields)
    path.write_text("\n".join(lines) + "\n")


@pytest.mark.parametrize(
    ("token", "shown"), [("1e400", "parses to inf"), ("nan", "parses to nan"), ("-inf", "parses to -inf")]
)
def test_heart_non_finite_value_names_file_line_and_column(heart_copy: Path, token: str, shown: str) -> None:
    path = heart_copy / "processed.hungarian.data"
    _set_field(path, 7, 4, token)  # chol of the 6th patient
    with pytest.raises(DataError) as info:
        FedHeartDisease(root=heart_copy).setup()
    message = str(info.value)
    assert f"{path}: line 7, column 'chol': '{token}' is not finite ({shown})" in message
    assert "write a finite number, or '?' if the value is missing" in message


def test_heart_value_beyond_float32_is_refused(heart_copy: Path) -> None:
    path = heart_copy / "processed.va.data"
    _set_field(path, 3, 0, "1e39")  # finite as a float64, infinite once stored as float32
    with pytest.raises(DataError, match=re.escape(f"{path}: line 3, column 'age': '1e39' is beyond float32's")):
        FedHeartDisease(root=heart_copy).setup()


def test_heart_every_bad_field_is_listed(heart_copy: Path) -> None:
    path = heart_copy / "processed.cleveland.data"
    _set_field(path, 2, 0, "inf")
    _set_field(path, 10, 13, "NaN")  # the target column
    _set_field(path, 20, 3, "abc")
    with pytest.raises(DataError) as info:
        FedHeartDisease(root=heart_copy).setup()
    message = str(info.value)
    assert "line 2, column 'age': 'inf' is not finite" in message
    assert "line 10, column 'target': 'NaN' is not finite" in message
    assert "line 20, column 'trestbps': 'abc' is not a number; write a number, or '?' for a missing value" in message


@pytest.mark.parametrize("token", ["-1", "7", "1.5"])
def test_heart_target_outside_the_diagnoses(heart_copy: Path, token: str) -> None:
    path = heart_copy / "processed.va.data"
    _set_field(path, 12, 13, token)
    with pytest.raises(
        DataError, match=re.escape(f"{path}: line 12, column 'target': '{token}' is not a diagnosis; the target is 0")
    ):
        FedHeartDisease(root=heart_copy).setup()


def test_heart_question_marks_and_empty_fields_stay_missing(heart_copy: Path) -> None:
    """FLamby's protocol: '?' and empty fields are missing and their rows dropped; the result is unchanged."""
    reference = FedHeartDisease(root=HEART)
    path = heart_copy / "processed.cleveland.data"
    _set_field(path, 2, 4, "?")  # the first patient's chol becomes missing: the row is dropped
    _set_field(path, 3, 11, "")  # ca is dropped by the protocol anyway: the row stays
    data = FedHeartDisease(root=heart_copy)
    assert len(data.manifest()["details"]["rows"]["cleveland"]) == 302
    assert data.manifest()["details"]["rows"]["cleveland"][:2] == [1, 2]
    for center in ("hungarian", "switzerland", "va"):
        pool = data.manifest()["details"]["pool"][center]
        ref_pool = reference.manifest()["details"]["pool"][center]
        assert pool[1] - pool[0] == ref_pool[1] - ref_pool[0]


def test_heart_wrong_field_count_names_the_line(heart_copy: Path) -> None:
    path = heart_copy / "processed.switzerland.data"
    lines = path.read_text().splitlines()
    lines[4] += ",1"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(DataError, match=re.escape(f"{path}: line 5 has 15 comma-separated fields, expected 14")):
        FedHeartDisease(root=heart_copy).setup()


def test_heart_center_left_without_complete_rows_names_the_client(heart_copy: Path) -> None:
    path = heart_copy / "processed.switzerland.data"
    lines = path.read_text().splitlines()
    complete = [line for line in lines[1:] if all(f.strip() not in ("", "?") for f in line.split(",")[:10])]
    path.write_text("\n".join([lines[0], complete[0], lines[1]]) + "\n")  # header, one complete, one not
    with pytest.raises(
        DataError, match=re.escape(f"client 'switzerland' ({path}): only 1 of its 2 data rows are complete")
    ):
        FedHeartDisease(root=heart_copy).setup()


def test_heart_too_few_train_rows_for_a_validation_split(heart_copy: Path) -> None:
    path = heart_copy / "processed.switzerland.data"
    lines = path.read_text().splitlines()
    complete = [line for line in lines[1:] if all(f.strip() not in ("", "?") for f in line.split(",")[:10])]
    path.write_text("\n".join([lines[0], *complete[:3]]) + "\n")  # 3 rows: 1 train, 2 test
    assert FedHeartDisease(root=heart_copy, normalize=False).num_examples("switzerland", "train") == 1
    with pytest.raises(DataError, match=re.escape(f"client 'switzerland' ({path}) has 1 train row, too few")):
        FedHeartDisease(root=heart_copy, val_fraction=0.2, normalize=False).setup()
    with pytest.raises(
        DataError, match=re.escape(f"client 'switzerland' ({path}) has 1 train row: standardizing with the std")
    ):
        FedHeartDisease(root=heart_copy).setup()


# MedMNIST ------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pneumonia_slice() -> dict[str, np.ndarray]:
    """The first 40 / 12 / 12 samples of each official split of the real PneumoniaMNIST file."""
    if not PNEUMONIA.is_file():
        pytest.skip(f"real PneumoniaMNIST file {PNEUMONIA} is absent (shared/data beside the repository)")
    with np.load(PNEUMONIA) as f:
        return {key: f[key][: 40 if key.startswith("train") else 12] for key in KEYS}


def _write(path: Path, arrays: dict[str, np.ndarray]) -> Path:
    np.savez(path, **arrays)
    return path


def test_medmnist_slice_of_the_real_file_loads(tmp_path: Path, pneumonia_slice: dict[str, np.ndarray]) -> None:
    data = MedMNIST(path=_write(tmp_path / "pneumoniamnist.npz", pneumonia_slice), num_clients=2)
    assert data.task == "multiclass" and data.num_classes == 2 and len(data.data.targets) == 64


@pytest.mark.parametrize(("bad", "shown"), [(np.nan, "nan"), (np.inf, "inf")])
def test_medmnist_non_finite_pixel_names_file_key_and_index(
    tmp_path: Path, pneumonia_slice: dict[str, np.ndarray], bad: float, shown: str
) -> None:
    arrays = dict(pneumonia_slice, val_images=pneumonia_slice["val_images"].astype(np.float32))
    arrays["val_images"][5, 3, 7] = bad
    arrays["val_images"][9, 0, 0] = bad
    path = _write(tmp_path / "pneumoniamnist.npz", arrays)
    with pytest.raises(DataError) as info:
        MedMNIST(path=path, num_clients=2).setup()
    assert f"{path}: val_images[5, 3, 7] is {shown}, not a finite number; 2 such values in val_images" in str(
        info.value
    )


def test_medmnist_non_finite_label_names_the_key(tmp_path: Path, pneumonia_slice: dict[str, np.ndarray]) -> None:
    arrays = dict(pneumonia_slice, test_labels=pneumonia_slice["test_labels"].astype(np.float64))
    arrays["test_labels"][4, 0] = np.nan
    path = _write(tmp_path / "pneumoniamnist.npz", arrays)
    with pytest.raises(DataError, match=re.escape(f"{path}: test_labels[4, 0] is nan, not a finite number")):
        MedMNIST(path=path, num_clients=2).setup()


def test_medmnist_truncated_file(tmp_path: Path, pneumonia_slice: dict[str, np.ndarray]) -> None:
    whole = _write(tmp_path / "whole.npz", pneumonia_slice).read_bytes()
    path = tmp_path / "pneumoniamnist.npz"
    path.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(DataError) as info:
        MedMNIST(path=path, num_clients=2).setup()
    message = str(info.value)
    assert f"{path} (data.init_args.path) is not a readable .npz archive (BadZipFile" in message
    assert "download pneumoniamnist.npz again from https://zenodo.org/records/10519652" in message
    assert "pickle" not in message


@pytest.mark.parametrize("content", [b"", b"age,sex\n63,1\n"], ids=["empty", "text"])
def test_medmnist_not_a_zip(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "pneumoniamnist.npz"
    path.write_bytes(content)
    with pytest.raises(DataError) as info:
        MedMNIST(path=path, num_clients=2).setup()
    message = str(info.value)
    assert f"{path} (data.init_args.path) is not a readable .npz archive" in message
    assert "download pneumoniamnist.npz again" in message
    assert "pickle" not in message and info.value.__cause__ is None and info.value.__suppress_context__


def test_medmnist_single_npy_array(tmp_path: Path) -> None:
    path = tmp_path / "pneumoniamnist.npz"
    with path.open("wb") as f:
        np.save(f, np.zeros((4, 28, 28), np.uint8))
    with pytest.raises(DataError, match=re.escape(f"{path} (data.init_args.path) holds a single .npy array")):
        MedMNIST(path=path, num_clients=2).setup()


def test_medmnist_damaged_member(tmp_path: Path, pneumonia_slice: dict[str, np.ndarray]) -> None:
    path = _write(tmp_path / "pneumoniamnist.npz", pneumonia_slice)
    with zipfile.ZipFile(path) as z:
        info = z.getinfo("train_images.npy")
    raw = bytearray(path.read_bytes())
    start = info.header_offset + 30 + len(info.filename) + 200  # inside the pixels, past the .npy header
    raw[start : start + 50] = bytes(50)  # zeros: the CRC-32 no longer matches
    path.write_bytes(bytes(raw))
    with pytest.raises(DataError, match=re.escape(f"{path}: key 'train_images' cannot be read (BadZipFile")):
        MedMNIST(path=path, num_clients=2).setup()


def test_medmnist_missing_key_is_a_data_error(tmp_path: Path, pneumonia_slice: dict[str, np.ndarray]) -> None:
    arrays = {k: v for k, v in pneumonia_slice.items() if k != "test_labels"}
    path = _write(tmp_path / "pneumoniamnist.npz", arrays)
    with pytest.raises(DataError, match=re.escape(f"{path} (data.init_args.path) lacks keys ['test_labels']")):
        MedMNIST(path=path, num_clients=2).setup()


def test_medmnist_object_array_is_refused_without_advising_pickle(
    tmp_path: Path, pneumonia_slice: dict[str, np.ndarray]
) -> None:
    labels = np.empty(12, dtype=object)
    labels[:] = [[int(v)] for v in pneumonia_slice["val_labels"][:, 0]]
    path = _write(tmp_path / "pneumoniamnist.npz", dict(pneumonia_slice, val_labels=labels))
    with pytest.raises(DataError) as info:
        MedMNIST(path=path, num_clients=2).setup()
    message = str(info.value)
    assert f"{path}: key 'val_labels' holds Python objects (an object array), which fedlit does not load" in message
    assert "allow_pickle" not in message and "pickle" not in message
    assert info.value.__cause__ is None and info.value.__suppress_context__


def test_medmnist_negative_label(tmp_path: Path, pneumonia_slice: dict[str, np.ndarray]) -> None:
    arrays = dict(pneumonia_slice, train_labels=pneumonia_slice["train_labels"].astype(np.int64))
    arrays["train_labels"][17, 0] = -1
    path = _write(tmp_path / "pneumoniamnist.npz", arrays)
    with pytest.raises(DataError, match=re.escape(f"{path}: train_labels[17, 0] is -1, a negative label")):
        MedMNIST(path=path, num_clients=2).setup()


def test_medmnist_fractional_label(tmp_path: Path, pneumonia_slice: dict[str, np.ndarray]) -> None:
    arrays = dict(pneumonia_slice, val_labels=pneumonia_slice["val_labels"].astype(np.float32))
    arrays["val_labels"][3, 0] = 0.5
    path = _write(tmp_path / "pneumoniamnist.npz", arrays)
    with pytest.raises(DataError, match=re.escape(f"{path}: val_labels[3, 0] is 0.5, not a whole number")):
        MedMNIST(path=path, num_clients=2).setup()


def test_medmnist_binary_label_out_of_range_names_key_and_index(
    tmp_path: Path, pneumonia_slice: dict[str, np.ndarray]
) -> None:
    arrays = dict(pneumonia_slice, test_labels=pneumonia_slice["test_labels"].copy())
    arrays["test_labels"][6, 0] = 2
    path = _write(tmp_path / "pneumoniamnist.npz", arrays)
    with pytest.raises(
        DataError,
        match=re.escape(f"task='binary' needs 0/1 labels; {path}: test_labels[6] is 2 (labels present: [0, 1, 2])"),
    ):
        MedMNIST(path=path, num_clients=2, task="binary").setup()


def test_medmnist_multilabel_label_out_of_range(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    arrays = {}
    for split, n in (("train", 20), ("val", 6), ("test", 6)):
        arrays[f"{split}_images"] = rng.integers(0, 256, (n, 8, 8), dtype=np.uint8)
        arrays[f"{split}_labels"] = (rng.random((n, 3)) < 0.4).astype(np.uint8)
    arrays["val_labels"][2, 1] = 3
    path = _write(tmp_path / "tinychestmnist.npz", arrays)
    with pytest.raises(DataError, match=re.escape(f"{path}: val_labels[2, 1] is 3 (labels present: [0, 1, 3])")):
        MedMNIST(path=path, num_clients=2).setup()


# FederatedDataModule: the generic checks of the pool and the splits --------------------------------------------


class Pool(FederatedDataModule):
    """A data set made of given tensors and splits, to check what ``setup()`` refuses."""

    def __init__(self, inputs, targets, splits, task="multiclass", num_classes=3) -> None:
        super().__init__(batch_size=2)
        self.parts = PartitionedData(name="pool", task=task, num_classes=num_classes, inputs=inputs,
                                     targets=targets, splits=splits, partitioner="given")  # fmt: skip

    def build(self) -> PartitionedData:
        return self.parts


def _splits(*sizes: tuple[int, int, int]) -> dict[str, dict[str, np.ndarray]]:
    """Consecutive pool indices for clients c0, c1, ... with (train, val, test) sizes."""
    splits, start = {}, 0
    for k, client_sizes in enumerate(sizes):
        splits[f"c{k}"] = {}
        for split, n in zip(("train", "val", "test"), client_sizes, strict=True):
            splits[f"c{k}"][split] = np.arange(start, start + n)
            start += n
    return splits


def test_pool_non_finite_input_names_class_and_sample() -> None:
    inputs = torch.zeros(12, 4)
    inputs[7, 2] = float("nan")
    inputs[9, 0] = float("inf")
    data = Pool(inputs, torch.zeros(12, dtype=torch.int64), _splits((2, 1, 1), (4, 2, 2)))
    message = "Pool (pool): input of sample 7 holds nan (2 samples with a non-finite input)"
    with pytest.raises(DataError, match=re.escape(message)):
        data.setup()
    with pytest.raises(DataError, match="input of sample 7"):
        _ = data.data  # the lazy accessor checks too


def test_pool_non_finite_float_target() -> None:
    targets = torch.tensor([0.0, 1.0, 1.0, float("inf"), 0.0, 1.0])
    data = Pool(torch.zeros(6, 4), targets, _splits((2, 1, 1), (1, 0, 1)), task="binary", num_classes=1)
    with pytest.raises(DataError, match=re.escape("Pool (pool): target of sample 3 holds inf")):
        data.setup()


@pytest.mark.parametrize(("bad", "index"), [(-1, 2), (3, 5)])
def test_pool_multiclass_target_out_of_range(bad: int, index: int) -> None:
    targets = torch.tensor([0, 1, 2, 0, 1, 2, 0, 1])
    targets[index] = bad
    data = Pool(torch.zeros(8, 4), targets, _splits((4, 0, 4)))
    with pytest.raises(
        DataError, match=re.escape(f"Pool (pool): target of sample {index} is {bad}, outside the 3 classes 0..2")
    ):
        data.setup()


def test_pool_binary_target_not_0_1() -> None:
    targets = torch.tensor([0.0, 1.0, 1.0, 0.0, 2.0, 0.5])
    data = Pool(torch.zeros(6, 4), targets, _splits((4, 0, 2)), task="binary", num_classes=1)
    with pytest.raises(
        DataError, match=re.escape("Pool (pool): binary targets must be 0 or 1, target of sample 4 is 2.0 (2 such")
    ):
        data.setup()


def test_pool_multiclass_float_targets_are_refused() -> None:
    data = Pool(torch.zeros(4, 4), torch.zeros(4), _splits((2, 0, 2)))
    with pytest.raises(DataError, match=r"multiclass targets must be integers \(int64\), got torch.float32"):
        data.setup()


def test_empty_train_or_test_split_names_every_client_and_split() -> None:
    data = Pool(torch.zeros(15, 4), torch.zeros(15, dtype=torch.int64),
                _splits((3, 1, 1), (2, 1, 0), (3, 1, 1), (0, 1, 1)))  # fmt: skip
    with pytest.raises(DataError) as info:
        data.setup()
    message = str(info.value)
    assert "client 'c1' has 0 test samples in Pool (pool) (train 2, val 1, test 0)" in message
    assert "client 'c3' has 0 train samples in Pool (pool) (train 0, val 1, test 1)" in message
    assert "lower num_clients or change the partition" in message
    assert "'c0'" not in message and "'c2'" not in message


def test_empty_val_split_is_allowed() -> None:
    data = Pool(torch.zeros(8, 4), torch.tensor([0, 1, 2, 0, 1, 2, 0, 1]), _splits((3, 0, 1), (2, 0, 2)))
    data.setup()
    assert data.val_dataloader("c0") is None and data.num_examples("c1", "train") == 2


def test_split_index_outside_the_pool() -> None:
    splits = _splits((2, 0, 2))
    splits["c0"]["test"] = np.array([2, 4])
    data = Pool(torch.zeros(4, 4), torch.zeros(4, dtype=torch.int64), splits)
    message = "client 'c0''s test split holds index 4, outside the 4 samples of the pool"
    with pytest.raises(DataError, match=re.escape(message)):
        data.setup()


def test_no_client_at_all() -> None:
    data = Pool(torch.zeros(0, 4), torch.zeros(0, dtype=torch.int64), {})
    with pytest.raises(DataError, match=re.escape("Pool (pool) builds no client")):
        data.setup()


# Image files (read lazily by SiteFolders, the segmentation sites) ----------------------------------------------


def _grey_png(path: Path, side: int = 64) -> Path:
    from PIL import Image

    Image.new("L", (side, side), 7).save(path)
    return path


def test_decompression_bomb_names_the_file_the_size_and_the_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import PIL.Image

    from fedlit.data.common.samples import ImageFile
    from fedlit.data.segmentation_sites import decode_image

    path = _grey_png(tmp_path / "huge.png")  # 4096 pixels: over twice a limit of 1000 is PIL's error
    monkeypatch.setattr(PIL.Image, "MAX_IMAGE_PIXELS", 1000)
    for read in (lambda: ImageFile(root=str(tmp_path))("huge.png"), lambda: decode_image(path, None)):
        with pytest.raises(DataError) as info:
            read()
        message = str(info.value)
        assert message.startswith(f"{path}: refused as a possible decompression bomb: Image size (4096 pixels)")
        assert "PIL.Image.MAX_IMAGE_PIXELS (1000 pixels" in message and "If the file is trusted, raise it" in message
        assert info.value.__cause__ is None and info.value.__suppress_context__
    monkeypatch.setattr(PIL.Image, "MAX_IMAGE_PIXELS", 3000)  # under twice the limit PIL only warns ...
    with pytest.warns(PIL.Image.DecompressionBombWarning):
        assert ImageFile(root=str(tmp_path), channels=1)("huge.png").shape == (1, 64, 64)
    with warnings.catch_warnings(), pytest.raises(DataError, match=re.escape(f"{path}: refused as a possible dec")):
        warnings.simplefilter("error", PIL.Image.DecompressionBombWarning)  # ... unless warnings are made errors
        ImageFile(root=str(tmp_path))("huge.png")


@pytest.mark.parametrize(
    ("name", "why"), [("cut.png", "OSError: image file is truncated"), ("text.png", "UnidentifiedImageError")]
)
def test_truncated_or_garbage_image_names_the_file(tmp_path: Path, name: str, why: str) -> None:
    from fedlit.data.common.samples import ImageFile
    from fedlit.data.segmentation_sites import decode_image

    whole = _grey_png(tmp_path / "whole.png").read_bytes()
    (tmp_path / "cut.png").write_bytes(whole[: len(whole) // 2])
    (tmp_path / "text.png").write_bytes(b"not an image\n")
    expected = re.escape(f"{tmp_path / name}: cannot be read as an image ({why}")
    with pytest.raises(DataError, match=expected):
        ImageFile(root=str(tmp_path))(name)
    with pytest.raises(DataError, match=expected):
        decode_image(tmp_path / name, None)


def _tiny_medmnist() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    arrays = {}
    for split, n in (("train", 20), ("val", 6), ("test", 6)):
        arrays[f"{split}_images"] = rng.integers(0, 256, (n, 8, 8), dtype=np.uint8)
        arrays[f"{split}_labels"] = rng.integers(0, 2, (n, 1), dtype=np.uint8)
    return arrays


@pytest.mark.parametrize(
    ("key", "shape", "expected"),
    [
        ("train_images", (20,), "(N, H, W) for grey images or (N, H, W, 3)"),
        ("val_images", (6, 8, 8, 3, 1), "(N, H, W) for grey images"),
        ("test_images", (6, 8, 8, 2), "(N, H, W) for grey images"),
        ("train_labels", (), "(N,) or (N, L): one row of L labels per image"),
        ("val_labels", (6, 1, 1), "(N,) or (N, L)"),
    ],
)
def test_medmnist_array_of_the_wrong_dimensions_names_file_key_and_shape(
    tmp_path: Path, key: str, shape: tuple[int, ...], expected: str
) -> None:
    path = _write(tmp_path / "tinymnist.npz", dict(_tiny_medmnist(), **{key: np.zeros(shape, np.uint8)}))
    with pytest.raises(DataError) as info:
        MedMNIST(path=path, num_clients=2).setup()
    assert str(info.value).startswith(f"{path}: array {key!r} has shape {shape}; a MedMNIST file holds {expected}")


def test_medmnist_splits_of_different_image_or_label_shapes(tmp_path: Path) -> None:
    path = _write(tmp_path / "tinymnist.npz", dict(_tiny_medmnist(), test_images=np.zeros((6, 8, 8, 3), np.uint8)))
    with pytest.raises(
        DataError,
        match=re.escape(
            f"{path}: the splits' images differ in shape (train_images ('N', 8, "
            "8), val_images ('N', 8, 8), test_images ('N', 8, 8, 3))"
        ),
    ):
        MedMNIST(path=path, num_clients=2).setup()
    arrays = dict(_tiny_medmnist(), val_labels=np.zeros((6, 2), np.uint8))
    with pytest.raises(DataError, match=re.escape("the splits' labels differ in shape")):
        MedMNIST(path=_write(path, arrays), num_clients=2).setup()
    arrays = dict(
        _tiny_medmnist(),
        train_labels=np.zeros(20, np.uint8),
        val_labels=np.zeros((0, 1), np.uint8),
        val_images=np.zeros((0, 8, 8), np.uint8),
    )
    assert MedMNIST(path=_write(path, arrays), num_clients=1).task == "multiclass"  # (N,) labels, an empty split


def test_a_heart_disease_file_that_is_not_utf8_names_the_byte_and_line(tmp_path: Path) -> None:
    from fedlit.data.heart_disease import _read

    path = tmp_path / "processed.va.data"
    good = b"63,1,1,145,233,1,2,150,0,2.3,3,0,6,0\n"
    path.write_bytes(good + b"67,1,4,160,286,0,2,108,1,1.5,2,3,3,2 \xe9\n")
    with pytest.raises(DataError) as err:
        _read(path)
    offset = len(good) + len(b"67,1,4,160,286,0,2,108,1,1.5,2,3,3,2 ")
    assert str(err.value).startswith(f"{path}: not UTF-8 text: byte {offset} (line 2) is 0xe9; save the file as UTF-8")


def test_a_medical_abstracts_file_that_is_not_utf8_names_the_byte_and_line(tmp_path: Path) -> None:
    from fedlit.data import MedicalAbstracts

    path = tmp_path / "medical_tc_test.csv"
    head = b"condition_label,medical_abstract\n1,a text\n" + b"2,b " * 5000  # past the decoder's first chunk
    path.write_bytes(head + b"caf\xe9 text\n")
    with pytest.raises(DataError) as err:
        _ = MedicalAbstracts(root=tmp_path).data
    assert str(err.value).startswith(f"{path}: not UTF-8 text: byte {len(head) + 3} (line 3) is 0xe9; ")
    assert "download it again" in str(err.value)


def _small_medmnist() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    sizes = {"train": 40, "val": 12, "test": 12}
    arrays = {f"{s}_images": rng.integers(1, 255, (n, 8, 8), dtype=np.uint8) for s, n in sizes.items()}
    return arrays | {f"{s}_labels": (np.arange(n) % 2).astype(np.uint8)[:, None] for s, n in sizes.items()}


@pytest.mark.parametrize(
    ("scale", "expected"),
    [
        (
            1e6,
            r"train_images\[0, 0, 0\] is \d+\.0, outside the pixel range 0\.\.255 \(MedMNIST images are uint8; "
            r"rescale to 0\.\.255 and save as np\.uint8\); 2560 such values in train_images",
        ),
        (
            1 / 255,
            r"train_images\[0, 0, 0\] is 0\.\d+, not a whole number: pixels are uint8 0\.\.255 \(an array "
            r"scaled to \[0, 1\]\? save \(images \* 255\)\.round\(\)\.astype\(np\.uint8\)\)",
        ),
    ],
)
def test_medmnist_float_pixels_outside_0_255_or_scaled_are_refused(tmp_path: Path, scale: float, expected: str) -> None:
    arrays = _small_medmnist()
    arrays["train_images"] = arrays["train_images"].astype(np.float64) * scale
    path = _write(tmp_path / "pneumoniamnist.npz", arrays)
    with pytest.raises(DataError, match=f"^{re.escape(str(path))}: {expected}"):
        MedMNIST(path=path, num_clients=2).setup()
    arrays["train_images"] = (arrays["train_images"] / scale).round()  # whole numbers in 0..255: read as uint8 is
    data = MedMNIST(path=_write(tmp_path / "whole.npz", arrays), num_clients=2, normalize=False)
    x = data.data.transform(data.data.inputs[:1])
    assert torch.allclose(x[0, 0], torch.from_numpy(arrays["train_images"][0] / 255.0).float())
