"""The options every segmentation site data set shares (``FedProstateSlices``, ``FedFundus``, ``FedPolyp``,
``FedProstateVolumes``): their checks, the sites found under ``root`` and the handling of unmatched files; and what
every site data set shares: a site's own split generator (:func:`site_rng`) and a declared label map
(:func:`class_index`)."""

from __future__ import annotations

import warnings
import zlib
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import numpy as np

from fedlit.core.errors import ConfigError, DataError
from fedlit.core.names import client_id_problem
from fedlit.data.common.datamodule import is_int

_OPTION = "data.init_args"
#: A class with fewer samples than this in the whole pool gets a warning (:func:`warn_labels`).
RARE_CLASS = 5

# The six Fed-Prostate sites of SAML (Liu, Dou, Heng, MICCAI 2020) under both names in use: the site names
# (BIDMC, BMC, HK, I2CVB, RUNMC, UCL) and the SAML download's folders, which name the two NCI-ISBI 2013 sites by
# the challenge: ISBI = RUNMC (Radboud, 3 T) and ISBI_1.5 = BMC (Boston Medical Center, 1.5 T). In the sites'
# order, each site's other name beside it; the client id is the folder's own name.
PROSTATE_SITES = ("BIDMC", "BMC", "ISBI_1.5", "HK", "I2CVB", "RUNMC", "ISBI", "UCL")
PROSTATE_SAME_SITE = {"ISBI_1.5": "BMC", "ISBI": "RUNMC"}


def check_site_names(sites: object) -> None:
    """Refuse ``data.init_args.sites`` unless it is a list of safe folder names (see :mod:`fedlit.core.names`):
    a site is a folder under ``root`` and becomes a client id, so ``../x`` or ``/etc`` must not be looked at.

    Raises:
        ConfigError: naming each refused site, why, and the fix.
    """
    if not isinstance(sites, list | tuple):
        raise ConfigError(f"{_OPTION}.sites must be a list of site folder names, got {sites!r}")
    problems = [f"{site!r} {why}" for site in sites if (why := client_id_problem(site)) is not None]
    if problems:
        raise ConfigError(
            f"{_OPTION}.sites: {'; '.join(problems)}; name site folders directly under "
            f"{_OPTION}.root (e.g. sites: [BIDMC, UCL])"
        )


def segmentation_option_problems(image_size: object, crop_size: object, unmatched: object) -> list[str]:
    """What is wrong with the options every segmentation site shares, one message per problem."""
    problems = []
    if image_size is not None and (not is_int(image_size) or image_size < 1):
        problems.append(f"{_OPTION}.image_size must be null or an integer >= 1, got {image_size!r}")
    if crop_size is not None and (not is_int(crop_size) or crop_size < 1):
        problems.append(f"{_OPTION}.crop_size must be null (no crop) or an integer >= 1, got {crop_size!r}")
    elif is_int(crop_size) and is_int(image_size) and crop_size > image_size:
        problems.append(
            f"{_OPTION}.crop_size={crop_size} is larger than {_OPTION}.image_size={image_size}; a "
            "train crop must fit in the resized image (e.g. crop_size 320 for image_size 384)"
        )
    if unmatched not in ("error", "skip"):
        problems.append(f"{_OPTION}.unmatched must be 'error' or 'skip', got {unmatched!r}")
    return problems


def report_unmatched(owner: str, lost: list[str], policy: str, partner: str = "a partner of the same name") -> None:
    """Refuse (``policy`` ``error``) or warn about (``skip``) the files in ``lost``, naming every one.

    Raises:
        DataError: when ``policy`` is ``error`` and ``lost`` is not empty.
    """
    if lost and policy == "error":
        raise DataError(
            f"{owner}: {len(lost)} files have no {partner}: {', '.join(lost)}. Fix or remove them, "
            f"or set {_OPTION}.unmatched: skip (--{_OPTION}.unmatched skip) to leave them out"
        )
    if lost:
        warnings.warn(f"{owner}: skipped {len(lost)} files without {partner}: {', '.join(lost)}", stacklevel=3)


