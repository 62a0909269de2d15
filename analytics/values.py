"""Typed columns from the decoder's binary ones: JSON values, UTF-8 keys and header values.

`RowFormat.convert(batch)` turns a decoder batch (analytics.decoder.ARROW_SCHEMA) into a batch
of the read's Arrow schema (`RowFormat.schema`, built by analytics.schemas.arrow_schema from
the Spark schema, so it matches what Spark checks exactly). No pyspark here; pyarrow + numpy,
and no per-record Python except on the rows that fail.

JSON values (`decode_json`), vectorised:

1. Invalid UTF-8 fails the row (one C++ validation of the whole column; the failing rows are
   then found one by one). The literal `null` (any surrounding whitespace) is a null value,
   not an error; a tombstone (null value) stays null.
2. For a struct type each value must be a JSON object (`^\\s*\\{`, a C++ regex over the
   column; anything else fails the row); the values are joined with newlines, raw CR/LF bytes
   inside them turned into spaces (JSON allows them only between tokens), and read by ONE
   `pyarrow.json.read_json` call with the struct as its explicit schema (fields the schema
   does not name are ignored, missing fields are null). Other types (arrays, numbers, strings)
   are wrapped as `{"v": <value>}` first. Dates are read as strings and cast after.
3. When that call fails, or yields more rows than lines (`{..}{..}` on one line), the rows are
   bisected: each half is read again until the failing single rows are found (a bad row costs
   about 2 * log2(rows) reads, the good rows still decode in bulk). After _BISECT_READS reads
   the rest goes through Python's json first, which sets aside the rows that surely fail (its
   parser accepts all pyarrow's does), and the remaining rows are read in bulk (bisected again
   only for what Python cannot judge: duplicate keys, decimals, timestamps). So a batch with a
   few bad values costs 2-3 bulk reads, one with many about a Python json.loads per value.

A row "fails" when its value is not UTF-8, not one JSON document, or does not fit the type:
a string where a number is expected (pyarrow never turns numbers or objects into text, unlike
Spark's reader, so a type widened to string does not accept them), an integer out of range, a
fraction for an integer or beyond a decimal's scale, a timestamp or date string pyarrow cannot
parse (ISO 8601; numbers are not timestamps), a NOT NULL field missing or null. `mode` says
what then happens, as in Spark's JSON reader: PERMISSIVE (default) nulls the value and puts the
raw value bytes in the corrupt-record column when the read has one; DROPMALFORMED drops the
row; FAILFAST raises MalformedRecordError naming topic, partition, offset and the reason.

Keys and header values as strings (`decode_utf8`): UTF-8 text as is; anything else fails the
row under the same `mode`, except that PERMISSIVE nulls just that key or header value (the
corrupt-record column is for values only). Header keys are always strings (the decoder's).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj

__all__ = [
    "DROPMALFORMED",
    "FAILFAST",
    "MODES",
    "PERMISSIVE",
    "MalformedRecordError",
    "RowFormat",
    "decode_json",
    "decode_utf8",
]

PERMISSIVE = "PERMISSIVE"
DROPMALFORMED = "DROPMALFORMED"
FAILFAST = "FAILFAST"
MODES = (PERMISSIVE, DROPMALFORMED, FAILFAST)

# where each output column comes from
SOURCES = ("topic", "partition", "offset", "timestamp", "key", "value", "headers", "corrupt")
VALUE_FORMATS = ("binary", "string", "json")

_MIN_BLOCK = 1 << 20
_SINGLES = 8  # a failing piece this small is read line by line
_BISECT_READS = 48  # then the rest of a failing batch goes through Python's json first


class MalformedRecordError(Exception):
    """Raised in FAILFAST mode when a record's value, key or header value does not decode."""

    def __init__(self, topic: str, partition: int, offset: int, column: str, reason: str) -> None:
        super().__init__(f"{topic}-{partition} offset {offset}: {column}: {reason} (mode FAILFAST; "
                         "PERMISSIVE or DROPMALFORMED keep reading)")
        self.topic = topic
        self.partition = partition
        self.offset = offset
        self.column = column
        self.reason = reason

    def __reduce__(self):  # picklable across Spark's worker boundary
        return (type(self), (self.topic, self.partition, self.offset, self.column, self.reason))


