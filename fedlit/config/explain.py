"""Explaining configuration errors: a recipe's mistakes as one line that names the key as spelled in the YAML,
the value, and the fix.

Only fedlit's own :class:`~fedlit.core.errors.FedlitError` and the parser's errors (jsonargparse's
``ArgumentError``) are configuration errors (:data:`CONFIG_ERRORS`): an exception raised inside user code (a custom
module, data module, strategy or callback, even while it is built) keeps its traceback.
"""

from __future__ import annotations

import argparse
import collections.abc
import contextlib
import difflib
import importlib
import re
import sys

from fedlit.core.errors import FedlitError

#: Errors of the recipe, the command line, the input files or the run folder: printed as one line (exit code 2).
CONFIG_ERRORS = (argparse.ArgumentError, FedlitError)
#: Option names read as learning rates in messages.
LR_KEYS = ("lr", "server_lr", "eta", "eta_l", "learning_rate")


def explain(err: BaseException) -> str:
    """One clear message for a configuration error: the key as spelled in the YAML, the value, the fix.

    jsonargparse wraps the real problem in several layers (union types, nested subclasses); this reads the nesting
    of ``Parser key`` and ``class_path`` out of the outermost message, rebuilds the full dotted key
    (``model.init_args.backbone.init_args.num_features``) and, for an unknown key, lists the valid keys of that
    class or section with the closest match. fedlit's own errors are already written that way.
    """
    if isinstance(err, FedlitError):
        return str(err)
    chain = _chain(err)
    outer, text = str(chain[0]), "\n".join(str(e) for e in chain)
    keys = list(dict.fromkeys(re.findall(r'Parser key "([\w.]+)"', outer)))
    class_paths = re.findall(r"Problem with given class_path '([\w.]+)'", outer)
    unknown = (
        re.search(r"does not accept option '([\w.]+)'", text)
        or re.search(r"Option '([\w.]+)' is not accepted", text)
        or re.search(r"unrecognized arguments: --([\w.]+)", text)
    )
    if found := re.search(
        r"callable class: Option '(\w+)' is not accepted\. Got value: .*?class_path='([\w.]+)'", text
    ):
        option, owner = found.groups()  # a misspelled init_args key of an optimizer or scheduler
        valid = [p for p in _init_args(owner) if p not in ("params", "optimizer")]
        return _unknown_key(f"{_nested_key(keys)}.init_args.{option}", option, valid, f" of {owner}")
    if unknown:
        name = unknown.group(1)
        if class_paths:
            option = name.split(".")[0]
            key = _nested_key(keys) + f".init_args.{option}"
            return _unknown_key(key, option, _init_args(class_paths[-1]), f" of {class_paths[-1]}")
        section, _, option = name.rpartition(".")
        return _unknown_key(name, option, _section_keys(section))
    if found := re.search(r"Unable to load config [\"'](.*?)[\"']\n", text + "\n"):
        return _not_a_mapping(_nested_key(keys), found.group(1), _section_keys(_nested_key(keys)), "")
    if class_paths and re.search(r"'(str|int|float|bool|list)' object has no attribute 'keys'", text):
        given = re.search(r"'init_args': ('[^']*'|\S+?)[,}]", text)
        return _not_a_mapping(
            _nested_key(keys) + ".init_args",
            given.group(1).strip("'") if given else "?",
            _init_args(class_paths[-1]),
            f" of {class_paths[-1]}",
        )
    if found := re.match(r"Unexpected config: (.*)", outer, re.DOTALL):
        content = found.group(1).strip()
        shown = repr(content if len(content) <= 60 else content[:60] + "...")
        what = "empty" if not content else f"not a mapping of sections: it reads as {shown}"
        return (
            f"--config: the recipe is {what}. A recipe is YAML whose top-level keys are sections "
            f"({', '.join(_section_keys(''))}), each followed by ':'. See fedlit fit --print_config for a "
            "complete one, or fedlit fit --help."
        )
    if (required := missing_required(err)) is not None:
        key, owner, options = required
        flags = " or ".join(f"--{key}.init_args.{o} VALUE" for o in options)
        return (
            f"{', '.join(f'{key}.init_args.{o}' for o in options)} {'is' if len(options) == 1 else 'are'} required by "
            f"{owner} and not given: set it in the recipe or on the command line ({flags})."
        )
    if (typo := _class_path_typo(chain[-1], keys, class_paths, text)) is not None:
        return typo
    if found := re.search(r"expects a function or a callable class: (.+?)\. Got value: .*?class_path='([\w.]+)'", text):
        return _callable_class_path(_nested_key(keys), found.group(2), found.group(1))
    if found := re.search(r"Expected a dot import path string: (\S+)", text):
        return _callable_class_path(_nested_key(keys), found.group(1), "not a known class")
    if found := re.search(r"Expected a (.+?)\. Got value: (.*)", text):
        expected = re.sub(r"<class '([\w.]+)'>", r"\1", found.group(1))
        return _wrong_type(_nested_key(keys) or "?", expected, found.group(2))
    innermost = str(chain[-1]).strip()
    return innermost.splitlines()[0] if len(innermost.splitlines()) > 6 else innermost


