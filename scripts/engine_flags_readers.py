"""The argument definitions of `vllm serve` and `sglang serve`, read from their wheels' source.

vLLM (0.33.0): `make_arg_parser` adds a few flags, then the frontend class's flags (one per field
of `FrontendArgs` and its bases, with the overrides its `_customize_cli_kwargs` makes), then
`AsyncEngineArgs.add_cli_args`, which calls `EngineArgs.add_cli_args`: literal flag names whose
keyword arguments come from `get_kwargs(SomeConfig)["field"]`. A field whose type contains
`bool` (but is not exactly `bool | str | None`, nor holds a dataclass) gets
`BooleanOptionalAction`, which vLLM's parser replaces with `EnableDisableAction`: `--x` and
`--no-x`, or for `--enable-x` the pair `--enable-x`/`--disable-x` with `--no-enable-x` accepted
but hidden from help.

SGLang (0.5.23): `ServerArgs` collects the fields of the namespaces listed in
`_INPUT_NAMESPACES`; every `A[type, "help"]` or `A[type, Arg(...)]` field is a flag
(`--field-name`, or `Arg(cli_name=...)`, plus `aliases`), unless `Arg(no_cli=True)`; then
`ServerArgs.add_cli_args` adds a few by hand.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass, field

from engine_flags_ast import (
    ExtractError,
    Flags,
    Wheel,
    add_argument_calls,
    is_deprecated,
    is_hidden,
    is_name,
    is_true,
    keyword,
    literal_flags,
    literal_text,
    strings,
    tail,
)

VLLM_SERVE = ("vllm.entrypoints.common.cli_args", "make_arg_parser")


Located = tuple[str, ast.ClassDef]
"""A class and the module it is defined in."""


@dataclass
class Table:
    """What `get_kwargs(cls)` returns, as far as flags go: the class and per-field overrides."""

    module: str
    cls: ast.ClassDef
    overrides: dict[str, dict[str, ast.expr]] = field(default_factory=dict)


FieldRef = tuple[Table, str]
"""`get_kwargs(cls)["field"]`: a table and one of its fields."""


class VllmReader:
    def __init__(self, wheel: Wheel) -> None:
        self.wheel = wheel
        self.flags = Flags()

    def read(self) -> Flags:
        module, entry = VLLM_SERVE
        found = self.wheel.resolve(module, entry)
        if found is None or not isinstance(found[1], ast.FunctionDef):
            raise ExtractError(f"{module}.{entry} not found")
        self.body(module, found[1], None)
        return self.flags

    def body(self, module: str, func: ast.FunctionDef, cls: Located | None) -> None:
        """Every flag `func` registers, following `X.add_cli_args(parser)` into other classes."""
        where = f"{module}.{func.name}"
        tables: dict[str, Table] = {}
        fields_of: dict[str, FieldRef] = {}
        for stmt in ast.walk(ast.Module(body=func.body, type_ignores=[])):
            if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
                self.assign(module, stmt, cls, tables, fields_of)
            elif isinstance(stmt, ast.Call) and tail(stmt.func) == "add_cli_args":
                owner = stmt.func.value if isinstance(stmt.func, ast.Attribute) else None
                if owner is None or tail(owner) == "super":
                    raise ExtractError(f"{where}: cannot follow {ast.unparse(stmt)}")
                mod, c = self.wheel.class_def(module, owner)
                mod_m, method = self.wheel.method(mod, c, "add_cli_args")
                self.body(mod_m, method, (mod, c))
        for call in add_argument_calls(func.body):
            self.argument(where, call, tables, fields_of)
        for loop in (n for n in ast.walk(func) if isinstance(n, ast.For)):
            self.field_loop(where, loop, tables)

    def assign(self, module: str, stmt: ast.Assign, cls: Located | None,
               tables: dict[str, Table], fields_of: dict[str, FieldRef]) -> None:  # fmt: skip
        target, value = stmt.targets[0], stmt.value
        if isinstance(target, ast.Name) and isinstance(value, ast.Call):
            if tail(value.func) == "get_kwargs":
                arg = value.args[0]
                if is_name(arg, "cls") and cls is not None:
                    table = Table(*cls)
                else:
                    table = Table(*self.wheel.class_def(module, arg))
                self.customize(table)
                tables[target.id] = table
            elif tail(value.func) == "_customize_cli_kwargs" and value.args:
                source = value.args[0]
                if isinstance(source, ast.Name) and source.id in tables:
                    tables[target.id] = tables[source.id]
        elif isinstance(target, ast.Name) and isinstance(value, ast.Subscript):
            base, key = value.value, value.slice
            if not (isinstance(key, ast.Constant) and isinstance(key.value, str)):
                return
            if isinstance(base, ast.Call) and tail(base.func) == "get_kwargs":
                table = Table(*self.wheel.class_def(module, base.args[0]))
                fields_of[target.id] = (table, key.value)
            elif isinstance(base, ast.Name) and base.id in tables:
                fields_of[target.id] = (tables[base.id], key.value)
        elif isinstance(target, ast.Subscript):  # kw["field"]["action"] = ...
            self.override(target, value, tables)

    def customize(self, table: Table) -> None:
        """Overrides the class's `_customize_cli_kwargs` (and its bases') make on the table."""
        for _mod, c in self.wheel.mro(table.module, table.cls):
            for stmt in c.body:
                if isinstance(stmt, ast.FunctionDef) and stmt.name == "_customize_cli_kwargs":
                    name = stmt.args.args[-1].arg
                    for node in ast.walk(stmt):
                        if isinstance(node, ast.Assign) and len(node.targets) == 1:
                            self.override(node.targets[0], node.value, {name: table})

    def override(self, target: ast.expr, value: ast.expr, tables: dict[str, Table]) -> None:
        match target:
            case ast.Subscript(
                value=ast.Subscript(value=ast.Name(id=name), slice=ast.Constant(value=str() as f)),
                slice=ast.Constant(value=str() as key),
            ) if name in tables:
                tables[name].overrides.setdefault(f, {})[key] = value

    def kind(self, table: Table, name: str) -> str:
        """How `get_kwargs` turns the field's type into an argparse action."""
        fields = {f: (mod, ann) for mod, f, ann in self.wheel.fields(table.module, table.cls)}
        if name not in fields:
            raise ExtractError(f"{table.cls.name} has no field {name}")
        hints = self.wheel.hints(*fields[name])
        if "dataclass" in hints or hints == {"bool", "str", "None"}:
            return "value"
        return "bool" if "bool" in hints else "value"

    def argument(self, where: str, call: ast.Call, tables: dict[str, Table],
                 fields_of: dict[str, FieldRef]) -> None:  # fmt: skip
        if any(isinstance(a, ast.Starred) for a in call.args):
            return  # the per-field loop of a frontend class: see field_loop
        names = literal_flags(call, where)
        source: FieldRef | None = None
        literal: dict[str, ast.expr] = {}
        for kw in call.keywords:
            if kw.arg is not None:
                literal[kw.arg] = kw.value
                continue
            for unpacked, beside in _unpacked(kw.value):
                literal.update(beside)
                source = self.field_ref(where, unpacked, tables, fields_of)
        overrides = source[0].overrides.get(source[1], {}) if source else {}
        action = literal.get("action") or overrides.get("action")
        if action is not None:
            kind = "bool" if tail(action) == "BooleanOptionalAction" else "value"
        else:
            kind = self.kind(*source) if source else "value"
        help_node = literal.get("help") or overrides.get("help")
        deprecated = is_deprecated(help_node, action) or is_true(literal.get("deprecated"))
        self.emit(names, kind, hidden=is_hidden(help_node), deprecated=deprecated)

    def field_ref(self, where: str, node: ast.expr, tables: dict[str, Table],
                  fields_of: dict[str, FieldRef]) -> FieldRef:  # fmt: skip
        match node:
            case ast.Subscript(value=ast.Name(id=name), slice=ast.Constant(value=str() as f)):
                if name in tables:
                    return tables[name], f
            case ast.Name(id=name) if name in fields_of:
                return fields_of[name]
        raise ExtractError(f"{where}: cannot read keyword arguments {ast.unparse(node)}")

    def field_loop(self, where: str, loop: ast.For, tables: dict[str, Table]) -> None:
        """`for key, value in kw.items(): add_argument(*extra, f"--{key}", **value)`."""
        it = loop.iter
        if not (isinstance(it, ast.Call) and tail(it.func) == "items"):
            return
        owner = it.func.value if isinstance(it.func, ast.Attribute) else None
        if not (isinstance(owner, ast.Name) and owner.id in tables):
            return
        if not list(add_argument_calls(loop.body)):
            return
        table = tables[owner.id]
        for _mod, name, _ann in self.wheel.fields(table.module, table.cls):
            overrides = table.overrides.get(name, {})
            names = ["--" + name.replace("_", "-")]
            if isinstance(extra := overrides.get("flags"), ast.List):
                names += strings(extra.elts)
            action = overrides.get("action")
            if action is not None:
                kind = "bool" if tail(action) == "BooleanOptionalAction" else "value"
            else:
                kind = self.kind(table, name)
            help_node = overrides.get("help")
            self.emit(names, kind, hidden=is_hidden(help_node),
                      deprecated=is_deprecated(help_node, action))  # fmt: skip

    def emit(self, names: list[str], kind: str, *, hidden: bool, deprecated: bool) -> None:
        for name in names:
            self.flags.add(name, hidden=hidden, deprecated=deprecated)
        if kind != "bool":
            return
        # vLLM's parser registers its EnableDisableAction for BooleanOptionalAction.
        for name in (n for n in names if n.startswith("--")):
            inverse = next(
                (new + name.removeprefix(old) for old, new in
                 (("--enable-", "--disable-"), ("--disable-", "--enable-"))
                 if name.startswith(old)), None,
            )  # fmt: skip
            self.flags.add("--no-" + name[2:], hidden=hidden or inverse is not None,
                           deprecated=deprecated)  # fmt: skip
            if inverse:
                self.flags.add(inverse, hidden=hidden, deprecated=deprecated)


