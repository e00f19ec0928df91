"""Typed reading of a composed YAML node tree, with the position of every value.

Role: the scenario loader never lets PyYAML construct Python objects. It composes the document
into nodes (each with a start mark) and reads them through the helpers here, which check the
shape and type of each value and raise `Invalid` naming the node's line and column.

Invariants:
- Every rejection is an `Invalid` with a 1-based line and column and a message that says what was
  found and what was expected; no other exception leaves this module for any input text.
- Mapping keys are plain scalars read as written (`off`, `01`, `yes` stay text) and are unique:
  a repeated key is an error at its second occurrence. Merge keys (`<<`) are refused.
- Strings are read from the scalar's text, so `01` as a name stays `01`; integers must be plain
  decimal and booleans must be YAML booleans, never quoted strings.
- Composing stops at the first value past `MAX_YAML_NODES` or `MAX_DEPTH`; before any walk,
  `check_graph` refuses a recursive alias, or a document larger than `MAX_YAML_NODES` values
  once its aliases count as copies (an alias bomb), without ever expanding it. Walking follows
  the schema only, so nothing can make it loop.
- Every scalar is bounded before it is converted (`limits.py`): strings and names by length,
  whole numbers by digits and by the range the caller gives, durations by `MAX_DURATION_MS`.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from llmgw_twin import units
from llmgw_twin.twin.scenario.limits import (
    MAX_DEPTH,
    MAX_DIGITS,
    MAX_DURATION_MS,
    MAX_NAME_LEN,
    MAX_STRING_LEN,
    MAX_YAML_NODES,
)

NAME_RE = re.compile(r"[A-Za-z0-9._-]+")
"""Names of scenarios, nodes, fabrics, profiles, models and fault ids."""

_TAG = "tag:yaml.org,2002:"
_STR_TAGS = frozenset(_TAG + t for t in ("str", "int", "float", "bool", "timestamp"))
_DECIMAL = re.compile(r"[-+]?(?:0|[1-9][0-9_]*)")
_LINE_BREAKS = ("\n", "\x85", "\u2028", "\u2029")  # after \r is normalised; as PyYAML counts
_TRUE = frozenset(("yes", "true", "on"))
_FALSE = frozenset(("no", "false", "off"))


class Invalid(Exception):
    """A rejected value: where it is (1-based) and what is wrong with it."""

    def __init__(self, line: int, column: int, message: str) -> None:
        super().__init__(line, column, message)
        self.line = line
        self.column = column
        self.message = message

    @classmethod
    def at(cls, node: Node, message: str) -> Invalid:
        return cls(*line_col(node), message)


def line_col(node: Node) -> tuple[int, int]:
    """The 1-based line and column a node starts at."""
    mark = node.start_mark
    return (1, 1) if mark is None else (mark.line + 1, mark.column + 1)


def line_of(node: Node) -> int:
    """The 1-based line a node starts on."""
    return line_col(node)[0]


class _BoundedLoader(yaml.SafeLoader):
    """PyYAML's safe composer, stopped at the first value past `MAX_YAML_NODES` (each alias
    counted once here; `check_graph` counts what aliases stand for) or nested past `MAX_DEPTH`,
    so a hostile file costs no more parsing than these bounds and never exhausts the stack."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._values = 0
        self._depth = 0

    def compose_node(self, parent: Node | None, index: int) -> Node | None:
        mark = self.peek_event().start_mark  # type: ignore[no-untyped-call]  # untyped in stubs
        self._values += 1
        if self._values > MAX_YAML_NODES:
            raise Invalid(mark.line + 1, mark.column + 1, _too_large())
        if self._depth == MAX_DEPTH:
            raise Invalid(mark.line + 1, mark.column + 1, _too_deep())
        self._depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def _too_large() -> str:
    return (
        f"the document is too large: more than {MAX_YAML_NODES:,} values "
        "(an alias counts as a copy of what it names)"
    )


def _too_deep() -> str:
    return f"nested too deeply (at most {MAX_DEPTH} levels)"


def compose(source: str) -> Node | None:
    """The single document in `source` as a node tree; None for an empty document."""
    try:
        return yaml.compose(source, Loader=_BoundedLoader)
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        what = err.problem or err.context or "syntax error"
        if err.context and err.problem:
            # PyYAML splits one sentence in two; put it back in reading order.
            joined = err.problem.startswith("but ")
            what = f"{err.context}, {err.problem}" if joined else f"{err.problem} ({err.context})"
        line, column = (1, 1) if mark is None else (mark.line + 1, mark.column + 1)
        raise Invalid(line, column, f"invalid YAML: {_quoted_short(what)}") from None
    except yaml.reader.ReaderError as err:
        pos = max(0, min(err.position, len(source)))
        line = sum(source.count(b, 0, pos) for b in _LINE_BREAKS) + 1
        column = pos - (max(source.rfind(b, 0, pos) for b in _LINE_BREAKS) + 1) + 1
        raise Invalid(line, column, f"invalid YAML: {err.reason} {err.character!r}") from None
    except yaml.YAMLError as err:
        raise Invalid(1, 1, f"invalid YAML: {err}") from None
    except RecursionError:  # not reached within MAX_DEPTH; kept so that nothing else escapes
        raise Invalid(1, 1, "invalid YAML: nested too deeply") from None


