"""GET /v1/topics/{topic}/records (api/browse.py): every partition merged by timestamp, newest or
oldest first, filtered, paged with a cursor; a page looks at no more than max_scan records.

Marked `shards`: run again against a family of 2 (EVENTLOG_TEST_PROCESSES=2), where half the
partitions are owned by the shard that did not take the request."""

from __future__ import annotations

import base64

import httpx
import pytest

pytestmark = pytest.mark.shards

URL = "/v1/topics/t/records"


@pytest.fixture
def client(app_server):
    with app_server.client() as c:
        yield c


def _made(client: httpx.Client) -> list[dict]:
    """12 records over 3 partitions, timestamps 1000..1011 round-robin (partition = i % 3), a
    header on the even ones; keys k0..k3 repeating. The expected rows, oldest first."""
    assert client.post("/v1/topics", json={"name": "t", "partitions": 3}).status_code == 201
    records = [
        {
            "key": f"k{i % 4}",
            "value": f"value {i}" + (" needle" if i in (4, 9) else ""),
            "partition": i % 3,
            "timestamp": 1000 + i,
            "headers": [{"key": "even", "value": "yes"}] if i % 2 == 0 else [],
        }
        for i in range(12)
    ]
    answer = client.post("/v1/topics/t/records", json={"records": records})
    assert answer.status_code == 200, answer.text
    return [
        {
            "partition": o["partition"],
            "offset": o["offset"],
            "timestamp": o["timestamp"],
            "key": r["key"],
            "value": r["value"],
            "headers": r["headers"],
        }
        for o, r in zip(answer.json()["offsets"], records, strict=True)
    ]


def _pages(client: httpx.Client, **params) -> tuple[list[list[dict]], list[dict]]:
    """Every page, following next_cursor; and the last answer of each."""
    pages, answers, cursor = [], [], None
    for _ in range(100):
        answer = client.get(URL, params={**params, **({"cursor": cursor} if cursor else {})})
        assert answer.status_code == 200, answer.text
        body = answer.json()
        pages.append(body["records"])
        answers.append(body)
        cursor = body["next_cursor"]
        if cursor is None:
            return pages, answers
    raise AssertionError("the cursor never ended")


def test_every_partition_merged_newest_or_oldest_first_page_by_page(client: httpx.Client) -> None:
    made = _made(client)
    pages, answers = _pages(client, order="oldest", limit=5)
    assert [len(p) for p in pages] == [5, 5, 2]
    assert [r for page in pages for r in page] == made
    pages, _ = _pages(client, limit=5)  # newest is the default
    assert [r for page in pages for r in page] == made[::-1]
    # a cursor from a first page goes on after records written since: newest pages do not
    # show them (they start below), oldest pages do
    first = client.get(URL, params={"order": "oldest", "limit": 11}).json()
    assert first["records"] == made[:11] and first["scanned"] == 11 and not first["scan_limited"]
    client.post(
        "/v1/topics/t/records",
        json={"records": [{"value": "late", "partition": 0, "timestamp": 5000}]},
    )
    rest = client.get(URL, params={"order": "oldest", "cursor": first["next_cursor"]}).json()
    assert [r["value"] for r in rest["records"]] == ["value 11", "late"] and rest[
        "next_cursor"
    ] is None


def test_filters_on_key_value_header_and_partition(client: httpx.Client) -> None:
    made = _made(client)

    def values(**params) -> list[str]:
        pages, _ = _pages(client, order="oldest", **params)
        return [r["value"] for page in pages for r in page]

    assert values(key="k1") == [r["value"] for r in made if r["key"] == "k1"]
    assert values(value_contains="needle") == ["value 4 needle", "value 9 needle"]
    assert values(header="even") == [r["value"] for r in made[::2]]
    assert values(header="even=no") == []
    assert values(partition=[1]) == [r["value"] for r in made if r["partition"] == 1]
    assert values(partition=[0, 2], key="k0") == ["value 0", "value 8"]  # k0: partitions 0, 1, 2
    # a binary key, given in base64
    key = base64.b64encode(b"\x00\xff").decode()
    client.post(
        "/v1/topics/t/records",
        json={"key_format": "base64", "records": [{"key": key, "value": "AA==", "partition": 2}]},
    )
    [only] = client.get(URL, params={"key": key, "key_format": "base64"}).json()["records"]
    assert (only["partition"], only["key"], only["value"]) == (2, key, "AA==")
    assert client.get(URL, params={"key": "not base64!", "key_format": "base64"}).status_code == 422
    assert client.get(URL, params={"partition": 3}).json()["code"] == "partition_not_found"


