"""Generated (synthetic) mammograms that join one client's training split only: the generative augmentation of a
site, never in its validation or test split.

A site's folder holds ``normal/`` and/or ``cancer/`` sub-folders of images (PNG, JPEG, TIFF... or DICOM), at any
depth; nothing else. Their identities are ``synthetic_<client>/<class>/<file>``, listed in the manifest's train
split of that client and counted in its ``details.synthetic``.
"""

from __future__ import annotations

from pathlib import Path

from fedlit.core.errors import ConfigError, DataError, InputFileError
from fedlit.data.common.samples import is_image
from fedlit.data.mammography.records import CLASS_NAMES, Mammogram

_OPTION = "data.init_args.synthetic"


def synthetic_key(client: str) -> str:
    """The identity prefix of ``client``'s generated images."""
    return f"synthetic_{client}"


def synthetic_records(folders: dict[str, str], clients: list[str]) -> tuple[dict[str, str], list[Mammogram]]:
    """The roots (key -> folder) and the generated images of every client of ``folders`` built here.

    Args:
        folders: client id -> its folder of generated images.
        clients: the clients built (a client of ``folders`` that is not built is skipped if it is a known client
            of another node; see :class:`~fedlit.data.mammography.sites.Mammograms`).

    Raises:
        InputFileError: naming the client's folder when it does not exist.
        DataError: naming the folder when it holds a sub-folder that is no class, or no image at all.
    """
    roots, records = {}, []
    for client in clients:
        if client not in folders:
            continue
        folder = Path(folders[client]).expanduser()
        if not folder.is_dir():
            raise InputFileError(
                f"{_OPTION}.{client}: no folder {folder}; it should hold the client's generated images in "
                f"{'/ and '.join(CLASS_NAMES)}/ sub-folders"
            )
        others = sorted(p.name for p in folder.iterdir() if p.is_dir() and p.name not in CLASS_NAMES)
        files = [p for p in folder.iterdir() if p.is_file() and not p.name.startswith(".")]
        if others or files:
            raise DataError(
                f"{folder} ({_OPTION}.{client}): {', '.join(others + [p.name for p in files][:5])} is not a class "
                f"folder; generated images go in {folder}/{CLASS_NAMES[0]}/ and {folder}/{CLASS_NAMES[1]}/"
            )
        key = synthetic_key(client)
        roots[key] = str(folder)
        found = [
            Mammogram(f"{key}/{path.relative_to(folder).as_posix()}", label, "", client)
            for label, name in enumerate(CLASS_NAMES)
            if (folder / name).is_dir()
            for path in sorted((folder / name).rglob("*"))
            if path.is_file() and (is_image(path) or path.suffix.lower() == ".dcm")
        ]
        if not found:
            raise DataError(
                f"{folder} ({_OPTION}.{client}) holds no image; put the generated images in "
                f"{folder}/{CLASS_NAMES[0]}/ and {folder}/{CLASS_NAMES[1]}/"
            )
        records += found
    return roots, records


def check_synthetic_clients(folders: dict[str, str], clients: list[str]) -> None:
    """Refuse a synthetic folder given for a client the data has not.

    Raises:
        ConfigError: naming the unknown clients and the valid ones.
    """
    unknown = sorted(set(folders) - set(clients))
    if unknown:
        raise ConfigError(f"{_OPTION}: {unknown} are not clients of this data; its clients are {clients}")