def _chain(err: BaseException) -> list[BaseException]:
    """``err`` and the exceptions behind it, as Python prints a chain: the cause, else the context unless it was
    suppressed."""
    chain: list[BaseException] = []
    node: BaseException | None = err
    while node is not None and node not in chain:
        chain.append(node)
        node = (
            node.__cause__ if node.__cause__ is not None else (None if node.__suppress_context__ else node.__context__)
        )
    return chain


def missing_required(err: BaseException) -> tuple[str, str, list[str]] | None:
    """For a parser error that says a class was given without some of its required arguments: the option as in the
    YAML (``data``, ``model.init_args.backbone``), the class, and those arguments; else None."""
    chain = _chain(err)
    outer, text = str(chain[0]), "\n".join(str(e) for e in chain)
    found = re.search(
        r"Problem with given class_path '([\w.]+)':\s*\n\s*the following arguments are required: ([\w., ]+)", text
    )
    keys = list(dict.fromkeys(re.findall(r'Parser key "([\w.]+)"', outer)))
    if found is None or not keys:
        return None
    return _nested_key(keys), found.group(1), [o.strip() for o in found.group(2).split(",") if o.strip()]


def _wrong_type(key: str, expected: str, value: str) -> str:
    """A value of the wrong type: a float that is not finite, a YAML 1.1 boolean where a name was meant."""
    if expected == "float" and value.strip().lstrip("+-").lower() in ("inf", "infinity", "nan"):
        what = "a learning rate must be a finite number > 0" if key.rsplit(".", 1)[-1] in LR_KEYS else "give a number"
        return f"{key}={value}: not a finite number: {what} (e.g. {key}=0.01)."
    if expected == "str" and value in ("True", "False"):
        return (
            f"{key}: expected a string, got the boolean {value}: YAML reads an unquoted yes, no, on, off, true or "
            'false as a boolean. Quote it: ["no", "yes"], not [no, yes].'
        )
    return f"{key}: expected {expected}, got {value!r}."


def _class_path_typo(inner: BaseException, keys: list[str], class_paths: list[str], text: str) -> str | None:
    """A nested ``class_path`` (``model.init_args.backbone``) naming no class: the option, the closest known
    subclass of the class the option takes, and the valid names; None when the option takes a callable (an
    optimizer: :func:`_callable_class_path`) or its class is not known."""
    short = re.search(r"Expected a dot import path string: (\S+)", text)
    missing = isinstance(inner, (AttributeError, ModuleNotFoundError)) and class_paths and str(inner) in text
    if not keys or not (short or missing):
        return None
    name = short.group(1) if short else class_paths[-1]
    owners = [c for c in class_paths if c != name]
    base = _expected_class(keys, owners[-1] if owners else None)
    if base is None:
        return None
    from fedlit.config.parser import subclasses

    known = {c.__name__: f"{c.__module__}.{c.__name__}" for c in subclasses(base)}
    module_name, _, attr = name.rpartition(".")
    close = difflib.get_close_matches(attr, sorted(known), n=1)
    module = sys.modules.get(module_name)
    suggestion = (f"{module_name}.{close[0]}" if hasattr(module, close[0]) else known[close[0]]) if close else ""
    hint = f" Did you mean {suggestion if module_name else close[0]!r}?" if close else ""
    why = f" ({inner})" if missing else ""
    return (
        f"{_nested_key(keys)}.class_path={name!r} is not a known {base.__name__}{why}.{hint} Valid names: "
        f"{', '.join(sorted(known))} (or the import path of your own subclass of {base.__module__}.{base.__name__})."
    )


