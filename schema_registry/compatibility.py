"""Compatibility of schema versions: Avro's schema resolution rules, and the modes built on them.

A reader schema can read data written with a writer schema when Avro's resolution rules
(Avro specification, "Schema Resolution") succeed for every value the writer can produce:

- the same primitive type, or a promotion: int -> long, float, double; long -> float,
  double; float -> double; string <-> bytes;
- records with the same name: every reader field is in the writer (by name or one of the
  reader field's aliases) with a readable type, or has a default; writer fields the reader
  lacks are skipped;
- enums with the same name: every writer symbol is a reader symbol, unless the reader has a
  ``default`` symbol for the others;
- fixed with the same name and size; arrays and maps whose items or values are readable;
- a writer union: each of its branches is readable by the reader; a reader union: some branch
  reads the writer's type.

A log type's **compatibility mode** says which direction must hold between a new version and
*every* version registered before it (transitively: the loader resolves every old record to
the newest schema, so each pair matters, not only the newest two):

``backward``  the new schema reads data written with every older one (the default);
``forward``   every older schema reads data written with the new one;
``full``      both;
``none``      no check.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal, cast

from schema_registry.avro_schema import AvroSchema

Mode = Literal["backward", "forward", "full", "none"]
MODES: tuple[Mode, ...] = ("backward", "forward", "full", "none")
DEFAULT_MODE: Mode = "backward"

PRIMITIVES = frozenset({"null", "boolean", "int", "long", "float", "double", "bytes", "string"})
_PROMOTIONS = {
    "int": frozenset({"long", "float", "double"}),
    "long": frozenset({"float", "double"}),
    "float": frozenset({"double"}),
    "string": frozenset({"bytes"}),
    "bytes": frozenset({"string"}),
}


def parse_mode(value: object) -> Mode:
    if value not in MODES:
        raise ValueError(f"compatibility must be one of {', '.join(MODES)}, not {value!r}")
    return cast(Mode, value)


def _node(schema: AvroSchema, node: Any) -> Any:
    """A type node with named references replaced by their definitions."""
    return schema.resolve(node)


def type_name(node: Any) -> str:
    """The Avro type of a resolved node: a primitive, record, enum, fixed, array, map, union."""
    if isinstance(node, list):
        return "union"
    if isinstance(node, dict):
        kind = node["type"]
        if isinstance(kind, dict | list):
            return type_name(kind)
        return str(kind)
    return str(node)


def _describe(node: Any) -> str:
    kind = type_name(node)
    if kind in ("record", "enum", "fixed"):
        return f"{kind} {node['name']}"
    if kind == "union":
        return "union [" + ", ".join(type_name(n) for n in node) + "]"
    return kind


def _short(name: str) -> str:
    return name.rsplit(".", 1)[-1]


def _same_name(reader: dict[str, Any], writer: dict[str, Any]) -> bool:
    """Named types match by unqualified name, or by one of the reader's aliases."""
    if _short(reader["name"]) == _short(writer["name"]):
        return True
    return _short(writer["name"]) in {_short(a) for a in reader.get("aliases", [])}


class _Resolution:
    """One reader/writer pair, walked once; ``problems`` lists where resolution fails."""

    def __init__(self, reader: AvroSchema, writer: AvroSchema) -> None:
        self.reader = reader
        self.writer = writer
        self.problems: list[str] = []
        self._seen: set[tuple[str, str]] = set()

    def _fail(self, path: str, text: str) -> None:
        self.problems.append(f"{path or '(the record)'}: {text}")

    def check(self, reader_node: Any, writer_node: Any, path: str) -> bool:
        """Whether the reader node reads every value of the writer node; notes why not."""
        r = _node(self.reader, reader_node)
        w = _node(self.writer, writer_node)
        rk, wk = type_name(r), type_name(w)
        if wk == "union":
            ok = True
            for branch in w:
                ok = self.check(r, branch, path) and ok
            return ok
        if rk == "union":
            # Avro picks an exact match first, then a branch the writer's type promotes to.
            for exact in (True, False):
                for branch in r:
                    if self._matches(_node(self.reader, branch), w, exact):
                        return self.check(branch, w, path)
            self._fail(path, f"the reader's {_describe(r)} has no branch for {_describe(w)}")
            return False
        if rk in PRIMITIVES or wk in PRIMITIVES:
            if rk == wk or rk in _PROMOTIONS.get(wk, ()):
                return True
            self._fail(path, f"{_describe(w)} cannot be read as {_describe(r)}")
            return False
        if rk != wk:
            self._fail(path, f"{_describe(w)} cannot be read as {_describe(r)}")
            return False
        if rk in ("record", "enum", "fixed") and not _same_name(r, w):
            self._fail(path, f"{_describe(w)} cannot be read as {_describe(r)} (names differ)")
            return False
        if rk == "array":
            return self.check(r["items"], w["items"], path + "[]")
        if rk == "map":
            return self.check(r["values"], w["values"], path + "{}")
        if rk == "fixed":
            if r["size"] != w["size"]:
                self._fail(path, f"fixed size {w['size']} cannot be read as size {r['size']}")
                return False
            return True
        if rk == "enum":
            missing = [s for s in w["symbols"] if s not in r["symbols"]]
            if missing and "default" not in r:
                self._fail(
                    path,
                    f"enum {r['name']} lacks the writer's symbols {missing} and has no default",
                )
                return False
            return True
        return self._record(r, w, path)

    def _record(self, r: dict[str, Any], w: dict[str, Any], path: str) -> bool:
        pair = (r["name"], w["name"])
        if pair in self._seen:  # a recursive type: this pair is being checked further up
            return True
        self._seen.add(pair)
        writer_fields = {f["name"]: f for f in w["fields"]}
        ok = True
        for field in r["fields"]:
            where = f"{path}.{field['name']}" if path else field["name"]
            found = writer_fields.get(field["name"])
            if found is None:
                for alias in field.get("aliases", []):
                    found = writer_fields.get(alias)
                    if found is not None:
                        break
            if found is not None:
                ok = self.check(field["type"], found["type"], where) and ok
            elif "default" not in field:
                self._fail(where, "the reader's field has no default and the writer lacks it")
                ok = False
        return ok

    @staticmethod
    def _matches(r: Any, w: Any, exact: bool) -> bool:
        """Whether a (non-union) reader branch can be the one Avro picks for writer type ``w``."""
        rk, wk = type_name(r), type_name(w)
        if rk in ("record", "enum", "fixed") and rk == wk:
            return _same_name(r, w)
        if exact:
            return rk == wk
        return rk in PRIMITIVES and rk in _PROMOTIONS.get(wk, ())


def read_problems(reader: AvroSchema, writer: AvroSchema) -> list[str]:
    """Why ``reader`` cannot read data written with ``writer`` (empty: it can)."""
    resolution = _Resolution(reader, writer)
    resolution.check(reader.definition, writer.definition, "")
    return resolution.problems


def can_read(reader: AvroSchema, writer: AvroSchema) -> bool:
    return not read_problems(reader, writer)


def compatibility_problems(
    mode: Mode, new: AvroSchema, existing: Sequence[tuple[int, AvroSchema]]
) -> list[str]:
    """What breaks ``mode`` if ``new`` joins the versions ``existing`` ((version, schema))."""
    problems: list[str] = []
    if mode == "none":
        return problems
    for version, old in existing:
        if mode in ("backward", "full"):
            for p in read_problems(new, old):
                problems.append(f"the new schema cannot read version {version}: {p}")
        if mode in ("forward", "full"):
            for p in read_problems(old, new):
                problems.append(f"version {version} cannot read the new schema: {p}")
    return problems
