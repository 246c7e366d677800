"""Explaining configuration errors: a recipe's mistakes as one line that names the key as spelled in the YAML,
the value, and the fix.

Only fedlit's own :class:`~fedlit.core.errors.FedlitError` and the parser's errors (jsonargparse's
``ArgumentError``) are configuration errors (:data:`CONFIG_ERRORS`): an exception raised inside user code (a custom
module, data module, strategy or callback, even while it is built) keeps its traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import importlib
import re

from fedlit.core.errors import FedlitError

#: Errors of the recipe, the command line, the input files or the run folder: printed as one line (exit code 2).
CONFIG_ERRORS = (argparse.ArgumentError, FedlitError)


def explain(err: BaseException) -> str:
    """One clear message for a configuration error: the key as spelled in the YAML, the value, the fix.

    jsonargparse wraps the real problem in several layers (union types, nested subclasses); this reads the nesting
    of ``Parser key`` and ``class_path`` out of the outermost message, rebuilds the full dotted key
    (``model.init_args.backbone.init_args.num_features``) and, for an unknown key, lists the valid keys of that
    class or section with the closest match. fedlit's own errors are already written that way.
    """
    if isinstance(err, FedlitError):
        return str(err)
    chain: list[BaseException] = []
    node: BaseException | None = err
    while node is not None and node not in chain:
        chain.append(node)  # as Python prints a chain: the cause, else the context unless it was suppressed
        node = (
            node.__cause__ if node.__cause__ is not None else (None if node.__suppress_context__ else node.__context__)
        )
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
    if found := re.search(r"expects a function or a callable class: (.+?)\. Got value: .*?class_path='([\w.]+)'", text):
        return _callable_class_path(_nested_key(keys), found.group(2), found.group(1))
    if found := re.search(r"Expected a dot import path string: (\S+)", text):
        return _callable_class_path(_nested_key(keys), found.group(1), "not a known class")
    if found := re.search(r"Expected a (.+?)\. Got value: (.*)", text):
        return f"{_nested_key(keys) or '?'}: expected {found.group(1)}, got {found.group(2)!r}."
    innermost = str(chain[-1]).strip()
    return innermost.splitlines()[0] if len(innermost.splitlines()) > 6 else innermost


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
