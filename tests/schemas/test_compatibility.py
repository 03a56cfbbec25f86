"""Avro's schema resolution rules as the registry enforces them, each on a real pair of schemas,
and the JSON-lines check of structured records."""

from __future__ import annotations

from typing import Any

import pytest

from schema_registry import (
    BadRecord,
    InvalidSchema,
    compatibility_problems,
    parse,
    read_problems,
    record_of,
)


def record(*fields: dict[str, Any], name: str = "Event", **extra: Any) -> dict[str, Any]:
    return {"type": "record", "name": name, "namespace": "shop", "fields": list(fields), **extra}


def field(name: str, type_: Any, **extra: Any) -> dict[str, Any]:
    return {"name": name, "type": type_, **extra}


def problems(reader: dict[str, Any], writer: dict[str, Any]) -> list[str]:
    return read_problems(parse(reader), parse(writer))


V1 = record(field("id", "long"), field("path", "string"))


def test_a_field_added_with_a_default_is_backward_and_forward_compatible() -> None:
    v2 = record(field("id", "long"), field("path", "string"), field("status", "int", default=200))
    assert problems(reader=v2, writer=V1) == []  # backward: the default fills it in
    assert problems(reader=V1, writer=v2) == []  # forward: the old reader skips it


def test_a_field_added_without_a_default_breaks_backward_compatibility_only() -> None:
    v2 = record(field("id", "long"), field("path", "string"), field("status", "int"))
    assert problems(reader=v2, writer=V1) == [
        "status: the reader's field has no default and the writer lacks it"
    ]
    assert problems(reader=V1, writer=v2) == []


def test_a_removed_field_breaks_forward_compatibility_unless_it_had_a_default() -> None:
    v2 = record(field("id", "long"))
    assert problems(reader=v2, writer=V1) == []
    assert problems(reader=V1, writer=v2) == [
        "path: the reader's field has no default and the writer lacks it"
    ]
    with_default = record(field("id", "long"), field("path", "string", default="/"))
    assert problems(reader=with_default, writer=v2) == []


@pytest.mark.parametrize(
    ("writer", "reader"),
    [
        ("int", "long"),
        ("int", "float"),
        ("int", "double"),
        ("long", "float"),
        ("long", "double"),
        ("float", "double"),
        ("string", "bytes"),
        ("bytes", "string"),
    ],
)
def test_a_promotion_reads_the_narrower_type(writer: str, reader: str) -> None:
    assert problems(record(field("x", reader)), record(field("x", writer))) == []


@pytest.mark.parametrize(
    ("writer", "reader"),
    [
        ("long", "int"),
        ("double", "float"),
        ("float", "long"),
        ("string", "int"),
        ("int", "boolean"),
    ],
)
def test_a_narrowing_or_unrelated_type_is_refused(writer: str, reader: str) -> None:
    assert problems(record(field("x", reader)), record(field("x", writer))) == [
        f"x: {writer} cannot be read as {reader}"
    ]


def enum(*symbols: str, **extra: Any) -> dict[str, Any]:
    return {"type": "enum", "name": "Color", "symbols": list(symbols), **extra}


def test_an_enum_may_gain_symbols_for_new_readers_but_old_readers_need_a_default() -> None:
    old = record(field("c", enum("RED", "GREEN")))
    new = record(field("c", enum("RED", "GREEN", "BLUE")))
    assert problems(reader=new, writer=old) == []
    assert problems(reader=old, writer=new) == [
        "c: enum shop.Color lacks the writer's symbols ['BLUE'] and has no default"
    ]
    old_with_default = record(field("c", enum("RED", "GREEN", default="RED")))
    assert problems(reader=old_with_default, writer=new) == []


def test_a_union_reader_takes_any_branch_and_a_union_writer_needs_every_branch_read() -> None:
    plain = record(field("user", "string"))
    optional = record(field("user", ["null", "string"], default=None))
    assert problems(reader=optional, writer=plain) == []
    assert problems(reader=plain, writer=optional) == ["user: null cannot be read as string"]
    # a branch is found through a promotion too: int is read by ["null", "long"]
    assert problems(record(field("n", ["null", "long"])), record(field("n", "int"))) == []
    assert problems(record(field("n", ["null", "long"])), record(field("n", ["null", "int"]))) == []
    assert problems(record(field("n", ["null", "string"])), record(field("n", "int"))) == [
        "n: the reader's union [null, string] has no branch for int"
    ]


def address(*fields: dict[str, Any]) -> dict[str, Any]:
    return {"type": "record", "name": "Address", "fields": list(fields)}


def test_nested_records_are_resolved_field_by_field_with_their_path() -> None:
    old = record(field("to", address(field("city", "string"))))
    added = record(field("to", address(field("city", "string"), field("zip", "string"))))
    assert problems(reader=added, writer=old) == [
        "to.zip: the reader's field has no default and the writer lacks it"
    ]
    promoted = record(
        field("to", address(field("city", "bytes"), field("zip", "string", default="")))
    )
    assert problems(reader=promoted, writer=old) == []


def test_records_of_another_name_do_not_resolve_unless_the_reader_aliases_it() -> None:
    renamed = record(field("id", "long"), field("path", "string"), name="Hit")
    assert problems(reader=renamed, writer=V1) == [
        "(the record): record shop.Event cannot be read as record shop.Hit (names differ)"
    ]
    aliased = record(field("id", "long"), field("path", "string"), name="Hit", aliases=["Event"])
    assert problems(reader=aliased, writer=V1) == []