def _expected_class(keys: list[str], owner: str | None) -> type | None:
    """The class that the option ``keys[-1]`` of the class ``owner`` (a section without one) takes, or None when it
    takes a callable or no one class."""
    import typing

    if owner is None:
        from fedlit.config.parser import SECTIONS, bases

        return bases()[keys[0]] if len(keys) == 1 and keys[0] in SECTIONS else None
    module_name, _, name = owner.rpartition(".")
    try:
        hint = typing.get_type_hints(getattr(importlib.import_module(module_name), name).__init__)[keys[-1]]
    except Exception:  # noqa: BLE001  (an unresolvable annotation: no suggestion, the generic message stays)
        return None
    found: list[type] = []
    stack = [hint]
    while stack:
        tp = stack.pop()
        if typing.get_origin(tp) is collections.abc.Callable:
            return None
        if isinstance(tp, type) and tp is not type(None):
            found.append(tp)
        stack.extend(a for a in typing.get_args(tp) if not isinstance(a, list))
    return found[0] if len(found) == 1 else None


def _callable_class_path(key: str, name: str, problem: str) -> str:
    """A ``class_path`` of an optimizer or scheduler (a callable-typed option) that jsonargparse refused."""
    module_name, _, attr = name.rpartition(".")
    home = "torch.optim.lr_scheduler" if key.endswith("lr_scheduler") else "torch.optim"
    hint, shorthands = "", ["sgd", "adam", "adamw"] if not module_name and home == "torch.optim" else []
    if "has no attribute" in problem or not module_name:
        with contextlib.suppress(ImportError):
            module = module_name or home
            classes = [n for n, v in vars(importlib.import_module(module)).items() if isinstance(v, type)]
            close = difflib.get_close_matches(attr, classes + shorthands, n=1)
            hint = (
                ""
                if not close
                else (
                    f" Did you mean {close[0]!r}?" if close[0] in shorthands else f" Did you mean {module}.{close[0]}?"
                )
            )
    if shorthands:  # `optimizer: sgdd` reads as a misspelled shorthand too
        return (
            f"{key}={name!r} is not one of the shorthands ['sgd', 'adam', 'adamw'] nor a known class.{hint} "
            "Give a shorthand, or a class of torch.optim as class_path (its name or full import path)."
        )
    return (
        f"{key}.class_path={name!r}: {problem.rstrip('.')}.{hint} Give a class of {home} (its name, or a "
        "full import path), or the import path of your own."
    )


def _nested_key(keys: list[str]) -> str:
    """``["model", "backbone"]`` -> ``model.init_args.backbone`` (jsonargparse's nesting as YAML keys)."""
    return ".init_args.".join(keys)


def _unknown_key(key: str, name: str, valid: list[str], owner: str = "") -> str:
    close = difflib.get_close_matches(name, valid, n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    return f"{key} is not an option{owner}.{hint} Valid options: {', '.join(valid)}."


def _not_a_mapping(key: str, value: str, valid: list[str], owner: str = "") -> str:
    """A section or ``init_args`` given a plain value (``roundz 3``: a key whose ``:`` is missing)."""
    first = re.split(r"[\s:=]", value.strip(), maxsplit=1)[0]
    close = difflib.get_close_matches(first, valid, n=1) if first not in valid else [first]
    hint = f" Did you mean '{close[0]}: <value>'?" if close else ""
    listed = f" Valid options{owner}: {', '.join(valid)}." if valid else ""
    return (
        f"{key or 'the recipe'}: expected a mapping of options (`key: value` lines), got {value!r}: a key "
        f"without ':', or a misspelled one.{hint}{listed} fedlit fit --print_config shows a complete recipe."
    )


def _section_keys(section: str) -> list[str]:

    if section == "federation":
        from dataclasses import fields

        from fedlit.engine.loop.settings import Settings

        return [f.name for f in fields(Settings)]
    return [
        "config",
        "model",
        "data",
        "strategy",
        "federation",
        "callbacks",
        "out_dir",
        "ckpt_path",
        "name",
        "version",
        "run",
        "imports",
    ]


def _init_args(class_path: str) -> list[str]:
    import inspect

    module_name, _, name = class_path.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError):
        return []
    return [p for p in inspect.signature(cls.__init__).parameters if p not in ("self", "args", "kwargs")]