def find_sites(
    owner: str,
    root: Path,
    sites: list[str] | None,
    default_sites: tuple[str, ...],
    layout: str,
    source: str,
    present: Callable[[str], bool] | None = None,
    same_site: Mapping[str, str] | None = None,
    warn_others: bool = False,
) -> list[str]:
    """The sites a site-per-folder data set reads: ``sites`` (each must be present under ``root``) or those of
    ``default_sites`` that are.

    ``same_site`` maps a site folder name to the one site it names (``{"ISBI": "RUNMC", "RUNMC": "RUNMC"}``):
    found under two of its names, one site would be two clients holding the same data, which is refused. With
    ``warn_others`` (and ``sites`` not given), the folders under ``root`` that are none of ``default_sites`` are
    named in a warning: a site spelled another way is otherwise dropped without a word.

    Raises:
        DataError: naming ``data.init_args.root`` or ``data.init_args.sites``, the ``layout`` expected and, for a
            missing root or no site, where to get the data (``source``); or naming the folders that hold one site
            under two names.
        ConfigError: naming ``data.init_args.sites`` when a site is not one safe folder name (``../x``), before
            any file is read.
    """
    if sites is not None:  # before any file is looked at: "../x" names a folder outside root
        check_site_names(sites)
    present = present or (lambda site: (root / site).is_dir())
    if not root.is_dir():
        raise DataError(f"{_OPTION}.root: no folder {root}. {owner} expects {layout}. {source}")
    if sites is not None:
        absent = [s for s in sites if not present(s)]
        if absent:
            raise DataError(f"{_OPTION}.sites: {absent} are not found under {root}; expected {layout}")
        return list(sites)
    found = [s for s in default_sites if present(s)]
    if not found:
        raise DataError(
            f"{_OPTION}.root: {root} holds none of the sites {list(default_sites)}; expected {layout}. {source}"
        )
    named: dict[str, list[str]] = {}
    for site in found:
        named.setdefault((same_site or {}).get(site, site), []).append(site)
    twice = [f"{' and '.join(names)} (both {site})" for site, names in named.items() if len(names) > 1]
    if twice:
        raise DataError(
            f"{_OPTION}.root: {root} holds one site under two names: {'; '.join(twice)}; keep one of "
            f"the folders, or pick the sites with {_OPTION}.sites"
        )
    if warn_others:
        others = sorted(
            p.name
            for p in root.iterdir()
            if p.is_dir() and p.name not in default_sites and not p.name.startswith((".", "_"))
        )
        if others:
            warnings.warn(
                f"{owner}: folders under {root} that are not sites, left out: {', '.join(others)} (sites "
                f"are {', '.join(default_sites)}); rename a site folder to one of those, or name the "
                f"folders to read with {_OPTION}.sites",
                stacklevel=3,
            )
    return found


def site_rng(seed: int, site: str) -> np.random.Generator:
    """The generator of one site's random split: seeded by ``seed`` and the site's name alone, so a site is split
    the same whether it is built alone (a Flower node, :meth:`~fedlit.data.FederatedDataModule.only_site`) or
    among the others, in any order."""
    return np.random.default_rng([int(seed), zlib.crc32(str(site).encode("utf-8"))])


def class_names_problem(names: Sequence[str] | None, task: str, option: str = f"{_OPTION}.class_names") -> str | None:
    """What is wrong with a declared label map for ``task`` (a binary task names exactly 2 classes), or None."""
    if names is not None and task == "binary" and len(names) != 2:
        return f"{option}: a binary task has 2 classes (negative, positive), got {list(names)}"
    return None


def class_index(names: Sequence[str] | None, option: str = f"{_OPTION}.class_names") -> dict[str, int] | None:
    """Class name -> number of a declared label map (``class_names``), or None when none is declared.

    Raises:
        ConfigError: naming ``option`` when a name is empty or given twice.
    """
    if names is None:
        return None
    listed = [str(n).strip() for n in names]
    twice = sorted({n for n in listed if listed.count(n) > 1})
    if not listed or "" in listed or twice:
        raise ConfigError(
            f"{option} must list distinct, non-empty class names, got {list(names)!r}"
            + (f" ({twice} given twice)" if twice else "")
        )
    return {name: i for i, name in enumerate(listed)}


def warn_labels(owner: str, counts: Mapping[str, int], where: Mapping[str, str], declared: bool) -> None:
    """Warn about labels that look like mistakes: a class with fewer than ``RARE_CLASS`` samples in the whole pool
    (none is no mistake: a declared class a site lacks), and, unless the classes were ``declared``, class names
    that read as numbers but not as integers (``0.5`` beside ``0`` and ``1``: a typo, or a regression target).

    Args:
        owner: the data set and its file or folder, as messages start.
        counts: class name -> samples in the pool.
        where: class name -> where it first appears (a row, a folder).
        declared: whether the names come from ``class_names`` (then only rare classes are named).
    """
    rare = [f"{c!r}: {n} (first at {where.get(c, '?')})" for c, n in counts.items() if 0 < n < RARE_CLASS]
    if rare:
        warnings.warn(
            f"{owner}: {'a class has' if len(rare) == 1 else f'{len(rare)} classes have'} fewer than {RARE_CLASS} "
            f"samples in the whole pool: {'; '.join(rare)}. "
            "Such a class can hardly be learned or tested (a split gets one or none of it): check its labels, "
            "merge it into another class, or drop its samples",
            stacklevel=3,
        )
    if declared:
        return
    fractional = [c for c in counts if _fraction(c)]
    if fractional:
        warnings.warn(
            f"{owner}: labels {fractional[:10]} read as numbers but not as integers, yet each is a class of its own "
            f"(first at {where.get(fractional[0], '?')}); a typo, or a regression target (declare task: regression)?",
            stacklevel=3,
        )


def _fraction(name: str) -> bool:
    """Whether ``name`` reads as a finite number that is not an integer (``0.5``; not ``1``, ``1.0`` or ``a``)."""
    try:
        value = float(name)
    except ValueError:
        return False
    return bool(np.isfinite(value)) and value != round(value)