@dataclass(frozen=True)
class RowFormat:
    """How a read turns decoder batches into its schema: `sources[i]` feeds `schema[i]`
    (one of SOURCES); key/header values become strings where the schema says string."""

    schema: pa.Schema
    sources: tuple[str, ...]
    value_format: str = "binary"
    mode: str = PERMISSIVE

    def __post_init__(self) -> None:
        if len(self.sources) != len(self.schema) or not set(self.sources) <= set(SOURCES):
            raise ValueError(f"sources {self.sources} do not fit {self.schema.names}")
        if self.value_format not in VALUE_FORMATS or self.mode not in MODES:
            raise ValueError(f"value_format {self.value_format!r} / mode {self.mode!r}")

    def is_identity(self, decoder_schema: pa.Schema) -> bool:
        return self.schema.equals(decoder_schema) and self.sources == SOURCES[:7]

    def convert(self, batch: pa.RecordBatch) -> pa.RecordBatch | None:
        """The batch in this format; None when every row was dropped (DROPMALFORMED)."""
        n = batch.num_rows
        failures: list[tuple[np.ndarray, str, dict[int, str]]] = []  # (rows, column, reasons)
        value_bad = None
        columns: list[pa.Array | None] = []
        corrupt_at = None
        for i, (field, source) in enumerate(zip(self.schema, self.sources)):
            if source == "corrupt":
                columns.append(None)
                corrupt_at = i
                continue
            column = batch.column(source)
            if source == "key" and pa.types.is_string(field.type):
                column, bad = decode_utf8(column)
                if bad is not None:
                    failures.append((bad, "key", dict.fromkeys(np.flatnonzero(bad).tolist(), "not valid UTF-8")))
            elif source == "value" and self.value_format == "string":
                column, bad = decode_utf8(column)
                value_bad = bad
                if bad is not None:
                    failures.append((bad, "value", dict.fromkeys(np.flatnonzero(bad).tolist(), "not valid UTF-8")))
            elif source == "value" and self.value_format == "json":
                column, bad, reasons = decode_json(column, field.type)
                if reasons:
                    value_bad = bad
                    failures.append((bad, "value", reasons))
            elif source == "headers" and column.type != field.type:
                column, bad, reasons = _headers_as_strings(column, field.type)
                if bad is not None:
                    failures.append((bad, "headers", reasons))
            columns.append(column)
        if corrupt_at is not None:
            columns[corrupt_at] = _corrupt_column(batch.column("value"), value_bad, self.schema.field(corrupt_at).type)
        out = pa.RecordBatch.from_arrays(columns, schema=self.schema)
        if not failures:
            return out
        any_bad = np.zeros(n, dtype=bool)
        for bad, _, _ in failures:
            any_bad |= bad
        if not any_bad.any():
            return out
        if self.mode == FAILFAST:
            row = int(np.flatnonzero(any_bad)[0])
            column, reason = next((c, r[row]) for bad, c, r in failures if bad[row])
            raise MalformedRecordError(batch.column("topic")[row].as_py(), batch.column("partition")[row].as_py(),
                                       batch.column("offset")[row].as_py(), column, reason)
        if self.mode == DROPMALFORMED:
            if any_bad.all():
                return None
            return out.filter(pa.array(~any_bad))
        return out


# ---------------------------------------------------------------------------------------------
# UTF-8


def decode_utf8(values: pa.Array) -> tuple[pa.Array, np.ndarray | None]:
    """(string array, rows that are not UTF-8 or None): invalid rows become null."""
    try:
        return values.cast(pa.string()), None
    except pa.ArrowInvalid:
        pass
    bad = np.zeros(len(values), dtype=bool)
    out = []
    for i, raw in enumerate(values.to_pylist()):
        if raw is None:
            out.append(None)
            continue
        try:
            out.append(raw.decode("utf-8"))
        except UnicodeDecodeError:
            out.append(None)
            bad[i] = True
    return pa.array(out, pa.string()), bad


def _headers_as_strings(headers: pa.ListArray, target: pa.DataType):
    """list<struct<key: string, value: binary>> -> the target's list<struct<key, value: string>>;
    (array, rows with a non-UTF-8 header value or None, reasons)."""
    n = len(headers)
    flat = headers.flatten()
    keys = flat.field("key")
    strings, bad_elements = decode_utf8(flat.field("value"))
    element = target.value_type
    struct = pa.StructArray.from_arrays([keys, strings], fields=list(element))
    lengths = pc.fill_null(pc.list_value_length(headers), 0).to_numpy(zero_copy_only=False)
    offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    mask = headers.is_null() if headers.null_count else None
    out = pa.ListArray.from_arrays(pa.array(offsets), struct, type=target, mask=mask)
    if bad_elements is None:
        return out, None, {}
    parents = pc.list_parent_indices(headers).to_numpy()
    bad = np.zeros(n, dtype=bool)
    reasons: dict[int, str] = {}
    for e in np.flatnonzero(bad_elements).tolist():
        row = int(parents[e])
        bad[row] = True
        reasons.setdefault(row, f"header {keys[e].as_py()!r}: value is not valid UTF-8")
    return out, bad, reasons