def _unpacked(node: ast.expr) -> Iterator[tuple[ast.expr, dict[str, ast.expr]]]:
    """`**kw["f"]` or `**{**kw["f"], "help": ...}`: the source, with literal keys beside it."""
    if isinstance(node, ast.Dict):
        literal = {
            k.value: v
            for k, v in zip(node.keys, node.values, strict=True)
            if isinstance(k, ast.Constant) and isinstance(k.value, str)
        }
        for k, v in zip(node.keys, node.values, strict=True):
            if k is None:
                yield v, literal
    else:
        yield node, {}


SGLANG_ARGS = "sglang.srt.server_args"


def read_sglang(wheel: Wheel) -> Flags:
    flags = Flags()
    tree = wheel.module(SGLANG_ARGS)
    spaces = next(
        (s.value for s in tree.body if isinstance(s, ast.Assign)
         and any(is_name(t, "_INPUT_NAMESPACES") for t in s.targets)), None,
    )  # fmt: skip
    if not isinstance(spaces, ast.List):
        raise ExtractError(f"{SGLANG_ARGS}: no _INPUT_NAMESPACES list")
    server_args = wheel.class_def(SGLANG_ARGS, ast.Name("ServerArgs"))
    classes = [wheel.class_def(SGLANG_ARGS, e) for e in spaces.elts] + [server_args]
    for module, cls in classes:
        for mod, name, ann in wheel.fields(module, cls):
            sglang_field(wheel, flags, mod, name, ann)
    mod, method = wheel.method(*server_args, "add_cli_args")
    calls = [n for n in ast.walk(method) if isinstance(n, ast.Call)]
    if not any(tail(c.func) == "add_cli_args_from_dataclass" for c in calls):
        raise ExtractError(f"{mod}.ServerArgs.add_cli_args no longer derives flags from fields")
    for call in add_argument_calls(method.body):
        help_node, action = keyword(call, "help"), keyword(call, "action")
        for name in literal_flags(call, f"{mod}.ServerArgs.add_cli_args"):
            flags.add(name, hidden=is_hidden(help_node),
                      deprecated=is_deprecated(help_node, action))  # fmt: skip
    return flags