def test_a_page_looks_at_no_more_than_max_scan_records(client: httpx.Client) -> None:
    """A filter that matches nothing answers short pages, each after max_scan records, with a
    cursor; following it reaches the end."""
    _made(client)
    pages, answers = _pages(client, value_contains="absent", max_scan=4)
    assert [a["scanned"] for a in answers] == [4, 4, 4] and all(p == [] for p in pages)
    assert [a["scan_limited"] for a in answers] == [True, True, False]
    # a match past the first page's scan
    pages, answers = _pages(client, order="oldest", value_contains="needle", max_scan=5, limit=1)
    assert [[r["value"] for r in p] for p in pages] == [["value 4 needle"], ["value 9 needle"], []]
    assert [a["scanned"] for a in answers] == [5, 5, 2]
    pages, answers = _pages(client, order="oldest", value_contains="needle", max_scan=3, limit=1)
    assert [[r["value"] for r in p] for p in pages] == [
        [],
        ["value 4 needle"],
        [],
        ["value 9 needle"],
        [],
    ]
    assert [a["scanned"] for a in answers] == [3, 2, 3, 2, 2]


def test_jump_to_an_offset_or_a_time(client: httpx.Client) -> None:
    made = _made(client)
    # oldest from offset 2: each partition from its offset 2 on
    body = client.get(URL, params={"order": "oldest", "from_offset": 2}).json()
    assert body["records"] == [r for r in made if r["offset"] >= 2]
    # newest from offset 1: each partition's offsets 1 and 0
    body = client.get(URL, params={"from_offset": 1}).json()
    assert body["records"] == [r for r in made if r["offset"] <= 1][::-1]
    # by time: oldest from 1005 (the first records at or after it), newest up to 1005
    assert (
        client.get(URL, params={"order": "oldest", "from_time": 1005}).json()["records"] == made[5:]
    )
    assert client.get(URL, params={"from_time": 1005}).json()["records"] == made[:6][::-1]
    assert client.get(URL, params={"order": "oldest", "from_time": 9999}).json() == {
        "records": [],
        "next_cursor": None,
        "scanned": 0,
        "scan_limited": False,
    }
    refused = client.get(URL, params={"from_time": 1, "from_offset": 1})
    assert (refused.status_code, refused.json()["code"]) == (422, "validation_error")


def test_a_cursor_is_checked(client: httpx.Client) -> None:
    _made(client)
    cursor = client.get(URL, params={"limit": 2}).json()["next_cursor"]
    for bad, why in ((cursor[:-3], "not one this server gave"), ("x", "not one this server gave")):
        answer = client.get(URL, params={"cursor": bad})
        assert (answer.status_code, answer.json()["code"]) == (400, "invalid_cursor")
        assert why in answer.json()["detail"]
    other = client.get(URL, params={"cursor": cursor, "order": "oldest"})
    assert (other.status_code, other.json()["code"]) == (
        400,
        "invalid_cursor",
    ) and "order=newest" in other.json()["detail"]
    assert client.get("/v1/topics/nope/records").json()["code"] == "topic_not_found"


def test_a_consumer_of_the_topic_may_browse_it_and_no_other(app_factory, tmp_path) -> None:
    auth = tmp_path / "auth.json"
    auth.write_text(
        '{"tokens": [{"name": "ops", "token": "admin-token-1234", "role": "admin"},'
        ' {"name": "r", "token": "reader-token-1234", "role": "consumer", "topics": ["t"]}]}'
    )
    server = app_factory(EVENTLOG_AUTH_FILE=str(auth)).start(token="admin-token-1234")
    with server.client("admin-token-1234") as admin:
        _made(admin)
        admin.post("/v1/topics", json={"name": "secret"}).raise_for_status()
    with server.client("reader-token-1234") as reader:
        assert len(reader.get(URL).json()["records"]) == 12
        assert reader.get("/v1/topics/secret/records").status_code == 403
    with server.client() as anonymous:
        assert anonymous.get(URL).status_code == 401