def _corrupt_column(raw: pa.Array, bad: np.ndarray | None, target: pa.DataType) -> pa.Array:
    """Raw value bytes where the value failed, else null (a string column: UTF-8 with U+FFFD)."""
    n = len(raw)
    if bad is None or not bad.any():
        return pa.nulls(n, target)
    rows = np.flatnonzero(bad)
    if pa.types.is_binary(target):
        positions = np.full(n, -1, dtype=np.int64)
        positions[rows] = rows
        return raw.take(pa.array(positions, mask=positions < 0))
    out: list[str | None] = [None] * n
    for row in rows.tolist():
        out[row] = raw[row].as_py().decode("utf-8", "replace")
    return pa.array(out, target)


# ---------------------------------------------------------------------------------------------
# JSON


def decode_json(values: pa.Array, target: pa.DataType) -> tuple[pa.Array, np.ndarray, dict[int, str]]:
    """(array of `target`, rows that failed, {row: reason}) for binary JSON `values` (module
    docstring). Null values and the literal `null` give null, and never fail."""
    n = len(values)
    bad = np.zeros(n, dtype=bool)
    reasons: dict[int, str] = {}
    if n == 0 or values.null_count == n:
        return pa.nulls(n, target), bad, reasons
    _, not_utf8 = decode_utf8(values)
    if not_utf8 is not None:
        bad |= not_utf8
        reasons.update(dict.fromkeys(np.flatnonzero(not_utf8).tolist(), "not valid UTF-8"))
    candidates = _mask(values.is_valid()) & ~bad
    objects = _mask(pc.starts_with(values, "{"))
    others = np.flatnonzero(candidates & ~objects)  # regexes only for values not opening with "{"
    if others.size:
        rest = values.take(pa.array(others))
        candidates[others[_mask(pc.match_substring_regex(rest, r"^\s*null\s*$"))]] = False
        objects[others[_mask(pc.match_substring_regex(rest, r"^\s*\{"))]] = True
    is_struct = pa.types.is_struct(target)
    if is_struct:
        not_object = candidates & ~objects
        if not_object.any():
            bad |= not_object
            reasons.update(dict.fromkeys(np.flatnonzero(not_object).tolist(), "not a JSON object"))
            candidates &= objects
    rows = np.flatnonzero(candidates)
    if rows.size == 0:
        return pa.nulls(n, target), bad, reasons
    reader = _Reader(_reader_type(target), wrapped=not is_struct)
    pieces, failed = reader.read_all(values, rows, target)
    for row, reason in failed:
        bad[row] = True
        reasons[row] = reason
    if not pieces:
        return pa.nulls(n, target), bad, reasons
    good = np.concatenate([r for r, _ in pieces])
    parsed = pa.concat_arrays([a for _, a in pieces])
    parsed, unfit = _restore(parsed, target)
    if unfit is not None and unfit.any():
        for row in good[unfit].tolist():
            bad[row] = True
            reasons[row] = "a date does not parse"
        keep = ~unfit
        good = good[keep]
        parsed = parsed.filter(pa.array(keep))
    positions = np.full(n, -1, dtype=np.int64)
    positions[good] = np.arange(good.size)
    return parsed.take(pa.array(positions, mask=positions < 0)), bad, reasons


def _mask(array: pa.Array) -> np.ndarray:
    return pc.fill_null(array, False).to_numpy(zero_copy_only=False)


