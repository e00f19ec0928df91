"""Reading a wheel's Python source without importing it: modules, names, classes, fields, types.

`Wheel` parses a module the first time it is asked for and resolves a name the way the module
would at run time (`if TYPE_CHECKING:` blocks take their else branch; imports inside the wheel
are followed, star imports included; names from outside the wheel stay unresolved). `Flags` is
what a reader collects. Anything unexpected raises `ExtractError`: a wrong list must not pass for
a right one.
"""

from __future__ import annotations

import ast
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path


class ExtractError(Exception):
    pass


@dataclass
class Flag:
    hidden: bool = False
    deprecated: bool = False


@dataclass
class Flags:
    found: dict[str, Flag] = field(default_factory=dict)

    def add(self, name: str, *, hidden: bool = False, deprecated: bool = False) -> None:
        if not name.startswith("-"):
            raise ExtractError(f"not a flag: {name!r}")
        old = self.found.get(name)
        self.found[name] = Flag(
            hidden=hidden and (old is None or old.hidden),
            deprecated=deprecated or (old is not None and old.deprecated),
        )

    def lines(self) -> list[str]:
        out = []
        for name in sorted(self.found):
            f = self.found[name]
            marks = [m for m, on in (("hidden", f.hidden), ("deprecated", f.deprecated)) if on]
            out.append(" ".join([name, *marks]))
        return out


class Wheel:
    """The Python modules of one wheel, parsed on demand, and name resolution across them."""

    def __init__(self, path: Path) -> None:
        self.zip = zipfile.ZipFile(path)
        self.names = set(self.zip.namelist())
        self.trees: dict[str, ast.Module] = {}

    def __enter__(self) -> Wheel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.zip.close()

    def module(self, name: str) -> ast.Module:
        if name not in self.trees:
            base = name.replace(".", "/")
            for path in (f"{base}.py", f"{base}/__init__.py"):
                if path in self.names:
                    self.trees[name] = ast.parse(self.zip.read(path), filename=path)
                    break
            else:
                raise ExtractError(f"module {name} is not in the wheel")
        return self.trees[name]

    def has_module(self, name: str) -> bool:
        base = name.replace(".", "/")
        return f"{base}.py" in self.names or f"{base}/__init__.py" in self.names

    def resolve(self, module: str, name: str, depth: int = 0) -> tuple[str, ast.AST] | None:
        """The definition `name` has in `module`, following imports inside the wheel."""
        if depth > 20:
            raise ExtractError(f"import cycle resolving {module}.{name}")
        stars: list[str] = []
        for stmt in _runtime_statements(self.module(module).body):
            if isinstance(stmt, ast.ClassDef | ast.FunctionDef) and stmt.name == name:
                return module, stmt
            if isinstance(stmt, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == name for t in stmt.targets
            ):
                return module, stmt.value
            if isinstance(stmt, ast.AnnAssign) and is_name(stmt.target, name) and stmt.value:
                return module, stmt.value
            alias_type = getattr(ast, "TypeAlias", None)  # `type X = ...`, Python 3.12+
            if alias_type and isinstance(stmt, alias_type) and is_name(stmt.name, name):
                return module, stmt.value
            if isinstance(stmt, ast.ImportFrom):
                for alias in stmt.names:
                    if alias.name == "*" and self.has_module(_absolute(module, stmt)):
                        stars.append(_absolute(module, stmt))
                    elif (alias.asname or alias.name) == name:
                        source = _absolute(module, stmt)
                        if self.has_module(f"{source}.{alias.name}"):
                            return None  # a module, not a definition
                        if not self.has_module(source):
                            return None  # outside the wheel (typing, pydantic, ...)
                        return self.resolve(source, alias.name, depth + 1)
        for source in stars:
            if found := self.resolve(source, name, depth + 1):
                return found
        return None

    def class_def(self, module: str, expr: ast.expr) -> tuple[str, ast.ClassDef]:
        name = expr.id if isinstance(expr, ast.Name) else None
        found = self.resolve(module, name) if name else None
        if found is None or not isinstance(found[1], ast.ClassDef):
            raise ExtractError(f"{module}: {ast.unparse(expr)} is not a class in the wheel")
        return found[0], found[1]

    def method(self, module: str, cls: ast.ClassDef, name: str) -> tuple[str, ast.FunctionDef]:
        for mod, c in self.mro(module, cls):
            for stmt in c.body:
                if isinstance(stmt, ast.FunctionDef) and stmt.name == name:
                    return mod, stmt
        raise ExtractError(f"{module}.{cls.name} has no method {name}")

    def mro(self, module: str, cls: ast.ClassDef) -> Iterator[tuple[str, ast.ClassDef]]:
        """The class, then its bases found in the wheel, depth first."""
        yield module, cls
        for base in cls.bases:
            found = self.resolve(module, base.id) if isinstance(base, ast.Name) else None
            if found is not None and isinstance(found[1], ast.ClassDef):
                yield from self.mro(found[0], found[1])

    def fields(self, module: str, cls: ast.ClassDef) -> list[tuple[str, str, ast.expr]]:
        """Dataclass-style fields (module, name, annotation), base classes' first."""
        out: dict[str, tuple[str, str, ast.expr]] = {}
        for mod, c in reversed(list(self.mro(module, cls))):
            for stmt in c.body:
                if (
                    isinstance(stmt, ast.AnnAssign)
                    and isinstance(stmt.target, ast.Name)
                    and not _is_classvar(stmt.annotation)
                ):
                    out[stmt.target.id] = (mod, stmt.target.id, stmt.annotation)
        return list(out.values())

    def hints(self, module: str, expr: ast.expr, depth: int = 0) -> set[str]:
        """A type annotation flattened like vLLM's `get_type_hints`: bool, str, None,
        dataclass or other, through unions, Optional, Annotated and aliases in the wheel."""
        if depth > 30:
            raise ExtractError(f"{module}: annotation too deep: {ast.unparse(expr)}")
        match expr:
            case ast.Constant(value=None):
                return {"None"}
            case ast.Constant(value=str() as text):
                return self.hints(module, ast.parse(text, mode="eval").body, depth + 1)
            case ast.BinOp(op=ast.BitOr()):
                return self.hints(module, expr.left, depth + 1) | self.hints(
                    module, expr.right, depth + 1
                )
            case ast.Subscript(value=outer, slice=inner):
                head = tail(outer)
                items = inner.elts if isinstance(inner, ast.Tuple) else [inner]
                if head == "Optional":
                    return self.hints(module, items[0], depth + 1) | {"None"}
                if head == "Union":
                    return set().union(*(self.hints(module, i, depth + 1) for i in items))
                if head == "Annotated":
                    return self.hints(module, items[0], depth + 1)
                return {"other"}
            case ast.Name(id="None"):
                return {"None"}
            case ast.Name(id=("bool" | "str") as builtin):
                return {builtin}
            case ast.Name(id=name) | ast.Attribute(attr=name):
                found = self.resolve(module, name) if isinstance(expr, ast.Name) else None
                if found is None:
                    return {"other"}
                mod, node = found
                if isinstance(node, ast.ClassDef):
                    return {"dataclass"} if _is_dataclass(node) else {"other"}
                if isinstance(node, ast.expr) and not isinstance(node, ast.Call):
                    return self.hints(mod, node, depth + 1)
                return {"other"}
        return {"other"}


