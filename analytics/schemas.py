"""Value schemas for typed reads: Spark DDL and JSON Schema in, Spark types out; inference from
sample values; the Spark -> Arrow schema mapping the data source's batches must match.

    load_value_schema("id INT, status STRING")          # StructType, no SparkSession needed
    load_value_schema("schemas/orders.json")             # a JSON Schema file (or a .ddl file)
    parse_ddl("array<struct<sku: string, qty: int>>")   # any one type, or a field list
    arrow_schema(struct_type)                            # what read() must yield, exactly

DDL (a pure-Python parser of the subset of Spark's DDL that JSON values can use; checked
against Spark's own parser in tests/analytics/test_typed.py):

    ddl      = type | field ("," field)*
    field    = name [":"] type ["NOT" "NULL"] ["COMMENT" 'text']
    name     = identifier | `back-quoted` (`` for a back quote)
    type     = boolean | tinyint | byte | smallint | short | int | integer | bigint | long
             | float | real | double | decimal | dec | numeric ["(" p ["," s] ")"]
             | string | char(n) | varchar(n) (both read as string) | binary
             | date | timestamp | timestamp_ltz | timestamp_ntz
             | array<type> | map<type, type> | struct<[field ("," field)*]>

Keywords are case-insensitive; field names keep their case. A comment lands in the field's
metadata as {"comment": ...}, as Spark's parser puts it.

JSON Schema (draft 2020-12, the subset that describes a record): "type" object (with
"properties"; "required" fields are NOT NULL, the others nullable), array (with "items"),
string (format "date-time" -> timestamp, "date" -> date), integer (-> bigint), number (->
double), boolean; "type": [T, "null"] (nullable even if required); "enum"/"const" without a
type (the type of their values); "$ref" to "#/$defs/..." or "#/definitions/...". Fields keep
the order of "properties". Anything else (other unions, "oneOf", an object without properties)
is a ValueError naming the place.

Inference (`infer_value_type`), close to Spark's JSON reader: integers -> bigint, other numbers
(and integers beyond 64 bits) -> double, strings -> string, booleans -> boolean, objects ->
struct with fields sorted by name, arrays -> array of their elements' type. Across the sample:
bigint and double -> double; objects merge their fields; arrays merge their elements; a field
null in every sample (or an array always empty) -> string; a field that is an empty object in
every sample is dropped. Where the sample holds different kinds at one place (a string here, a
number there), the kind most values have wins (a tie: string) and values of the other kinds
will not fit. Spark widens such conflicts to string and reads numbers and objects there as
their JSON text; pyarrow's JSON reader cannot, so a majority keeps one odd record from making
every other value unreadable.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable
from pathlib import Path

import pyarrow as pa
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    ByteType,
    DataType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    MapType,
    ShortType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
)

__all__ = [
    "arrow_schema",
    "check_json_type",
    "from_json_schema",
    "infer_value_type",
    "load_value_schema",
    "parse_ddl",
    "parse_value_type",
]

# ---------------------------------------------------------------------------------------------
# Spark -> Arrow


def arrow_schema(schema: StructType) -> pa.Schema:
    """The Arrow schema of a read's batches: exactly what Spark's Python data source worker
    compares them with (`to_arrow_schema(schema, timezone="UTC")`). The one place it is made."""
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(schema, timezone="UTC")


def check_json_type(data_type: DataType, where: str = "value") -> None:
    """Raise ValueError unless every part of `data_type` can be read from JSON here: booleans,
    integers, floats, decimals, strings, dates, timestamps, arrays and structs. Maps (pyarrow's
    JSON reader has no map conversion), binary (JSON has no bytes), NULL and intervals are not."""
    if isinstance(data_type, StructType):
        names = [f.name for f in data_type.fields]
        if not names:
            raise ValueError(f"eventlog: {where}: a struct needs at least one field")
        if len(set(names)) != len(names):
            raise ValueError(f"eventlog: {where}: duplicate field names in {data_type.simpleString()}")
        for f in data_type.fields:
            check_json_type(f.dataType, f"{where}.{f.name}")
    elif isinstance(data_type, ArrayType):
        check_json_type(data_type.elementType, f"{where}[]")
    elif isinstance(data_type, MapType):
        raise ValueError(f"eventlog: {where}: map types cannot be read from JSON here; use a struct")
    elif not isinstance(data_type, _JSON_LEAVES):
        raise ValueError(f"eventlog: {where}: {data_type.simpleString()} cannot be read from JSON")


_JSON_LEAVES = (BooleanType, ByteType, ShortType, IntegerType, LongType, FloatType, DoubleType,
                DecimalType, StringType, DateType, TimestampType, TimestampNTZType)

# ---------------------------------------------------------------------------------------------
# loading a value schema


def load_value_schema(source) -> StructType:
    """A record schema (StructType) from a Spark DDL string, a JSON Schema (a dict or its JSON
    text), or the path of a file holding either (a JSON Schema when the file's text starts
    with "{", else DDL; DDL files may hold `--` comment lines). ValueError if it is not a
    struct or not valid; no SparkSession needed."""
    data_type = parse_value_type(source)
    if not isinstance(data_type, StructType):
        raise ValueError(f"eventlog: a value schema must describe a record (struct); got {data_type.simpleString()}")
    return data_type


def parse_value_type(source) -> DataType:
    """Like load_value_schema, but any type (`array<int>` for values that are JSON arrays)."""
    if isinstance(source, dict):
        return from_json_schema(source)
    if isinstance(source, os.PathLike):
        return _parse_text(Path(source).read_text(encoding="utf-8"), str(source))
    text = str(source)
    stripped = text.strip()
    if not stripped:
        raise ValueError("eventlog: the value schema is empty")
    if not stripped.startswith("{") and "\n" not in stripped and len(stripped) < 4096:
        try:
            is_file = Path(stripped).is_file()
        except OSError:
            is_file = False
        if is_file:
            return _parse_text(Path(stripped).read_text(encoding="utf-8"), stripped)
    return _parse_text(text, None)


def _parse_text(text: str, path: str | None) -> DataType:
    where = f" ({path})" if path else ""
    if text.lstrip().startswith("{"):
        try:
            document = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"eventlog: JSON Schema{where} is not valid JSON: {exc}") from None
        return from_json_schema(document)
    lines = [line for line in text.splitlines() if not line.lstrip().startswith("--")]
    try:
        return parse_ddl(" ".join(lines))
    except ValueError as exc:
        raise ValueError(f"{exc}{where}") from None


# ---------------------------------------------------------------------------------------------
# DDL

_TOKEN = re.compile(
    r"\s*(?:(?P<quoted>`(?:[^`]|``)*`)|(?P<text>'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\")"
    r"|(?P<word>[A-Za-z_][A-Za-z0-9_]*|\d+)|(?P<punct>[<>(),:]))"
)
_SIMPLE = {
    "boolean": BooleanType, "tinyint": ByteType, "byte": ByteType, "smallint": ShortType,
    "short": ShortType, "int": IntegerType, "integer": IntegerType, "bigint": LongType,
    "long": LongType, "float": FloatType, "real": FloatType, "double": DoubleType,
    "string": StringType, "binary": BinaryType, "date": DateType, "timestamp": TimestampType,
    "timestamp_ltz": TimestampType, "timestamp_ntz": TimestampNTZType,
}


class _Tokens:
    def __init__(self, text: str) -> None:
        self.text = text
        self.items: list[tuple[str, str, int]] = []  # (kind, token, position)
        pos = 0
        while True:
            m = _TOKEN.match(text, pos)
            if m is None:
                if text[pos:].strip():
                    self.fail(f"unexpected {text[pos:].strip()[:20]!r}", pos + len(text[pos:]) - len(text[pos:].lstrip()))
                break
            kind = m.lastgroup
            self.items.append((kind, m.group(kind), m.start(kind)))
            pos = m.end()
        self.i = 0

    def fail(self, message: str, pos: int | None = None):
        if pos is None:
            pos = self.items[self.i][2] if self.i < len(self.items) else len(self.text)
        raise ValueError(f"eventlog: DDL {self.text!r}: {message} at position {pos}")

    def peek(self) -> str | None:
        return self.items[self.i][1] if self.i < len(self.items) else None

    def peek_word(self) -> str | None:
        if self.i < len(self.items) and self.items[self.i][0] == "word":
            return self.items[self.i][1].lower()
        return None

    def take(self) -> tuple[str, str]:
        if self.i >= len(self.items):
            self.fail("unexpected end")
        kind, token, _ = self.items[self.i]
        self.i += 1
        return kind, token

    def expect(self, token: str) -> None:
        if self.peek() != token:
            self.fail(f"expected {token!r}, found {self.peek()!r}")
        self.i += 1

    def accept(self, token: str) -> bool:
        if self.peek() == token:
            self.i += 1
            return True
        return False

    def done(self) -> bool:
        return self.i >= len(self.items)


def parse_ddl(text: str) -> DataType:
    """One Spark DDL type (`array<int>`) or a field list (`id INT, status STRING`, a
    StructType), as Spark's `_parse_datatype_string` reads them. ValueError on anything else."""
    tokens = _Tokens(text)
    if tokens.done():
        tokens.fail("empty")
    try:  # one type taking the whole text
        data_type = _type(tokens)
        if tokens.done():
            return data_type
    except ValueError:
        pass
    tokens.i = 0
    fields = _fields(tokens, end=None)
    if not tokens.done():
        tokens.fail(f"unexpected {tokens.peek()!r}")
    return StructType(fields)