def sglang_field(wheel: Wheel, flags: Flags, module: str, name: str, ann: ast.expr) -> None:
    """The flags of one `A[type, "help"]` or `A[type, Arg(...)]` field (none for others)."""
    if not isinstance(ann, ast.Subscript):
        return
    head = tail(ann.value)
    if head == "A":
        found = wheel.resolve(module, "A")
        head = tail(found[1]) if found and isinstance(found[1], ast.expr) else head
    if head != "Annotated" or not isinstance(ann.slice, ast.Tuple):
        return
    meta: dict[str, ast.expr] | None = None
    for item in ann.slice.elts[1:]:
        if isinstance(item, ast.Call) and tail(item.func) == "Arg":
            if item.args or any(k.arg is None for k in item.keywords):
                raise ExtractError(f"{module}.{name}: Arg(...) with positional arguments")
            meta = {k.arg: k.value for k in item.keywords if k.arg}
            break
        if literal_text(item) or isinstance(item, ast.JoinedStr | ast.BinOp):
            meta = {"help": item}
            break
        if isinstance(item, ast.Name):
            raise ExtractError(f"{module}.{name}: cannot tell what {item.id} is")
    if meta is None or is_true(meta.get("no_cli")):
        return
    cli = meta.get("cli_name")
    names = strings([cli]) if cli is not None else ["--" + name.replace("_", "-")]
    if (aliases := meta.get("aliases")) is not None:
        if not isinstance(aliases, ast.List):
            raise ExtractError(f"{module}.{name}: aliases is not a literal list")
        names += strings(aliases.elts)
    help_node, action = meta.get("help"), meta.get("action")
    for n in names:
        flags.add(n, hidden=is_hidden(help_node), deprecated=is_deprecated(help_node, action))
    if action is not None and tail(action) == "BooleanOptionalAction":
        for n in (n for n in names if n.startswith("--")):
            flags.add("--no-" + n[2:], hidden=is_hidden(help_node))


def read_vllm(wheel: Wheel) -> Flags:
    return VllmReader(wheel).read()
