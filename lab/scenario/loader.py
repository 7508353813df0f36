"""Reading a scenario file: a bounded YAML loader that records the line of every field, and the
translation of the model's validation errors into one `ScenarioError` naming file, line and field.

The loader is bounded, so a hostile file fails fast: at most 1 MiB, at most MAX_DEPTH levels of
nesting, and no YAML anchors or aliases at all (a "billion laughs" file is refused at its first
anchor, before anything is expanded).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from lab.core.errors import ScenarioError
from lab.scenario.errors import display_path, one_line, scenario_error, sentence, show_value
from lab.scenario.model import (
    FIELD_HELP,
    BareNumber,
    InvalidValue,
    Scenario,
    allowed_keys,
    unknown_key,
)

MAX_FILE_BYTES = 1 << 20
MAX_DEPTH = 20

# --------------------------------------------------------------------------- YAML reading
# Why PyYAML's composer and not ruamel.yaml: both keep every node's position, and this loader
# only walks PyYAML's node tree (its marks give the line of each field path). What is ours is
# the policy, which neither library has: refusing anchors and aliases at the first one (before
# anything expands), a depth limit, unknown tags refused, and versions written as bare numbers
# kept as text so `2.10` can be refused instead of read as 2.1. ruamel.yaml would add a
# dependency and a round-trip model the lab never writes back.

FieldPath = tuple[str | int, ...]
_STR_TAGS = frozenset(
    f"tag:yaml.org,2002:{name}" for name in ("str", "timestamp", "merge", "value")
)
_NUMERIC_TAGS = frozenset(f"tag:yaml.org,2002:{name}" for name in ("bool", "int", "float"))
_NULL_TAG = "tag:yaml.org,2002:null"
_MAP_TAG = "tag:yaml.org,2002:map"
_SEQ_TAG = "tag:yaml.org,2002:seq"
# Scalars directly under these are kept as written (`N: 010` stays "010", not the YAML 1.1 octal 8).
_RAW_TEXT_PARENTS: frozenset[FieldPath] = frozenset({("env",), ("vars",), ("args",)})


class _Refused(Exception):
    """A YAML construct the loader refuses (alias, anchor, deep nesting), with its position."""

    def __init__(self, message: str, mark: Any, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.line = mark.line + 1 if mark is not None else None
        self.hint = hint


class _Loader(yaml.SafeLoader):
    """SafeLoader that refuses anchors/aliases and nesting deeper than MAX_DEPTH while composing."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None):
            raise _Refused(
                "YAML anchors and aliases (&name, *name, <<: *name) are not allowed in scenario files",
                event.start_mark,
                hint="Write the value out in full; this keeps a small file from expanding into a huge one.",
            )
        if self._depth >= MAX_DEPTH:
            raise _Refused(
                f"the YAML is nested more than {MAX_DEPTH} levels deep",
                event.start_mark,
                hint="Scenario files only need a few levels; flatten the structure.",
            )
        self._depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


class _Builder:
    """Turns a composed node tree into plain data, recording the line of every field path."""

    def __init__(self, loader: _Loader, file: str) -> None:
        self.loader = loader
        self.file = file
        self.lines: dict[FieldPath, int] = {}

    def build(self, node: yaml.Node, path: FieldPath = ()) -> Any:
        self.lines.setdefault(path, node.start_mark.line + 1)
        if isinstance(node, yaml.MappingNode):
            return self._mapping(node, path)
        if isinstance(node, yaml.SequenceNode):
            return self._sequence(node, path)
        return self._scalar(node, path)

    def _fail(self, message: str, node: yaml.Node, path: FieldPath, hint: str | None = None) -> ScenarioError:
        line = node.start_mark.line + 1
        return scenario_error(message, file=self.file, line=line, field=_format_path(path) or None, hint=hint)

    def _check_tag(self, node: yaml.Node, expected: str, path: FieldPath) -> None:
        if node.tag != expected:
            raise self._fail(f"unsupported YAML tag {_tag(node.tag)}", node, path, hint="Remove the tag.")

    def _mapping(self, node: yaml.MappingNode, path: FieldPath) -> dict[str, Any]:
        self._check_tag(node, _MAP_TAG, path)
        result: dict[str, Any] = {}
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode):
                raise self._fail("keys must be plain names, not lists or mappings", key_node, path)
            key = key_node.value
            child = (*path, key)
            if key in result:
                first = self.lines[child]
                raise self._fail(
                    f"duplicate key {key!r} (first given at line {first}); YAML would silently keep only "
                    "the last one",
                    key_node,
                    child,
                    hint="Remove or rename one of them.",
                )
            self.lines[child] = key_node.start_mark.line + 1
            result[key] = self.build(value_node, child)
        return result

    def _sequence(self, node: yaml.SequenceNode, path: FieldPath) -> list[Any]:
        self._check_tag(node, _SEQ_TAG, path)
        items = []
        for index, item in enumerate(node.value):
            self.lines[(*path, index)] = item.start_mark.line + 1
            items.append(self.build(item, (*path, index)))
        return items

    def _scalar(self, node: yaml.ScalarNode, path: FieldPath) -> Any:
        tag = node.tag
        if tag in _STR_TAGS:
            return node.value
        if tag == _NULL_TAG:
            return None
        if tag not in _NUMERIC_TAGS:
            raise self._fail(f"unsupported YAML tag {_tag(tag)}", node, path, hint="Remove the tag.")
        if path[:-1] in _RAW_TEXT_PARENTS:
            return node.value
        if path[:1] == ("torch",) and not tag.endswith(":bool"):
            return BareNumber(node.value)
        try:
            return self.loader.construct_object(node, deep=True)
        except (ValueError, LookupError, TypeError, ArithmeticError, yaml.YAMLError):
            kind = tag.rsplit(":", 1)[-1]
            message = f"{show_value(node.value)} cannot be read as {kind} (it is tagged {_tag(tag)})"
            raise self._fail(message, node, path, hint="Fix the value or remove the tag.") from None