def _fields(tokens: _Tokens, end: str | None) -> list[StructField]:
    fields = []
    if end is not None and tokens.peek() == end:
        return fields
    while True:
        kind, name = tokens.take()
        if kind == "quoted":
            name = name[1:-1].replace("``", "`")
        elif kind != "word":
            tokens.i -= 1
            tokens.fail(f"expected a field name, found {name!r}")
        tokens.accept(":")
        data_type = _type(tokens)
        nullable = True
        metadata = None
        while True:
            word = tokens.peek_word()
            if word == "not":
                tokens.i += 1
                if tokens.peek_word() != "null":
                    tokens.fail("expected NULL after NOT")
                tokens.i += 1
                nullable = False
            elif word == "comment":
                tokens.i += 1
                kind, literal = tokens.take()
                if kind != "text":
                    tokens.i -= 1
                    tokens.fail("expected a quoted comment")
                metadata = {"comment": _unquote(literal)}
            else:
                break
        fields.append(StructField(name, data_type, nullable, metadata))
        if not tokens.accept(","):
            return fields


def _unquote(literal: str) -> str:
    return re.sub(r"\\(.)", r"\1", literal[1:-1])


def _type(tokens: _Tokens) -> DataType:
    kind, token = tokens.take()
    word = token.lower()
    if kind != "word":
        tokens.i -= 1
        tokens.fail(f"expected a type, found {token!r}")
    if word in _SIMPLE:
        return _SIMPLE[word]()
    if word in ("decimal", "dec", "numeric"):
        precision, scale = 10, 0
        if tokens.accept("("):
            precision = _int(tokens)
            if tokens.accept(","):
                scale = _int(tokens)
            tokens.expect(")")
        if not (1 <= precision <= 38 and 0 <= scale <= precision):
            tokens.fail(f"decimal({precision}, {scale}) is out of range")
        return DecimalType(precision, scale)
    if word in ("char", "varchar", "character"):
        tokens.expect("(")
        _int(tokens)
        tokens.expect(")")
        return StringType()
    if word == "array":
        tokens.expect("<")
        element = _type(tokens)
        tokens.expect(">")
        return ArrayType(element, True)
    if word == "map":
        tokens.expect("<")
        key = _type(tokens)
        tokens.expect(",")
        value = _type(tokens)
        tokens.expect(">")
        return MapType(key, value, True)
    if word == "struct":
        tokens.expect("<")
        fields = _fields(tokens, end=">")
        tokens.expect(">")
        return StructType(fields)
    tokens.i -= 1
    tokens.fail(f"unknown or unsupported type {token!r}")


