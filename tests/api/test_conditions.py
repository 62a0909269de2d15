"""Conditional appends over HTTP (api/conditions.py): the one ETag grammar every If-Match and
If-None-Match is read with, the typed conditions it gives the engine, and the 409 / 412 choice."""

from __future__ import annotations

import httpx
import pytest

from api import conditions, keys, lane, records
from api.conditions import ANY, key_condition, parse_etag, partition_condition, refused
from api.errors import ApiError
from engine.conditions import ExpectedOffset, KeyAt, KeyHasRecords, KeyIsNew
from engine.errors import ConditionConflictError, InvalidFieldError, OffsetMismatchError

from ..kafka_oracle import build_batch
from .test_api import RAW, assert_problem

TAKEN = [
    ('"42"', 42), ("42", 42), ('W/"42"', 42), ("W/42", 42), ('"0"', 0), ("007", 7),
    ('"-1"', -1), ("-1", -1), ('W/"-1"', -1), ("*", ANY),
    (' "42" ', 42), ('\t W/"42"\t', 42), (" * ", ANY), ("9" * 20, int("9" * 20)),
]
REFUSED = [
    "", " ", '""', '"', '"42', '42"', "'42'", '" 42"', '"42 "', 'w/"42"', 'W/ "42"', "W/",
    'W/"*"', '"*"', "W/*", "-2", "-01", "+1", "-0", "1.0", "1e3", "x", "nope", '"1", "2"',
    '"1","2"', "4 2", "٤٢", '"٤٢"',
]


@pytest.mark.parametrize(("text", "tag"), TAKEN)
def test_the_etag_grammar_takes(text: str, tag: int | str) -> None:
    assert parse_etag(text) == tag


@pytest.mark.parametrize("text", REFUSED)
def test_the_etag_grammar_refuses(text: str) -> None:
    with pytest.raises(ValueError):
        parse_etag(text)


def test_a_partition_append_reads_if_match_as_its_next_offset() -> None:
    assert partition_condition(None) is None
    assert partition_condition("*") is None  # any version: the partition always has one
    for text in ('"42"', "42", 'W/"42"', ' W/42 '):
        assert partition_condition(text) == ExpectedOffset(42)
    for bad in ("-1", '"-1"', "x", 'W/"x"', '"1", "2"'):
        with pytest.raises(InvalidFieldError, match=r'If-Match: must be an offset, e\.g\. "42"'):
            partition_condition(bad)


def test_a_per_key_append_reads_its_headers_as_the_keys_version() -> None:
    assert key_condition(None, None) is None
    for text in ('"41"', 'W/"41"', "41"):
        assert key_condition(text, None) == KeyAt(41)
    assert key_condition('"-1"', None) == key_condition("-1", None) == KeyIsNew()
    assert key_condition("*", None) == KeyHasRecords()
    assert key_condition(None, "*") == key_condition(None, " * ") == KeyIsNew()
    with pytest.raises(InvalidFieldError, match="If-Match: must be the key's ETag"):
        key_condition("abc", None)
    for bad in ('"3"', "W/*", "x", ""):
        with pytest.raises(InvalidFieldError, match=r"If-None-Match: only \*"):
            key_condition(None, bad)
    with pytest.raises(InvalidFieldError, match="give one of them"):
        key_condition('"1"', "*")


def test_the_answer_to_a_refused_condition_depends_on_who_named_it() -> None:
    mismatch = OffsetMismatchError(4, 7)
    assert refused(mismatch, None) is mismatch  # the body's expected_offset: 409 (api/errors.py)
    failed = refused(mismatch, ExpectedOffset(4))  # If-Match: a failed precondition
    assert isinstance(failed, ApiError)
    assert (failed.status, failed.code, failed.detail) == (412, "offset_mismatch", str(mismatch))
    assert failed.extra == {"expected_offset": 4, "high_watermark": 7}
    conflict = ConditionConflictError(5, 4)
    assert refused(conflict, None) is conflict
    disagree = refused(conflict, ExpectedOffset(5))
    assert isinstance(disagree, InvalidFieldError)
    assert str(disagree) == "If-Match and expected_offset disagree"


def test_every_route_reads_the_headers_with_the_one_grammar() -> None:
    # the documented routes and the hot lane hand the headers to these, and parse none themselves
    assert records.partition_condition is conditions.partition_condition
    assert keys.key_condition is conditions.key_condition
    assert lane.key_condition is conditions.key_condition


@pytest.fixture
def client(app_server):
    with app_server.client() as c:
        yield c


def test_a_weak_etag_names_its_offset_on_both_routes(client: httpx.Client) -> None:
    """A proxy that compresses an answer weakens its ETag; echoed back, it names the offset."""
    assert client.post("/v1/topics", json={"name": "w", "partitions": 1}).status_code == 201
    path = "/v1/topics/w/partitions/0/records"

    def produce(value: str, if_match: str, to: str = path) -> httpx.Response:
        return client.post(to, json={"records": [{"value": value}]}, headers={"If-Match": if_match})

    first = client.post(path, json={"records": [{"value": "a"}]})
    assert first.headers["etag"] == '"1"'
    weak = "W/" + first.headers["etag"]
    second = produce("b", weak)
    assert second.status_code == 200 and second.json()["base_offset"] == 1
    body = assert_problem(produce("c", weak), 412, "offset_mismatch")
    assert (body["expected_offset"], body["high_watermark"]) == (1, 2)
    raw = build_batch([(None, b"raw", 1_700_000_000_000, [])])
    r = client.post(path, content=raw, headers={"content-type": RAW, "If-Match": 'W/"2"'})
    assert r.status_code == 200 and r.json()["base_offset"] == 2

    key = "/v1/topics/w/keys/order-1/records"
    created = produce("created", 'W/"-1"', key)
    assert created.status_code == 200
    weak = "W/" + created.headers["etag"]
    assert produce("paid", weak, key).status_code == 200
    body = assert_problem(produce("x", weak, key), 412, "key_version_mismatch")
    assert (body["expected_offset"], body["current_offset"]) == (3, 4)
    # garbage is refused alike on both, and nothing is written
    assert_problem(produce("x", 'W/"x"'), 422, "validation_error")
    assert_problem(produce("x", 'W/"x"', key), 422, "validation_error")
    r = client.get(path, params={"offset": 0})
    assert [x["value"] for x in r.json()["records"]] == ["a", "b", "raw", "created", "paid"]
