"""A command's options: one pydantic dataclass, one flag per field, and `--config FILE`.

`coop train` and `coop simulate` describe their options as a pydantic dataclass (TrainConfig,
SimulateConfig): the fields' constraints are the checks, as the run config's sections are
(coop.runconfig). `--config FILE` is a TOML file of the same options, keyed by their long names
(`max_steps = 100` or `max-steps = 100`); a flag on the command line wins over the file; an unknown
key is refused with its name. Every bad value, from a flag or from the file, ends the command with
one line on stderr and exit status 2, before any work: `CommandParser` does it for what argparse
refuses (a bad choice, a non-number), `build_options` for what the dataclass refuses.
"""
from __future__ import annotations

import argparse
import difflib
import sys
import typing
from dataclasses import fields
from pathlib import Path
from typing import Any

from pydantic import ValidationError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib


class CommandParser(argparse.ArgumentParser):
    """argparse, but a refused command line is one line (no usage block), exit status 2."""

    def error(self, message: str) -> typing.NoReturn:
        self.exit(2, f"{self.prog}: {message} (`{self.prog} -h` lists the options)\n")


def existing_files(names: list[str] | None) -> list[str] | None:
    """A `data` field's check: every name is a file here (None: the embedded default corpus)."""
    missing = [name for name in names or [] if not Path(name).is_file()]
    if missing:
        raise ValueError(f"no such file: {missing[0]} (give UTF-8 text files, or leave --data out for the "
                         "embedded corpus)")
    return names


class OptionsError(ValueError):
    """Options that cannot be used; the message is the one line to print."""


def choices_of(annotation: Any) -> tuple | None:
    """The values of a Literal[...] field (for argparse's `choices` and `--help`), else None."""
    if typing.get_origin(annotation) is typing.Literal:
        return typing.get_args(annotation)
    return None


def read_options_file(path: str | Path, config_cls: type) -> dict[str, Any]:
    """The options in a flat TOML file, keyed by field name; unknown keys and tables refused."""
    path = Path(path)
    if not path.is_file():
        raise OptionsError(f"--config {path}: no such file")
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as error:
        raise OptionsError(f"--config {path} is not valid TOML: {error}") from None
    known = typing.get_type_hints(config_cls)  # name -> type, Annotated[...] stripped
    values = {}
    for key, value in raw.items():
        name = key.replace("-", "_")
        if isinstance(value, dict):
            raise OptionsError(f"--config {path}: [{key}] is a table, but this file is flat (key = value, the "
                               "command's long options); a run config ([model], [inner], ...) is for "
                               "coop-coordinator serve and coop swarm start")
        if name not in known:
            close = difflib.get_close_matches(name, known, n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            raise OptionsError(f"--config {path}: unknown key {key!r}{hint}; the keys are this command's long "
                               "options, e.g. max_steps = 100")
        if isinstance(value, str) and _takes_a_list(known[name]):
            value = [value]  # data = "input.txt" for data = ["input.txt"]
        values[name] = value
    return values


def _takes_a_list(annotation: Any) -> bool:
    """Whether a field's type is list[...] or list[...] | None."""
    return typing.get_origin(annotation) is list or any(typing.get_origin(p) is list for p in typing.get_args(annotation))


def given_options(args: argparse.Namespace, config_cls: type) -> dict[str, Any]:
    """The options given on the command line: the parser has default SUPPRESS, so a flag that was
    not given is absent from `args` (and the file's value, or the field's default, stands)."""
    return {f.name: getattr(args, f.name) for f in fields(config_cls) if hasattr(args, f.name)}


def build_options(config_cls: type, given: dict[str, Any], config_file: str | None = None):
    """config_cls(**file values, overridden by the flags given); OptionsError on any bad value,
    naming where it came from: `--max-steps 0: ...` or `--config run.toml: max_steps = 0: ...`."""
    from_file = read_options_file(config_file, config_cls) if config_file else {}
    values = {**from_file, **given}
    try:
        return config_cls(**values)
    except ValidationError as error:
        raise OptionsError("; ".join(_describe(e, given, from_file, config_file) for e in error.errors())) from None


def _describe(error: dict, given: dict, from_file: dict, config_file: str | None) -> str:
    message = error["msg"].removeprefix("Value error, ")
    if message.startswith("Input should"):
        message = "i" + message[1:]  # "--max-steps 0: input should be greater than or equal to 1"
    if not error["loc"]:  # a check across fields (__post_init__): its message names them
        return message
    name = str(error["loc"][0])
    if name in given:
        value = given[name]
        shown = " ".join(map(str, value)) if isinstance(value, list) else value
        return f"--{name.replace('_', '-')} {shown}: {message}"
    if name in from_file:
        return f"--config {config_file}: {name} = {from_file[name]!r}: {message}"
    return f"{name}: {message}"