def _int(tokens: _Tokens) -> int:
    kind, token = tokens.take()
    if kind != "word" or not token.isdigit():
        tokens.i -= 1
        tokens.fail(f"expected a number, found {token!r}")
    return int(token)


# ---------------------------------------------------------------------------------------------
# JSON Schema


def from_json_schema(document: dict) -> StructType | DataType:
    """A Spark type from a JSON Schema document (the subset in the module docstring)."""
    if not isinstance(document, dict):
        raise ValueError("eventlog: a JSON Schema must be a JSON object")
    return _from_json_schema(document, document, "#", ())


def _from_json_schema(node, root: dict, where: str, refs: tuple[str, ...]) -> DataType:
    if not isinstance(node, dict):
        raise ValueError(f"eventlog: JSON Schema {where}: expected an object, got {node!r}")
    if "$ref" in node:
        ref = node["$ref"]
        if not isinstance(ref, str) or not ref.startswith("#/"):
            raise ValueError(f"eventlog: JSON Schema {where}: only local $ref ('#/$defs/...') is supported")
        if ref in refs:
            raise ValueError(f"eventlog: JSON Schema {where}: recursive $ref {ref} cannot be a Spark type")
        target = root
        for part in ref[2:].split("/"):
            part = part.replace("~1", "/").replace("~0", "~")
            if not isinstance(target, dict) or part not in target:
                raise ValueError(f"eventlog: JSON Schema {where}: $ref {ref} does not resolve")
            target = target[part]
        return _from_json_schema(target, root, ref, (*refs, ref))
    for unsupported in ("oneOf", "anyOf", "allOf", "not", "if", "patternProperties"):
        if unsupported in node:
            raise ValueError(f"eventlog: JSON Schema {where}: {unsupported!r} is not supported")
    kind = node.get("type")
    if isinstance(kind, list):
        kinds = [k for k in kind if k != "null"]
        if len(kinds) != 1:
            raise ValueError(f"eventlog: JSON Schema {where}: type {kind} is a union; only [T, \"null\"] is supported")
        kind = kinds[0]
    if kind is None:
        if "properties" in node:
            kind = "object"
        elif "items" in node:
            kind = "array"
        elif "enum" in node or "const" in node:
            values = node.get("enum", [node.get("const")])
            return _type_of_values(values, where)
        else:
            raise ValueError(f"eventlog: JSON Schema {where}: no type")
    if kind == "object":
        properties = node.get("properties")
        if not isinstance(properties, dict) or not properties:
            raise ValueError(f"eventlog: JSON Schema {where}: an object needs \"properties\" (maps are not supported)")
        required = set(node.get("required", []))
        fields = []
        for name, child in properties.items():
            data_type = _from_json_schema(child, root, f"{where}/properties/{name}", refs)
            nullable = name not in required or _allows_null(child, root)
            fields.append(StructField(name, data_type, nullable))
        return StructType(fields)
    if kind == "array":
        if "items" not in node or not isinstance(node["items"], dict):
            raise ValueError(f"eventlog: JSON Schema {where}: an array needs one \"items\" schema")
        return ArrayType(_from_json_schema(node["items"], root, f"{where}/items", refs), True)
    if kind == "string":
        return {"date-time": TimestampType, "date": DateType}.get(node.get("format"), StringType)()
    simple = {"integer": LongType, "number": DoubleType, "boolean": BooleanType}.get(kind)
    if simple is None:
        raise ValueError(f"eventlog: JSON Schema {where}: type {kind!r} is not supported")
    return simple()


