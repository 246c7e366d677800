"""Reading one mammogram: a DICOM file (pydicom) turned into a float (C, H, W) image in [0, 1].

Mammograms need more than the pixel array: the stored values go through the modality LUT (``RescaleSlope`` and
``RescaleIntercept``), then the VOI LUT the file names (a ``VOILUTSequence``, else ``WindowCenter`` /
``WindowWidth`` with ``VOILUTFunction`` LINEAR, LINEAR_EXACT or SIGMOID; the first window when several are
given), which is how the device meant the image to be viewed; then each image is scaled by its own minimum and
maximum to [0, 1], and a ``MONOCHROME1`` image (white is 0) is inverted so that dense tissue is bright in every
source. Compressed pixel data (the RSNA screening DICOMs are JPEG 2000) needs pydicom's decoder plugins; a file
that cannot be decoded is refused naming it and the plugins to install.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedlit.core.errors import ConfigError, DataError

#: The extra that installs pydicom.
INSTALL = "pip install 'fedlit[imaging]' (or pip install pydicom)"
#: What to install for compressed DICOMs (JPEG 2000, JPEG-LS, JPEG lossless).
DECODERS = "pip install pylibjpeg pylibjpeg-openjpeg pylibjpeg-libjpeg"


def pydicom_module() -> Any:
    """pydicom, imported on first use.

    Raises:
        ConfigError: naming the extra to install when pydicom is missing.
    """
    try:
        import pydicom
    except ImportError:
        raise ConfigError(
            f"the mammography loaders read DICOM files with pydicom, which is not installed: {INSTALL}"
        ) from None
    return pydicom


def read_header(path: Path) -> Any:
    """The DICOM data set of ``path`` without its pixel data (for tags such as ``ImageLaterality``).

    Raises:
        DataError: naming the file when it is missing or is not a DICOM file.
    """
    pydicom = pydicom_module()
    try:
        return pydicom.dcmread(path, stop_before_pixels=True)
    except FileNotFoundError:
        raise DataError(f"{path}: DICOM file not found") from None
    except (OSError, ValueError, pydicom.errors.InvalidDicomError) as err:
        raise DataError(f"{path}: cannot be read as a DICOM file ({type(err).__name__}: {err})") from None


def dicom_pixels(path: Path, window: bool = True) -> np.ndarray:
    """The (H, W) float64 image of a DICOM file in [0, 1]: modality LUT, VOI LUT (``window``), min-max scaling,
    ``MONOCHROME1`` inverted (see the module docstring).

    Raises:
        DataError: naming the file when it is missing, not DICOM, has no pixel data, cannot be decoded (naming the
            decoder plugins) or is not one grey frame.
    """
    pydicom = pydicom_module()
    try:
        dataset = pydicom.dcmread(path)
    except FileNotFoundError:
        raise DataError(f"{path}: DICOM file not found (it was listed when the data set was built)") from None
    except (OSError, ValueError, pydicom.errors.InvalidDicomError) as err:
        raise DataError(f"{path}: cannot be read as a DICOM file ({type(err).__name__}: {err})") from None
    if "PixelData" not in dataset:
        raise DataError(f"{path}: a DICOM file without pixel data (no image); remove it from the data set")
    try:
        pixels = dataset.pixel_array
    except Exception as err:  # pydicom raises RuntimeError, NotImplementedError or ValueError by handler
        syntax = getattr(getattr(dataset, "file_meta", None), "TransferSyntaxUID", "unknown")
        raise DataError(
            f"{path}: its pixel data cannot be decoded (transfer syntax {syntax}; {type(err).__name__}: {err}); "
            f"compressed DICOMs need pydicom's decoders: {DECODERS}"
        ) from None
    photometric = str(getattr(dataset, "PhotometricInterpretation", "MONOCHROME2")).upper()
    if pixels.ndim != 2 or photometric not in ("MONOCHROME1", "MONOCHROME2"):
        raise DataError(
            f"{path}: not one grey image (shape {list(pixels.shape)}, PhotometricInterpretation {photometric}); "
            "a mammogram is one MONOCHROME1 or MONOCHROME2 frame: remove the file from the data set"
        )
    values = _modality_lut(pixels, dataset)
    if window:
        values = _voi_lut(values, dataset)
    values = np.asarray(values, dtype=np.float64)
    low, high = float(values.min()), float(values.max())
    scaled = (values - low) / (high - low) if high > low else np.zeros_like(values)
    return 1.0 - scaled if photometric == "MONOCHROME1" else scaled


def _lut_functions() -> Any:
    """pydicom's module of ``apply_modality_lut`` and ``apply_voi_lut``: ``pydicom.pixels`` (3.x), else 2.x's."""
    try:
        from pydicom import pixels
    except ImportError:  # pydicom 2.x
        from pydicom.pixel_data_handlers import util

        return util
    return pixels


def _modality_lut(pixels: np.ndarray, dataset: Any) -> np.ndarray:
    return _lut_functions().apply_modality_lut(pixels, dataset)


def _voi_lut(values: np.ndarray, dataset: Any) -> np.ndarray:
    """The VOI LUT of the file (its sequence, else its first window); values unchanged when it names none."""
    if "VOILUTSequence" not in dataset and "WindowCenter" not in dataset:
        return values
    return _lut_functions().apply_voi_lut(values, dataset, index=0, prefer_lut=True)


@dataclass(frozen=True)
class MammogramFile:
    """Reads an identity ``<key>/<path>`` as a float32 (``channels``, ``image_size``, ``image_size``) image in
    [0, 1]: ``path`` relative to ``roots[key]``; a ``.dcm`` file (or a file without extension, as some archives
    store DICOMs) through :func:`dicom_pixels`, any other image through PIL (a generated image of a synthetic
    folder). Picklable: it runs in the DataLoader workers.

    Attributes:
        roots: key -> folder (a source's root, or a synthetic folder).
        channels: 1 (grey) or 3 (the grey image repeated, for ImageNet backbones).
        image_size: side of the square the image is resized to (bilinear, antialiased); None keeps its size.
        window: apply the file's VOI LUT / window (False: the modality values, min-max scaled).
    """

    roots: dict[str, str]
    channels: int = 3
    image_size: int | None = 256
    window: bool = True

    def path(self, identity: str) -> Path:
        """The file of ``identity``.

        Raises:
            DataError: when its key is none of :attr:`roots` (a manifest of another build).
        """
        key, _, rel = identity.partition("/")
        if key not in self.roots:
            raise DataError(f"sample {identity!r}: its source {key!r} is none of {sorted(self.roots)}")
        return Path(self.roots[key]) / rel

    def __call__(self, identity: str) -> torch.Tensor:
        from torchvision.transforms.v2 import functional as TF

        from fedlit.data.common.samples import ImageFile, is_image

        path = self.path(identity)
        if is_image(path):
            return ImageFile(root=str(path.parent), channels=self.channels, image_size=self.image_size)(path.name)
        image = torch.from_numpy(dicom_pixels(path, self.window).astype(np.float32))[None]
        if self.image_size is not None and tuple(image.shape[-2:]) != (self.image_size, self.image_size):
            image = TF.resize(image, [self.image_size, self.image_size], antialias=True)
        return image.expand(self.channels, -1, -1).contiguous()