def _tag(tag: str) -> str:
    """A YAML tag as written in a file: `!!int` rather than `tag:yaml.org,2002:int`."""
    return show_value(tag.replace("tag:yaml.org,2002:", "!!"))[1:-1]




def _read_text(path: Path, file: str) -> str:
    try:
        with path.open("rb") as handle:
            data = handle.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise scenario_error(f"cannot read the file: {exc.strerror or exc}", file=file) from None
    if len(data) > MAX_FILE_BYTES:
        raise scenario_error(
            "the file is larger than 1 MiB, the limit for scenario files",
            file=file,
            hint="Keep data in the script's folder, not in the YAML.",
        )
    try:
        return data.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise scenario_error(
            f"the file is not valid UTF-8 (byte 0x{data[exc.start]:02x} at offset {exc.start})",
            file=file,
            line=line,
            hint="Save it as UTF-8.",
        ) from None


def _compose(text: str, file: str) -> tuple[Any, dict[FieldPath, int]]:
    try:
        loader = _Loader(text)  # the reader checks every character here
    except yaml.YAMLError as exc:
        raise _reader_error(exc, text, file) from None
    try:
        root = loader.get_single_node()
        if root is None:
            raise scenario_error(
                "the file is empty",
                file=file,
                line=1,
                hint="A scenario needs at least name, torch, arch, base, script and expect.",
            )
        if not isinstance(root, yaml.MappingNode):
            raise scenario_error(
                "the top level must be a mapping of keys such as `name:` and `torch:`, not a list or a text",
                file=file,
                line=root.start_mark.line + 1,
            )
        builder = _Builder(loader, file)
        return builder.build(root), builder.lines
    except _Refused as exc:
        raise scenario_error(exc.message, file=file, line=exc.line, hint=exc.hint) from None
    except yaml.MarkedYAMLError as exc:
        raise _syntax_error(exc, file) from None
    except yaml.YAMLError as exc:
        raise _reader_error(exc, text, file) from None
    finally:
        loader.dispose()


def _reader_error(exc: yaml.YAMLError, text: str, file: str) -> ScenarioError:
    position = getattr(exc, "position", None)
    line = text[:position].count("\n") + 1 if isinstance(position, int) else None
    character = getattr(exc, "character", None)
    if isinstance(character, int):
        message = f"invalid YAML: the file contains the control character U+{character:04X}"
        hint = "YAML forbids it; remove it, or write it as an escape such as \\x07 in double quotes."
        return scenario_error(message, file=file, line=line, hint=hint)
    return scenario_error(f"invalid YAML: {getattr(exc, 'reason', '') or exc}", file=file, line=line)


def _syntax_error(exc: yaml.MarkedYAMLError, file: str) -> ScenarioError:
    mark = exc.problem_mark or exc.context_mark
    problem = one_line(exc.problem or "syntax error")
    context = f" ({one_line(exc.context)})" if exc.context else ""
    if exc.context and problem.startswith("but "):  # "expected a single document ..., but found ..."
        problem, context = f"{one_line(exc.context)}, {problem}", ""
    opened = exc.context_mark
    if "<stream end>" in problem and opened is not None and mark is not None and opened.line != mark.line:
        # An unclosed bracket or quote: the file ends before it closes; point at where it opened.
        mark = opened
        context = f" ({one_line(exc.context or 'opened here')}, never closed)"
    return scenario_error(
        f"invalid YAML: {problem}{context}",
        file=file,
        line=mark.line + 1 if mark is not None else None,
        hint="Check the indentation (spaces, not tabs), colons and quotes on this line and the one above.",
    )