def _runtime_statements(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """Top-level statements as they run: `if TYPE_CHECKING:` takes its else branch; other
    conditions and `try` blocks may run either way, so both are read."""
    for stmt in body:
        if isinstance(stmt, ast.If):
            if tail(stmt.test) != "TYPE_CHECKING":
                yield from _runtime_statements(stmt.body)
            yield from _runtime_statements(stmt.orelse)
        elif isinstance(stmt, ast.Try):
            for part in (stmt.body, *(h.body for h in stmt.handlers), stmt.orelse):
                yield from _runtime_statements(part)
        else:
            yield stmt


def _absolute(module: str, stmt: ast.ImportFrom) -> str:
    if not stmt.level:
        return stmt.module or ""
    parts = module.split(".")[: -stmt.level]
    return ".".join(parts + ([stmt.module] if stmt.module else []))


def is_name(node: ast.AST, name: str) -> bool:
    return isinstance(node, ast.Name) and node.id == name


def tail(node: ast.expr) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return ""


def _is_classvar(annotation: ast.expr) -> bool:
    head = annotation.value if isinstance(annotation, ast.Subscript) else annotation
    return tail(head) in ("ClassVar", "InitVar")


def _is_dataclass(cls: ast.ClassDef) -> bool:
    for deco in cls.decorator_list:
        target = deco.func if isinstance(deco, ast.Call) else deco
        if tail(target) in ("dataclass", "config"):
            return True
    return False


def literal_text(node: ast.expr | None) -> str:
    """The literal start of a help string (for a deprecation notice), '' if none."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr) and node.values:
        return literal_text(node.values[0])
    if isinstance(node, ast.BinOp):
        return literal_text(node.left)
    return ""


def is_deprecated(help_node: ast.expr | None, action: ast.expr | None) -> bool:
    if action is not None and "deprecated" in tail(action).lower():
        return True
    if isinstance(help_node, ast.Name) and "DEPRECAT" in help_node.id:
        return True
    return literal_text(help_node).lstrip("(").lower().startswith("deprecated")


def is_hidden(help_node: ast.expr | None) -> bool:
    return help_node is not None and tail(help_node) == "SUPPRESS"


def literal_flags(call: ast.Call, where: str) -> list[str]:
    names = []
    for arg in call.args:
        if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
            if arg.value.startswith("-"):
                names.append(arg.value)
        else:
            raise ExtractError(f"{where}: flag name is not a literal: {ast.unparse(arg)}")
    return names


def add_argument_calls(body: list[ast.stmt]) -> Iterator[ast.Call]:
    for node in ast.walk(ast.Module(body=body, type_ignores=[])):
        if isinstance(node, ast.Call) and tail(node.func) == "add_argument":
            yield node


def keyword(call: ast.Call, name: str) -> ast.expr | None:
    return next((k.value for k in call.keywords if k.arg == name), None)


def is_true(node: ast.expr | None) -> bool:
    return isinstance(node, ast.Constant) and node.value is True


def strings(nodes: list[ast.expr]) -> list[str]:
    """String literals, or an error naming what is not one."""
    out = []
    for node in nodes:
        if not (isinstance(node, ast.Constant) and isinstance(node.value, str)):
            raise ExtractError(f"not a string literal: {ast.unparse(node)}")
        out.append(node.value)
    return out