def test_arrays_maps_and_fixed_resolve_their_items_values_and_size() -> None:
    assert (
        problems(
            record(field("a", {"type": "array", "items": "double"})),
            record(field("a", {"type": "array", "items": "int"})),
        )
        == []
    )
    assert problems(
        record(field("m", {"type": "map", "values": "int"})),
        record(field("m", {"type": "map", "values": "long"})),
    ) == ["m{}: long cannot be read as int"]
    assert problems(
        record(field("h", {"type": "fixed", "name": "Hash", "size": 16})),
        record(field("h", {"type": "fixed", "name": "Hash", "size": 32})),
    ) == ["h: fixed size 32 cannot be read as size 16"]


def test_a_recursive_record_resolves_without_looping() -> None:
    node = {"type": "record", "name": "Node", "fields": [field("next", ["null", "Node"])]}
    assert problems(record(field("head", node)), record(field("head", node))) == []


def test_modes_check_the_new_schema_against_every_registered_version() -> None:
    v1 = parse(record(field("id", "long")))
    v2 = parse(record(field("id", "long"), field("tag", "string", default="")))
    v3 = parse(record(field("id", "long"), field("tag", "string")))
    existing = [(1, v1), (2, v2)]
    # v3 reads v2's data (tag is there) but not v1's: backward is checked transitively
    assert compatibility_problems("backward", v3, existing) == [
        "the new schema cannot read version 1: tag: the reader's field has no default and "
        "the writer lacks it"
    ]
    assert compatibility_problems("forward", v3, existing) == []
    assert len(compatibility_problems("full", v3, existing)) == 1
    assert compatibility_problems("none", v3, existing) == []
    dropped = parse(record(field("tag", "string", default="")))
    assert compatibility_problems("forward", dropped, existing) == [
        "version 1 cannot read the new schema: id: the reader's field has no default and the "
        "writer lacks it",
        "version 2 cannot read the new schema: id: the reader's field has no default and the "
        "writer lacks it",
    ]


@pytest.mark.parametrize(
    ("schema", "reason"),
    [
        ("{not json", "not JSON"),
        ({"type": "enum", "name": "E", "symbols": ["a"]}, "Avro record"),
        (record(field("x", "int", default="zero")), "Default value"),
        (record(field("x", "nosuchtype")), "not a valid Avro schema"),
        (record(field("c", enum("A", "A"))), "unique"),
    ],
)
def test_a_schema_avro_rejects_is_refused_with_its_reason(schema: Any, reason: str) -> None:
    with pytest.raises(InvalidSchema, match=reason):
        parse(schema)


def test_the_schema_id_ignores_docs_and_whitespace_but_not_defaults() -> None:
    a = parse(record(field("x", "int")))
    assert parse(record(field("x", "int", doc="the x"))).schema_id == a.schema_id
    assert (
        parse(
            ' {"type":"record","name":"Event","namespace":"shop",'
            '"fields":[{"name":"x","type":"int"}]}'
        ).schema_id
        == a.schema_id
    )
    assert parse(record(field("x", "int", default=0))).schema_id != a.schema_id
    assert len(a.id_hex) == 16


ORDER = parse(
    record(
        field("id", "long"),
        field("amount", "double"),
        field("currency", enum("EUR", "USD"), default="EUR"),
        field("note", ["null", "string"], default=None),
        field("tags", {"type": "array", "items": "string"}, default=[]),
        field("to", address(field("city", "string"), field("zip", "int"))),
        name="Order",
    )
)


def test_a_json_line_becomes_a_record_with_defaults_filled_in() -> None:
    line = b'{"id": 7, "amount": 3, "to": {"city": "Oslo", "zip": 150}}'
    assert record_of(ORDER, line) == {
        "id": 7,
        "amount": 3.0,
        "currency": "EUR",
        "note": None,
        "tags": [],
        "to": {"city": "Oslo", "zip": 150},
    }


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        (b'{"id": 1, "amount": 1}', "to: missing, and the schema gives it no default"),
        (b"[1, 2]", "a record is a JSON object, not a list"),
        (b'{"id": 1', "not JSON"),
        (b'{"id": "1", "amount": 1, "to": {}}', 'id: expected long, got a string "1"'),
        (
            b'{"id": 1, "amount": 1, "to": {"city": "Oslo", "zip": 99999999999}}',
            "to.zip: 99999999999 is outside the range of int",
        ),
        (
            b'{"id": 1, "amount": 1, "currency": "GBP", "to": {"city": "x", "zip": 1}}',
            'currency: "GBP" is not a symbol of enum shop.Color',
        ),
        (
            b'{"id": 1, "amount": 1, "note": 5, "to": {"city": "x", "zip": 1}}',
            "note: 5 fits no type of the union [null, string]",
        ),
        (
            b'{"id": 1, "amount": 1, "tags": ["a", 2], "to": {"city": "x", "zip": 1}}',
            "tags[1]: expected string, got an integer 2",
        ),
        (
            b'{"id": 1, "amount": 1, "to": {"city": "x", "zip": 1}, "extra": true}',
            "key 'extra' is not a field of record shop.Order",
        ),
        (b'{"id": true, "amount": 1, "to": {"city": "x", "zip": 1}}', "id: expected long"),
    ],
)
def test_a_line_that_is_not_a_record_is_refused_naming_the_field(line: bytes, reason: str) -> None:
    with pytest.raises(BadRecord) as refused:
        record_of(ORDER, line)
    assert reason in str(refused.value)