# --------------------------------------------------------------------------- validation errors


def _format_path(path: FieldPath) -> str:
    text = ""
    for part in path:
        if isinstance(part, int):
            text += f"[{part}]"
        elif re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.-]*", part):
            text += f".{part}" if text else part
        else:
            text += f"[{part!r}]"
    return text


def _clean_loc(loc: tuple[Any, ...], lines: Mapping[FieldPath, int], kind: str = "") -> FieldPath:
    path: FieldPath = tuple(loc)
    if kind != "extra_forbidden" and len(path) >= 2 and path[-1] == "[key]":
        path = path[:-1]  # pydantic's marker for an invalid key, not a key the user wrote as "[key]"
    while path and isinstance(path[-1], int) and path not in lines:
        path = path[:-1]  # a scalar given for a list (`torch: "2.5.1"`) is the field itself
    return path


def _line_for(path: FieldPath, lines: Mapping[FieldPath, int]) -> int | None:
    for end in range(len(path), -1, -1):
        if path[:end] in lines:
            return lines[path[:end]]
    return None


def _help_for(path: FieldPath) -> str | None:
    names = [part for part in path if isinstance(part, str)]
    while names:
        help_text = FIELD_HELP.get(".".join(names))
        if help_text:
            return help_text
        names.pop()
    return None




def _describe(error: Mapping[str, Any], path: FieldPath) -> tuple[str, str | None]:
    kind = error["type"]
    if kind == "missing":
        name = str(path[-1]) if path else "?"
        help_text = _help_for(path) or "see the scenario documentation"
        return f"the required key `{name}` is missing", f"Add it; it {help_text}."
    if kind == "extra_forbidden":
        return unknown_key(str(path[-1]), allowed_keys(path[:-1]))
    if kind in ("value_error", "assertion_error"):
        cause = error.get("ctx", {}).get("error")
        if isinstance(cause, InvalidValue):
            return cause.message, cause.hint
        return str(cause or error["msg"]), None
    help_text = _help_for(path)
    prefix = help_text if help_text else error["msg"][:1].lower() + error["msg"][1:]
    return f"{prefix}, got {show_value(error.get('input'))}", None


def _from_validation(exc: ValidationError, lines: Mapping[FieldPath, int], file: str) -> ScenarioError:
    found = []
    for index, error in enumerate(exc.errors()):
        path = _clean_loc(tuple(error["loc"]), lines, error["type"])
        found.append((_line_for(path, lines) or 0, index, path, error))
    # A misspelt key also shows up as a missing one: report what is written before what is absent.
    line, _, path, error = min(found, key=lambda item: (item[3]["type"] == "missing", item[0], item[1]))
    message, hint = _describe(error, path)
    if len(found) > 1:
        count = len(found) - 1
        more = f"This file has {count} more problem{'s' if count > 1 else ''} after this one."
        hint = f"{sentence(hint)} {more}" if hint else more
    return scenario_error(message, file=file, line=line or None, field=_format_path(path) or None, hint=hint)


# --------------------------------------------------------------------------- reading a file


def read_yaml(path: Path, display: str | None = None) -> tuple[Any, dict[FieldPath, int]]:
    """A scenario file's mapping and the line of each key, read with the loader's limits (size,
    UTF-8, no anchors or aliases); any problem is a ScenarioError naming the file (or `display`)
    and line."""
    file = display or display_path(path)
    return _compose(_read_text(path, file), file)


def validate_scenario(data: Mapping[str, Any], lines: Mapping[FieldPath, int], *, source: Path,
                      base_dir: Path | None = None, display: str | None = None) -> Scenario:
    """`read_yaml`'s mapping validated as a scenario file is: `script` relative to `base_dir`
    (default: the file's folder); every error names `display` (default: the file), line and field."""
    file = display or display_path(source)
    if "source" in data:
        message, hint = unknown_key("source", allowed_keys(()))
        raise scenario_error(
            message + " (`source` is set by the loader)", file=file, line=lines.get(("source",)),
            field="source", hint="Remove it.",
        )
    absolute = Path(os.path.abspath(source))
    try:
        return Scenario.model_validate(
            {**data, "source": absolute}, context={"base_dir": base_dir or absolute.parent}
        )
    except ValidationError as exc:
        raise _from_validation(exc, lines, file) from None
