"""The arguments an object was built with, recorded with no code from its class, and their JSON-friendly form.

As Lightning's ``save_hyperparameters``: a class that calls :func:`capture` from its ``__new__`` (fedlit's
``Strategy`` does) keeps the arguments of its construction: the signature of the most-derived ``__init__``, bound
to the arguments given, the defaults filled in, ``*args`` as a list and ``**kwargs`` expanded into their names
(with the defaults of the keyword arguments of the ``__init__`` they are passed on to, the next one up the
classes, so that ``FedAdagrad(**kwargs)`` records FedOpt's ``eta``, ``tau``...). An ``int`` given for a parameter
annotated ``float`` is recorded as the float it stands for, as the command line parses it. Only the outermost
construction is recorded (the ``super().__init__`` calls it makes are not constructions). Objects of other classes
(a plain Lightning callback) are read as scikit-learn's ``get_params`` does: the attributes named like the
parameters of their ``__init__``.

What is recorded is shown by :func:`jsonable`: numbers, strings, bools, None, lists and dicts of them as they are;
tensors and modules by their type name; anything else by its ``repr`` (a :class:`Shown` string, which a ``repr``
writes without quotes, so ``aggregator=MedianAggregator()`` reads as it did).
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Mapping
from typing import Any

import torch
from typing_extensions import override

#: The instance attribute that holds the recorded arguments.
CAPTURED = "_fedlit_init_args"

_PLAIN = (bool, int, float, str, type(None))


class Shown(str):
    """A value recorded by its ``repr`` text: a string in JSON and in TensorBoard, written unquoted by ``repr``."""

    __slots__ = ()

    @override
    def __repr__(self) -> str:
        return str(self)


def capture(obj: Any, cls: type, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> None:
    """Record on ``obj`` the arguments ``cls(*args, **kwargs)`` binds to ``cls.__init__`` (see the module
    docstring); called from ``cls.__new__``. Arguments that do not bind are not recorded (``__init__`` then raises
    its own error; ``copy`` and ``pickle`` make instances without arguments and restore the recorded ones)."""
    try:
        obj.__dict__[CAPTURED] = bind(cls, args, kwargs)
    except TypeError:
        return


def bind(cls: type, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """The arguments ``cls(*args, **kwargs)`` gives ``cls.__init__``, by name (see the module docstring).

    Raises:
        TypeError: When they do not bind to its signature.
    """
    init = cls.__init__  # type: ignore[misc]
    signature = inspect.signature(init)
    bound = signature.bind(None, *args, **kwargs)
    bound.apply_defaults()
    floats = _float_parameters(init)
    out: dict[str, Any] = {}
    for i, (name, value) in enumerate(bound.arguments.items()):
        kind = signature.parameters[name].kind
        if i == 0:  # self
            continue
        if kind is inspect.Parameter.VAR_POSITIONAL:
            if value:
                out[name] = list(value)
        elif kind is inspect.Parameter.VAR_KEYWORD:
            # in the order of the signature they are passed on to, whatever the order of the call
            passed_on, passed_floats = _passed_on_defaults(cls, init)
            passed_on.update({k: float(v) if k in passed_floats and _is_int(v) else v for k, v in value.items()})
            out.update({k: v for k, v in passed_on.items() if k not in out})
        else:
            out[name] = float(value) if name in floats and _is_int(value) else value
    return out


def init_arguments(obj: Any) -> dict[str, Any]:
    """The arguments ``obj`` was built with: those :func:`capture` recorded, else (a class that does not record
    them) its attributes named like the parameters of its ``__init__``, those it has."""
    captured = getattr(obj, "__dict__", {}).get(CAPTURED)
    if captured is not None:
        return dict(captured)
    try:
        parameters = inspect.signature(type(obj).__init__).parameters
    except (TypeError, ValueError):
        return {}
    out = {}
    for i, (name, parameter) in enumerate(parameters.items()):
        if i == 0 or parameter.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
            continue
        try:
            out[name] = getattr(obj, name)
        except AttributeError:
            continue
    return out


def jsonable(value: Any) -> Any:
    """``value`` in a JSON-friendly form (see the module docstring)."""
    if isinstance(value, Shown) or isinstance(value, _PLAIN):
        return value
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, torch.Tensor | torch.nn.Module | torch.optim.Optimizer):
        return Shown(type(value).__name__)
    return Shown(repr(value))


def hparams_of(obj: Any) -> dict[str, Any]:
    """``obj``'s settings, JSON-friendly: what its ``hparams()`` returns where it has one (a strategy), else
    :func:`init_arguments`."""
    method = getattr(type(obj), "hparams", None)
    values = obj.hparams() if inspect.isfunction(method) else init_arguments(obj)
    return {str(k): jsonable(v) for k, v in dict(values).items()}


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _float_parameters(init: Any) -> set[str]:
    """The parameters of ``init`` annotated ``float`` (or ``float | None``...), not also ``int``."""
    try:
        hints = typing.get_type_hints(init)
    except Exception:  # noqa: BLE001  (an annotation that does not evaluate: read its text)
        hints = {n: p.annotation for n, p in inspect.signature(init).parameters.items()}
    out = set()
    for name, hint in hints.items():
        if isinstance(hint, str):
            members = {part.strip() for part in hint.split("|")}
        else:
            members = {getattr(a, "__name__", str(a)) for a in (typing.get_args(hint) or (hint,))}
        if "float" in members and "int" not in members:
            out.add(name)
    return out


def _passed_on_defaults(cls: type, init: Any) -> tuple[dict[str, Any], set[str]]:
    """The defaults of the keyword arguments of the ``__init__`` methods further up ``cls``'s classes, followed
    while each takes ``**kwargs`` (what a ``**kwargs`` passed on to ``super().__init__`` defaults to), and which of
    them are floats."""
    out: dict[str, Any] = {}
    all_floats: set[str] = set()
    classes = [c for c in cls.__mro__ if "__init__" in vars(c)]
    owner = next((i for i, c in enumerate(classes) if vars(c)["__init__"] is init), None)
    if owner is None:
        return out, all_floats
    for base in classes[owner + 1 :]:
        if base is object:
            break
        try:
            parameters = inspect.signature(vars(base)["__init__"]).parameters
        except (TypeError, ValueError):
            break
        floats = _float_parameters(vars(base)["__init__"])
        all_floats |= floats
        for name, parameter in list(parameters.items())[1:]:
            if (
                parameter.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
                and parameter.default is not inspect.Parameter.empty
            ):
                default = parameter.default
                out.setdefault(name, float(default) if name in floats and _is_int(default) else default)
        if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
            break
    return out, all_floats