def _allows_null(node, root: dict) -> bool:
    while isinstance(node, dict) and isinstance(node.get("$ref"), str) and node["$ref"].startswith("#/"):
        target = root
        for part in node["$ref"][2:].split("/"):
            target = target.get(part, {}) if isinstance(target, dict) else {}
        if target is node:
            break
        node = target
    kind = node.get("type") if isinstance(node, dict) else None
    return isinstance(kind, list) and "null" in kind


def _type_of_values(values, where: str) -> DataType:
    shape = _Shape()
    for value in values:
        shape.add(value)
    data_type = shape.resolve()
    if data_type is None or len(shape.counts) > 1:
        raise ValueError(f"eventlog: JSON Schema {where}: cannot tell one type from {values!r}")
    return data_type


# ---------------------------------------------------------------------------------------------
# inference


def infer_value_type(values: Iterable[bytes]) -> DataType | None:
    """The type of JSON values (module docstring). Values that are not UTF-8 JSON are skipped;
    the literal `null` adds nothing. None when nothing is left."""
    shape = _Shape()
    for raw in values:
        if raw is None:
            continue
        try:
            value = json.loads(raw)
        except (ValueError, RecursionError):  # JSONDecodeError and UnicodeDecodeError are ValueErrors
            continue
        shape.add(value)
    return shape.resolve()


class _Shape:
    """What the sampled values held at one place: how many of each JSON kind, and the shapes of
    array elements and object fields."""

    __slots__ = ("counts", "element", "fields", "double")

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        self.element: _Shape | None = None
        self.fields: dict[str, _Shape] | None = None
        self.double = False

    def add(self, value) -> None:
        if value is None:
            return
        if isinstance(value, bool):
            kind = "boolean"
        elif isinstance(value, int | float):
            kind = "number"
            if isinstance(value, float) or not -(1 << 63) <= value < (1 << 63):
                self.double = True
        elif isinstance(value, str):
            kind = "string"
        elif isinstance(value, list):
            kind = "array"
            if self.element is None:
                self.element = _Shape()
            for item in value:
                self.element.add(item)
        else:
            kind = "object"
            if self.fields is None:
                self.fields = {}
            for name, item in value.items():
                self.fields.setdefault(name, _Shape()).add(item)
        self.counts[kind] = self.counts.get(kind, 0) + 1

    def resolve(self) -> DataType | None:
        """The type; None when only nulls (or only empty objects) were seen here."""
        if not self.counts:
            return None
        kind = max(self.counts, key=lambda k: (self.counts[k], k == "string"))
        if kind == "boolean":
            return BooleanType()
        if kind == "number":
            return DoubleType() if self.double else LongType()
        if kind == "string":
            return StringType()
        if kind == "array":
            element = self.element.resolve()
            return ArrayType(StringType() if element is None else element, True)
        fields = []
        for name in sorted(self.fields):
            child = self.fields[name]
            data_type = child.resolve()
            if data_type is None:
                if child.counts:  # only empty objects: dropped, as Spark drops empty structs
                    continue
                data_type = StringType()  # only nulls
            fields.append(StructField(name, data_type, True))
        return StructType(fields) if fields else None