class _Reader:
    """pyarrow.json.read_json over chosen rows of a binary column, bisecting on failure."""

    def __init__(self, reader_type: pa.DataType, wrapped: bool) -> None:
        self.wrapped = wrapped
        self.reader_type = reader_type
        fields = [pa.field("v", reader_type)] if wrapped else list(reader_type)
        self.fields = fields
        # wrapped values: an unknown top-level field means the value ran on past its end
        # (`1, "x": 2`); with structs inside, unknown nested fields must be ignored instead
        strict = wrapped and not _has_struct(reader_type)
        self.parse_options = pj.ParseOptions(explicit_schema=pa.schema(fields),
                                             unexpected_field_behavior="error" if strict else "ignore")

    def read_all(self, values: pa.Array, rows: np.ndarray, target: pa.DataType):
        """([(rows, array)], [(row, reason)]): one bulk read; when it fails, bisection (a few
        bad rows cost about 2 * log2(rows) reads each) up to _BISECT_READS reads; what is still
        unresolved then goes through Python's json, which finds the rows that surely fail (not
        JSON, or a definite misfit: `_misfit`) without pyarrow, and bisection again for the
        rest (duplicate keys, a timestamp or decimal pyarrow does not take)."""
        result = self.read(values, rows)
        if not isinstance(result, str):
            return [(rows, result)], []
        if rows.size == 1:
            return [], [(int(rows[0]), result)]
        half = rows.size // 2
        pieces, failed, pending = self._bisect(values, [rows[half:], rows[:half]], _BISECT_READS)
        for part in pending:
            keep = []
            for row, raw in zip(part.tolist(), values.take(pa.array(part)).to_pylist()):
                reason = _python_check(raw, target)
                if reason is None:
                    keep.append(row)
                else:
                    failed.append((row, reason))
            more_pieces, more_failed, _ = self._bisect(values, [np.array(keep, dtype=np.int64)], None)
            pieces += more_pieces
            failed += more_failed
        # pyarrow's message for a row bisection found, unless Python's json says it better
        failed = [(row, _python_check(values[row].as_py(), target) or reason) for row, reason in failed]
        return pieces, failed

    def _bisect(self, values: pa.Array, stack: list[np.ndarray], budget: int | None):
        """(pieces, failed, parts left when `budget` reads are spent); depth first."""
        pieces: list[tuple[np.ndarray, pa.Array]] = []
        failed: list[tuple[int, str]] = []
        stack = [part for part in stack if part.size]
        while stack:
            if budget is not None:
                if budget == 0:
                    return pieces, failed, stack
                budget -= 1
            part = stack.pop()
            result = self.read(values, part)
            if not isinstance(result, str):
                pieces.append((part, result))
            elif part.size == 1:
                failed.append((int(part[0]), result))
            elif part.size <= _SINGLES:
                stack.extend(part[i : i + 1] for i in range(part.size - 1, -1, -1))
            else:
                half = part.size // 2
                stack.append(part[half:])
                stack.append(part[:half])
        return pieces, failed, []

    def read(self, values: pa.Array, rows: np.ndarray) -> pa.Array | str:
        """The parsed rows, or why they did not parse."""
        lines = values if rows.size == len(values) else values.take(pa.array(rows))  # rows ascend
        buffer, longest = _join(lines, self.wrapped)
        block = max(_MIN_BLOCK, 2 * longest + 64)
        try:
            table = pj.read_json(pa.BufferReader(buffer), read_options=pj.ReadOptions(block_size=block),
                                 parse_options=self.parse_options)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, ValueError) as exc:
            return re.sub(r"\s+in row \d+$", "", str(exc).strip())
        if table.num_rows != rows.size:
            return "more than one JSON document"
        columns = [table.column(i).combine_chunks() for i in range(table.num_columns)]
        if self.wrapped:
            return columns[0]
        # the reader's nested types may lose NOT NULL flags: names only here, _restore conforms
        return pa.StructArray.from_arrays(columns, names=[f.name for f in self.fields])


_NEWLINES_TO_SPACES = bytes.maketrans(b"\r\n", b"  ")


def _python_check(raw: bytes, target: pa.DataType) -> str | None:
    """Why `raw` surely fails to read as `target`, or None (it may still fail in pyarrow).
    Python's json rejects nothing pyarrow's parser accepts (both RFC 8259 plus NaN; CR/LF
    become spaces as in the bulk read), so its errors are final."""
    try:
        value = json.loads(raw.translate(_NEWLINES_TO_SPACES))
    except RecursionError:
        return None
    except ValueError as exc:
        return f"not valid JSON: {exc}"
    return _misfit(value, target, "value")