def check_graph(root: Node) -> None:
    """Refuse a document holding an alias to one of its own enclosing values, or larger than
    `MAX_YAML_NODES` values when every alias counts as a copy of what it names. Aliases are never
    expanded: each distinct node is visited once (a composed document shares the anchored node),
    and its expanded size is computed from its children's."""
    size: dict[int, int] = {}  # id(node) -> values under it, itself included, aliases expanded
    open_ids: set[int] = set()  # membership only: the nodes on the current path
    stack: list[tuple[Node, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        key = id(node)
        kids = _children(node)
        if children_done:
            open_ids.discard(key)
            size[key] = 1 + sum(size[id(k)] for k in kids)
            if size[key] > MAX_YAML_NODES:
                raise Invalid.at(node, _too_large())
            continue
        if key in size:
            continue
        open_ids.add(key)
        stack.append((node, True))
        for kid in reversed(kids):
            if id(kid) in open_ids:
                raise Invalid.at(
                    kid,
                    "an alias refers to a value that contains it (recursive aliases are refused)",
                )
            if id(kid) not in size:
                stack.append((kid, False))


def _children(node: Node) -> list[Node]:
    if isinstance(node, MappingNode):
        return [n for pair in node.value for n in pair]
    if isinstance(node, SequenceNode):
        return list(node.value)
    return []


_QUOTED = re.compile(r"'([^']{81,})'")


def _quoted_short(message: str) -> str:
    """PyYAML quotes what it found (an alias, an anchor, a tag) whole: shorten each, so that a
    message never carries a long value whole."""
    return _QUOTED.sub(lambda m: f"'{short(m.group(1))}'", message)


def short(value: str, limit: int = 80) -> str:
    """`value`, or its start and its length when longer than `limit`, for messages."""
    return value if len(value) <= limit else f"{value[: limit - 3]}... ({len(value):,} characters)"


def kind_of(node: Node) -> str:
    """What a node is, for messages: `a mapping`, `a list`, `null`, `the integer 3`, ..."""
    if isinstance(node, MappingNode):
        return "a mapping"
    if isinstance(node, SequenceNode):
        return "a list"
    if node.tag == _TAG + "null":
        return "null"
    kinds = {"bool": "the boolean", "int": "the integer", "float": "the number"}
    text = str(node.value)
    shown = text if len(text) <= 40 else text[:37] + "..."
    return f"{kinds.get(node.tag.removeprefix(_TAG), 'the string')} {shown!r}"


def is_int(node: Node) -> bool:
    return isinstance(node, ScalarNode) and node.tag == _TAG + "int"


def is_null(node: Node) -> bool:
    return isinstance(node, ScalarNode) and node.tag == _TAG + "null"


def preview(names: Sequence[str], limit: int = 12) -> str:
    """`a, b, c` -- or the first `limit` names and a count of the rest, for big fleets."""
    if not names:
        return "none"
    shown = ", ".join(names[:limit])
    more = len(names) - limit
    return shown if more <= 0 else f"{shown}, ... ({more} more)"


@dataclass(frozen=True, slots=True)
class Entry:
    key: str
    key_node: ScalarNode
    value: Node


class MapView:
    """A mapping node with unique, plain-scalar keys, kept in file order."""

    def __init__(self, node: Node, where: str) -> None:
        if not isinstance(node, MappingNode):
            raise Invalid.at(node, f"{where} must be a mapping, got {kind_of(node)}")
        self.node = node
        self.where = where
        self.entries: list[Entry] = []
        self._by_key: dict[str, Entry] = {}
        for key_node, value in node.value:
            if not isinstance(key_node, ScalarNode) or is_null(key_node):
                raise Invalid.at(
                    key_node, f"keys in {where} must be names, got {kind_of(key_node)}"
                )
            if key_node.tag == _TAG + "merge":
                raise Invalid.at(key_node, f"merge keys (<<) are not supported in {where}")
            key = str(key_node.value)
            first = self._by_key.get(key)
            if first is not None:
                raise Invalid.at(
                    key_node,
                    f"duplicate key '{short(key)}' in {where} "
                    f"(first at line {line_of(first.key_node)})",
                )
            entry = Entry(key, key_node, value)
            self.entries.append(entry)
            self._by_key[key] = entry

    def check_keys(self, allowed: Sequence[str], expected: str | None = None) -> None:
        for entry in self.entries:
            if entry.key not in allowed:
                hint = expected or f"one of: {', '.join(allowed)}"
                raise Invalid.at(
                    entry.key_node,
                    f"unknown key '{short(entry.key)}' in {self.where} (expected {hint})",
                )

    def has(self, key: str) -> bool:
        return key in self._by_key

    def get(self, key: str) -> Node | None:
        """The value under `key`; None when absent or written as null."""
        entry = self._by_key.get(key)
        if entry is None or is_null(entry.value):
            return None
        return entry.value

    def entry(self, key: str) -> Entry:
        return self._by_key[key]

    def require(self, key: str) -> Node:
        entry = self._by_key.get(key)
        if entry is None:
            raise Invalid.at(self.node, f"missing required key '{key}' in {self.where}")
        if is_null(entry.value):
            raise Invalid.at(entry.value, f"{self.where}.{key} needs a value, got null")
        return entry.value


def items(node: Node, where: str, maximum: int | None = None) -> list[Node]:
    """The items of a list node; more than `maximum` is an error at the first one too many."""
    if not isinstance(node, SequenceNode):
        raise Invalid.at(node, f"{where} must be a list, got {kind_of(node)}")
    if maximum is not None and len(node.value) > maximum:
        raise Invalid.at(
            node.value[maximum],
            f"{where} has {len(node.value):,} items, more than the {maximum:,} allowed",
        )
    return list(node.value)


def text(node: Node, where: str, limit: int = MAX_STRING_LEN, what: str = "strings") -> str:
    """A scalar's text as written (numbers and booleans included); null and collections fail,
    and so does text longer than `limit` characters."""
    if not isinstance(node, ScalarNode) or node.tag not in _STR_TAGS:
        raise Invalid.at(node, f"{where} must be a string, got {kind_of(node)}")
    value = str(node.value)
    if len(value) > limit:
        raise Invalid.at(
            node,
            f"{where} is too long: {len(value):,} characters ({what} have at most {limit:,})",
        )
    return value


def name(node: Node, where: str, what: str = "name") -> str:
    value = text(node, where, MAX_NAME_LEN, "names")
    if not NAME_RE.fullmatch(value):
        raise Invalid.at(
            node,
            f"{where}: {value!r} is not a valid {what} "
            "(use letters, digits, '.', '_' and '-' only)",
        )
    return value


def integer(node: Node, where: str, minimum: int | None = None, maximum: int | None = None) -> int:
    """A plain decimal whole number of at most `MAX_DIGITS` digits, within the bounds given."""
    value = str(node.value) if isinstance(node, ScalarNode) else ""
    if not (
        isinstance(node, ScalarNode) and node.tag == _TAG + "int" and _DECIMAL.fullmatch(value)
    ):
        plain = " plain decimal" if is_int(node) else ""  # 0x10, 010, 1:30 are YAML ints too
        raise Invalid.at(node, f"{where} must be a{plain} whole number, got {kind_of(node)}")
    digits = value.lstrip("+-").replace("_", "")
    if len(digits) > MAX_DIGITS:
        raise Invalid.at(
            node,
            f"{where}: a number of {len(digits):,} digits is too long "
            f"(at most {MAX_DIGITS} digits)",
        )
    number = int(digits) * (-1 if value.startswith("-") else 1)
    if minimum is not None and number < minimum:
        raise Invalid.at(node, f"{where} must be at least {minimum}, got {number}")
    if maximum is not None and number > maximum:
        raise Invalid.at(node, f"{where} must be at most {maximum:,}, got {number:,}")
    return number


def boolean(node: Node, where: str) -> bool:
    if isinstance(node, ScalarNode) and node.tag == _TAG + "bool":
        word = str(node.value).lower()
        if word in _TRUE or word in _FALSE:
            return word in _TRUE
    raise Invalid.at(node, f"{where} must be true or false, got {kind_of(node)}")


def duration(node: Node, where: str, positive: bool = False) -> int:
    """A duration in integer milliseconds, at most `MAX_DURATION_MS`; `positive` refuses zero."""
    written = text(node, where)
    try:
        ms = units.parse_duration(written)
    except ValueError as err:
        raise Invalid.at(node, _quoted_short(f"{where}: {err}")) from None
    if positive and ms == 0:
        raise Invalid.at(node, f"{where} must be longer than 0")
    if ms > MAX_DURATION_MS:
        raise Invalid.at(
            node,
            f"{where}: '{written}' is longer than {units.fmt_duration(MAX_DURATION_MS)} "
            "(30 days, the longest duration a scenario may use)",
        )
    return ms


def size_mib(node: Node, where: str, maximum: int) -> int:
    """A size in integer MiB, at most `maximum`."""
    written = text(node, where)
    try:
        mib = units.parse_size_mib(written)
    except ValueError as err:
        raise Invalid.at(node, _quoted_short(f"{where}: {err}")) from None
    if mib > maximum:
        raise Invalid.at(
            node, f"{where}: '{written}' is more than {maximum:,}MiB (the most allowed)"
        )
    return mib


def choice(node: Node, where: str, allowed: Sequence[str], what: str) -> str:
    """A string that must be one of `allowed`."""
    value = text(node, where)
    if value not in allowed:
        raise Invalid.at(
            node,
            f"{where}: unknown {what} {short(value)!r} (expected one of: {', '.join(allowed)})",
        )
    return value