def _misfit(value, data_type: pa.DataType, where: str) -> str | None:
    """A definite mismatch between a parsed JSON value and an Arrow type (None: fits, or
    pyarrow must judge: decimals, timestamp and date strings)."""
    if value is None:
        return None
    t = pa.types
    if t.is_struct(data_type):
        if not isinstance(value, dict):
            return f"{where}: expected an object"
        for field in data_type:
            child = value.get(field.name)
            if child is None:
                if not field.nullable:
                    return f"{where}.{field.name}: missing or null, but NOT NULL"
                continue
            reason = _misfit(child, field.type, f"{where}.{field.name}")
            if reason:
                return reason
        return None
    if t.is_list(data_type):
        if not isinstance(value, list):
            return f"{where}: expected an array"
        nullable = data_type.value_field.nullable
        for i, item in enumerate(value):
            if item is None and not nullable:
                return f"{where}[{i}]: null, but the elements are NOT NULL"
            reason = _misfit(item, data_type.value_type, f"{where}[{i}]")
            if reason:
                return reason
        return None
    if isinstance(value, bool):
        return None if t.is_boolean(data_type) else f"{where}: true/false where {data_type} is expected"
    if t.is_boolean(data_type):
        return f"{where}: expected true or false"
    if t.is_integer(data_type):
        if not isinstance(value, int):
            return f"{where}: expected an integer ({data_type})"
        info = np.iinfo(data_type.to_pandas_dtype())
        return None if info.min <= value <= info.max else f"{where}: {value} is out of range for {data_type}"
    if t.is_floating(data_type):
        return None if isinstance(value, int | float) else f"{where}: expected a number"
    if t.is_string(data_type) or t.is_timestamp(data_type) or t.is_date(data_type):
        return None if isinstance(value, str) else f"{where}: expected a string ({data_type})"
    if t.is_decimal(data_type):
        return None if isinstance(value, int | float | str) else f"{where}: expected a number"
    return None


def _join(lines: pa.Array, wrapped: bool) -> tuple[pa.Buffer, int]:
    """The lines as one newline-separated buffer, and the longest line's length."""
    if wrapped:
        joined = pc.binary_join_element_wise(b'{"v":', lines, b"}\n", b"")
    else:
        joined = pc.binary_join_element_wise(lines, b"\n", b"")
    offsets = np.frombuffer(joined.buffers()[1], dtype=np.int32, count=len(joined) + 1, offset=4 * joined.offset)
    start, end = int(offsets[0]), int(offsets[-1])
    longest = int(np.diff(offsets).max())
    data = joined.buffers()[2]
    u8 = np.frombuffer(data, dtype=np.uint8, count=end)[start:]
    if np.count_nonzero(u8 == 10) != len(lines) or np.count_nonzero(u8 == 13):  # CR/LF inside values
        u8 = u8.copy()
        u8[(u8 == 10) | (u8 == 13)] = 32
        u8[offsets[1:] - 1 - start] = 10
        return pa.py_buffer(u8), longest
    return data.slice(start, end - start), longest


def _has_struct(data_type: pa.DataType) -> bool:
    if pa.types.is_struct(data_type):
        return True
    if pa.types.is_list(data_type):
        return _has_struct(data_type.value_type)
    return False


def _reader_type(target: pa.DataType) -> pa.DataType:
    """What pyarrow's JSON reader is asked for: the target with dates read as strings."""
    if pa.types.is_date32(target):
        return pa.string()
    if pa.types.is_struct(target):
        return pa.struct([f.with_type(_reader_type(f.type)) for f in target])
    if pa.types.is_list(target):
        return pa.list_(target.value_field.with_type(_reader_type(target.value_type)))
    return target


def _restore(array: pa.Array, target: pa.DataType) -> tuple[pa.Array, np.ndarray | None]:
    """The reader's array as exactly `target` (strings cast to dates, nested fields' NOT NULL
    flags put back); rows whose dates do not parse are marked (and their dates null)."""
    if array.type == target:
        return array, None
    if pa.types.is_date32(target):
        try:
            return array.cast(target), None
        except pa.ArrowInvalid:
            pass
        bad = np.zeros(len(array), dtype=bool)
        out = []
        for i, text in enumerate(array.to_pylist()):
            try:
                out.append(None if text is None else pa.scalar(text).cast(target).as_py())
            except pa.ArrowInvalid:
                out.append(None)
                bad[i] = True
        return pa.array(out, target), bad
    mask = array.is_null() if array.null_count else None
    if pa.types.is_struct(target):
        children, bad = [], None
        for i, field in enumerate(target):
            child, child_bad = _restore(array.field(i), field.type)
            children.append(child)
            if child_bad is not None:
                bad = child_bad if bad is None else bad | child_bad
        return pa.StructArray.from_arrays(children, fields=list(target), mask=mask), bad
    if pa.types.is_list(target):
        values, values_bad = _restore(array.flatten(), target.value_type)
        lengths = pc.fill_null(pc.list_value_length(array), 0).to_numpy(zero_copy_only=False)
        offsets = np.zeros(len(array) + 1, dtype=np.int32)
        np.cumsum(lengths, out=offsets[1:])
        out = pa.ListArray.from_arrays(pa.array(offsets), values, type=target, mask=mask)
        if values_bad is None:
            return out, None
        bad = np.zeros(len(array), dtype=bool)
        bad[pc.list_parent_indices(array).to_numpy()[values_bad]] = True
        return out, bad
    return array.cast(target), None
