"""The web console in a real headless Chromium (Debian's, driven by Playwright), against
`eventlog serve` on a free port: what an operator does with a browser and no command line.

Chromium comes from the project's own set-up (`make test` runs tests/install-test-peers.sh);
where it cannot be installed these tests skip and say why. Every check that the page did
something is also checked through the API (httpx), so a page that only looks right fails.

With EVENTLOG_CONSOLE_SCREENSHOTS=<dir>, the tests save the screenshots docs/CONSOLE.md shows
(`make console-screenshots`).
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import time
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path

import httpx
import pytest

from ..conftest import ServerProcess, wait_until

pytestmark = pytest.mark.slow

CHROMIUM = os.environ.get("EVENTLOG_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
SHOTS = os.environ.get("EVENTLOG_CONSOLE_SCREENSHOTS")
ADMIN, READER = "console-admin-token", "console-reader-token"
T0 = 1_767_225_600_000  # 2026-01-01 00:00:00 UTC


def _why_no_browser() -> str | None:
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "playwright is not installed (the dev extra installs it: make install)"
    if CHROMIUM is None:
        return "no chromium: `make test` installs Debian's (tests/install-test-peers.sh) where it may use apt-get"
    return None


@pytest.fixture(scope="module")
def browser() -> Iterator:
    reason = _why_no_browser()
    if reason is not None:
        pytest.skip(reason)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(
            executable_path=CHROMIUM,
            # this machine's network is closed: no background fetches, no first-run work
            args=["--disable-gpu", "--disable-background-networking", "--disable-component-update",
                  "--disable-sync", "--no-first-run", "--disable-quic"],
        )
        yield chromium
        chromium.close()


class Console:
    """A browser tab on the console of `server`, failing the test on any script error."""

    def __init__(self, browser, server: ServerProcess, zone: str = "UTC") -> None:
        self.server = server
        self.context = browser.new_context(viewport={"width": 1280, "height": 860}, timezone_id=zone)
        self.context.set_default_timeout(15_000)
        self.page = self.context.new_page()
        self.errors: list[str] = []
        self.page.on("pageerror", lambda error: self.errors.append(f"page error: {error}"))
        self.page.on("console", lambda m: self.errors.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
        self.page.on("dialog", lambda d: self.errors.append(f"unexpected {d.type} dialog: {d.message}"))

    def open(self, hash_: str = "") -> None:
        self.page.goto(f"{self.server.url}/console{hash_}")

    def shot(self, name: str) -> None:
        if SHOTS:
            Path(SHOTS).mkdir(parents=True, exist_ok=True)
            self.page.wait_for_timeout(300)  # fonts and the last frame
            self.page.screenshot(path=str(Path(SHOTS) / f"{name}.png"), full_page=True)

    def rows(self, table: str) -> list[str]:
        return self.page.locator(f"#{table} tbody tr").all_inner_texts()

    def offsets(self) -> list[int]:
        return [int(o) for o in self.page.locator("#records tbody tr").evaluate_all("rows => rows.map(r => r.dataset.offset)")]

    def close(self) -> None:
        self.context.close()
        # the console's own requests end in 4xx on purpose in some tests (shown in the page);
        # Chromium logs those as console errors: only script errors fail the test
        real = [e for e in self.errors if "Failed to load resource" not in e]
        assert not real, real


@pytest.fixture
def console_factory(browser) -> Iterator:
    opened: list[Console] = []

    def make(server: ServerProcess, zone: str = "UTC") -> Console:
        console = Console(browser, server, zone)
        opened.append(console)
        return console

    yield make
    for console in opened:
        console.close()


@pytest.fixture
def start(server_factory, request: pytest.FixtureRequest):
    """start(processes, token=None, **env) -> (server, an httpx client of it, closed at the end)."""

    def make(processes: int, token: str | None = None, **env: str) -> tuple[ServerProcess, httpx.Client]:
        server = server_factory(**env)
        server.processes = processes
        server.start(token=token)
        client = server.client(token)
        request.addfinalizer(client.close)
        return server, client

    return make


def _fetch(client: httpx.Client, topic: str, partition: int, **params: str) -> list[dict]:
    answer = client.get(f"/v1/topics/{topic}/partitions/{partition}/records", params={"offset": 0, "max_records": 1000, **params})
    answer.raise_for_status()
    return answer.json()["records"]


def test_a_topic_from_creation_to_deletion_on_two_shards(start, console_factory) -> None:
    """Create a topic, produce from the form, browse by offset (paging both ways), by time and
    by key, tail it live with pause and resume, and delete it: a shard family of 2, so half the
    partitions are owned by the shard that did not answer the page."""
    server, client = start(2)
    console = console_factory(server)
    page = console.page

    page.goto(server.url + "/")  # `/` is the console
    assert page.url == f"{server.url}/console"
    page.locator("#identity").filter(has_text="no auth").wait_for()
    # no auth file: no token to give, so no token field or its buttons
    assert page.locator("#token-form input, #token-form button").evaluate_all(
        "elements => elements.filter(e => e.checkVisibility()).length"
    ) == 0

    # the form sends only what was chosen: defaults stay defaults, not overrides
    form = page.locator("#create-topic")
    form.locator("input[name=name]").fill("plain")
    assert form.locator("select[name=policy]").input_value() == ""
    form.locator("button[type=submit]").click()
    page.locator("h1", has_text="plain").wait_for()
    assert client.get("/v1/topics/plain").json()["overrides"] == {}
    page.locator("#configs tr", has_text="cleanup.policy").filter(has_text="default").wait_for()
    assert page.locator("#configs tr", has_text="set on topic").count() == 0
    console.open("#/topics")

    form = page.locator("#create-topic")
    form.locator("input[name=name]").fill("orders")
    form.locator("input[name=partitions]").fill("4")
    form.locator("select[name=policy]").select_option("compact,delete")
    form.locator("textarea[name=configs]").fill("segment.bytes=2048")
    console.shot("create-topic")
    form.locator("button[type=submit]").click()
    page.locator("h1", has_text="orders").wait_for()
    assert page.url.endswith("#/topics/orders")
    topic = client.get("/v1/topics/orders").json()
    assert len(topic["partitions"]) == 4
    assert topic["overrides"] == {"cleanup.policy": "compact,delete", "segment.bytes": "2048"}
    assert page.locator("#partitions tbody tr").count() == 4

    # the produce form: a key, a JSON value, a header
    produce = page.locator("#produce")
    produce.locator("input[name=key]").fill("order-17")
    produce.locator("select[name=format]").select_option("json")
    produce.locator("textarea[name=value]").fill('{"status": "new", "total": 12.5}')
    produce.get_by_role("button", name="Add header").click()
    produce.locator("input[name=header-key]").fill("source")
    produce.locator("input[name=header-value]").fill("web")
    produce.get_by_role("button", name="Produce").click()
    written = page.locator("#produce-result").filter(has_text="Written")
    written.wait_for()
    partition = int(written.inner_text().split("partition ")[1].split(",")[0])
    [record] = _fetch(client, "orders", partition)
    # the partitions table shows the new high watermark at once (drawn again after the produce)
    fresh = page.locator(f"#partitions tbody tr[data-partition='{partition}'] td")
    wait_until(lambda: fresh.nth(2).inner_text() == "1", what="the new high watermark shown")
    assert (record["key"], json.loads(record["value"])) == ("order-17", {"status": "new", "total": 12.5})
    assert record["headers"] == [{"key": "source", "value": "web"}]
    # a value that is not JSON is refused in the page, nothing is written
    produce.locator("textarea[name=value]").fill("{not json")
    produce.get_by_role("button", name="Produce").click()
    page.locator("#produce-result").filter(has_text="not JSON").wait_for()
    assert len(_fetch(client, "orders", partition)) == 1

    # a value written by a hostile producer is shown as text, never run
    hostile = '<img src=x onerror="document.body.dataset.owned=1"><script>document.body.dataset.owned=1</script>'
    client.post("/v1/topics/orders/records", json={"records": [
        {"key": "<b>k</b>", "value": hostile, "partition": partition, "headers": [{"key": "h", "value": hostile}]},
    ]}).raise_for_status()
    for i in range(3):
        client.post("/v1/topics/orders/records", json={"records": [{"key": "order-17", "value": json.dumps({"status": f"step-{i}"})}]}).raise_for_status()
    # 45 records into partition 0, for paging; bytes that are not UTF-8 show as hex
    client.post("/v1/topics/orders/records", json={"records": [
        {"key": "cGFnZQ==", "value": "cg==", "partition": 0} for i in range(45)] + [{"key": "aGV4", "value": "AP8=", "partition": 0}],
        "key_format": "base64", "value_format": "base64",
    }).raise_for_status()

    # by offset: the page with the produced record, then paging in partition 0
    page.locator("a", has_text="Browse records").first.click()
    page.locator("#browse-form").wait_for()  # every partition merged, first
    page.locator("a[data-mode=offset]").click()
    page.locator("#records-form select[name=partition]").select_option(str(partition))
    page.locator("#records-form button[type=submit]").click()
    page.locator("#records", has_text="order-17").wait_for()
    text = page.locator("#records").inner_text()
    assert '"status": "new"' in text and "source: web" in text and hostile in text
    assert page.evaluate("document.body.dataset.owned") is None
    assert page.locator("#records img, #records script").count() == 0
    console.shot("records-by-offset")

    offsets_0 = [r["offset"] for r in _fetch(client, "orders", 0, key_format="base64", value_format="base64")]
    console.open(f"#/topics/orders/records?{'partition=0&size=20'}")
    page.locator("#records tbody tr").first.wait_for()
    assert console.offsets() == offsets_0[:20]
    page.locator("#next").click()
    page.wait_for_function("() => document.querySelector('#records tbody tr')?.dataset.offset === String(%d)" % offsets_0[20])
    assert console.offsets() == offsets_0[20:40]
    page.locator("#next").click()
    page.wait_for_function("() => document.querySelector('#records tbody tr')?.dataset.offset === String(%d)" % offsets_0[40])
    assert console.offsets() == offsets_0[40:]
    assert page.locator("#next button").is_disabled()
    assert "00 ff" in page.locator("#records tbody tr").last.inner_text()  # AP8= is 0x00 0xff
    page.locator("#previous").click()
    page.wait_for_function("() => document.querySelector('#records tbody tr')?.dataset.offset === String(%d)" % offsets_0[20])
    assert console.offsets() == offsets_0[20:40]
    # an offset past the end says what the partition holds
    console.open("#/topics/orders/records?partition=0&offset=999")
    page.locator("#records-body", has_text="outside partition 0").wait_for()

    # by time: records at T0, T0+1h, T0+2h in an empty partition (ListOffsets answers the first
    # offset whose timestamp is at least T: records written now would come first); the picker
    # is in the browser's zone (UTC here)
    empty = next(p for p in (1, 3) if p != partition)
    client.post("/v1/topics/orders/records", json={"records": [
        {"key": f"t{h}", "value": f"at-{h}h", "partition": empty, "timestamp": T0 + h * 3_600_000} for h in range(3)]}).raise_for_status()
    at_1h = next(r for r in _fetch(client, "orders", empty) if r["value"] == "at-1h")
    page.locator("a[data-mode=time]").click()
    page.locator("#records-form input[name=time]").wait_for()
    page.locator("#records-form select[name=partition]").select_option(str(empty))
    page.locator("#records-form input[name=time]").fill("2026-01-01T00:30:00")
    page.locator("#records-form button[type=submit]").click()
    page.locator("#time-note").wait_for()
    assert console.offsets() == [at_1h["offset"], at_1h["offset"] + 1]
    assert "2026-01-01 01:00:00.000 UTC" in page.locator("#records tbody tr").first.inner_text()
    console.shot("records-by-time")
    page.locator("#records-form input[name=time]").fill("2026-01-01T03:00:00")
    page.locator("#records-form button[type=submit]").click()
    page.locator("#no-records").wait_for()

    # by key: the per-key stream, from the topic page's lookup
    console.open("#/topics/orders")
    page.locator("#key-lookup input[name=key]").fill("order-17")
    page.locator("#key-lookup button").click()
    page.locator("#key-summary").wait_for()
    key_records = client.get("/v1/topics/orders/keys/order-17/records").json()["records"]
    assert console.offsets() == [r["offset"] for r in key_records] and len(key_records) == 4
    assert [v.strip() for v in page.locator("#records td.value").all_inner_texts()] == [
        json.dumps(json.loads(r["value"]), indent=2) for r in key_records]
    console.shot("records-by-key")
    key_offsets = console.offsets()
    console.open("#/topics/orders/records?mode=key&key=order-17&size=2")  # two pages of two
    page.wait_for_function("() => document.querySelectorAll('#records tbody tr').length === 2")
    assert console.offsets() == key_offsets[:2]
    page.locator("#next").click()
    page.wait_for_function("() => document.querySelector('#records tbody tr')?.dataset.offset === String(%d)" % key_offsets[2])
    assert console.offsets() == key_offsets[2:]
    page.locator("#previous").click()
    page.wait_for_function("() => document.querySelector('#records tbody tr')?.dataset.offset === String(%d)" % key_offsets[0])
    assert console.offsets() == key_offsets[:2] and page.locator("#previous button").is_disabled()

    # live tail of partition 2: new records appear, newest first, exactly once across a pause
    console.open("#/topics/orders/tail?partition=2")
    page.locator("#tail-status", has_text="live").wait_for()

    def tail_offsets() -> list[int]:
        return [int(row.split("\t")[0]) for row in console.rows("tail")]

    def send(values: list[str]) -> None:
        client.post("/v1/topics/orders/records", json={"records": [{"key": v, "value": v, "partition": 2} for v in values]}).raise_for_status()

    send([f"live-{i}" for i in range(5)])
    wait_until(lambda: len(tail_offsets()) == 5, what="5 records in the tail")
    # the readout: records received, and their rate over the last 5 s (above 0 for 5 s after
    # the burst; the page samples every second)
    rates: list[float] = []

    def counted() -> bool:
        rates.append(float(page.locator("#tail-rate").inner_text()))
        return page.locator("#tail-count").inner_text() == "5" and max(rates) > 0

    wait_until(counted, interval=0.1, what="the readout counting 5 records at a rate above 0")
    console.shot("live-tail")
    page.locator("#tail-toggle").click()
    page.locator("#tail-status", has_text="paused").wait_for()
    send(["while-paused-0", "while-paused-1"])
    time.sleep(0.5)
    assert len(tail_offsets()) == 5
    page.locator("#tail-toggle").click()
    send(["after-resume"])
    wait_until(lambda: len(tail_offsets()) == 8, what="the paused records and the new one")
    expected = [r["offset"] for r in _fetch(client, "orders", 2)]
    assert tail_offsets() == sorted(expected, reverse=True)[:8] == sorted(set(tail_offsets()), reverse=True)

    # delete, confirmed by typing the name
    console.open("#/topics/orders")
    page.locator("#delete-topic").click()
    dialog = page.locator("dialog")
    dialog.locator("input").fill("order")
    assert dialog.get_by_role("button", name="Delete").is_disabled()
    dialog.locator("input").fill("orders")
    dialog.get_by_role("button", name="Delete").click()
    page.locator("#banner", has_text="Topic orders deleted").wait_for()
    assert client.get("/v1/topics/orders").status_code == 404
    assert "orders" not in page.locator("#topics").inner_text()


def test_partitions_cleanup_groups_snapshots_and_charts(start, console_factory) -> None:
    """The partition page (segments, passes, running them), configs and partitions from the
    topic page, consumer groups with lag, snapshots, and the charts."""
    server, client = start(1)
    client.post("/v1/topics", json={"name": "prices", "partitions": 1, "configs": {
        "cleanup.policy": "compact", "segment.bytes": "1024", "min.cleanable.dirty.ratio": "0.01"}}).raise_for_status()
    for round_ in range(4):
        client.post("/v1/topics/prices/records", json={"records": [
            {"key": f"sku-{i}", "value": f"{round_}-{'x' * 60}"} for i in range(10)]}).raise_for_status()
    console = console_factory(server)
    page = console.page

    console.open("#/topics/prices/partitions/0")
    page.locator("#segments tbody tr").first.wait_for()
    segments = client.get("/v1/topics/prices/partitions/0/segments").json()["segments"]
    assert page.locator("#segments tbody tr").count() == len(segments) > 1
    assert "active" in console.rows("segments")[-1]
    page.locator("#run-compaction").click()
    page.locator("#last-run", has_text="Compaction pass").wait_for()
    passes = page.locator("#passes").inner_text()
    state = client.get("/v1/topics/prices/partitions/0/maintenance").json()
    assert state["last_compaction"]["outcome"] == "ok" and state["last_compaction"]["result"]["records_removed"] > 0
    assert f"{state['last_compaction']['result']['records_removed']} removed" in passes
    page.locator("#run-retention").click()
    page.locator("#last-run", has_text="Retention pass").wait_for()
    assert "Retention:" in page.locator("#passes").inner_text() and "no pass yet" not in page.locator("#passes").inner_text()
    console.shot("partition")

    # configs and partitions from the topic page
    console.open("#/topics/prices")
    form = page.locator("#alter-configs")
    form.locator("input[name=key]").fill("retention.ms")
    form.locator("input[name=value]").fill("86400000")
    form.locator("button").click()
    page.locator("#configs tr", has_text="retention.ms").filter(has_text="set on topic").wait_for()
    assert client.get("/v1/topics/prices").json()["configs"]["retention.ms"] == "86400000"
    form.locator("input[name=key]").fill("retention.ms")
    form.locator("input[name=value]").fill("soon")
    form.locator("button").click()
    page.locator("#alter-configs + .result.error, div .result.error", has_text="invalid_config").wait_for()
    # pre-filled with the count there is now, said in its label: the user raises it
    count = len(client.get("/v1/topics/prices").json()["partitions"])
    assert page.locator("#add-partitions input[name=count]").input_value() == str(count)
    label = page.locator("#add-partitions label").inner_text()
    assert label.startswith(f"Partitions in all (now {count};"), label
    page.locator("#add-partitions input[name=count]").fill("3")
    page.locator("#add-partitions button").click()
    wait_until(lambda: page.locator("#partitions tbody tr").count() == 3, what="3 partitions shown")
    assert len(client.get("/v1/topics/prices").json()["partitions"]) == 3
    console.shot("topic")

    # consumer groups and lag
    high = client.get("/v1/topics/prices/partitions/0/offsets").json()["high_watermark"]
    client.post("/v1/groups/pricing-job/offsets", json={"offsets": [{"topic": "prices", "partition": 0, "offset": 10}]}).raise_for_status()
    console.open("#/groups")
    page.locator("#groups tbody tr[data-group=pricing-job]").wait_for()
    assert page.locator("#groups tbody tr").inner_text().split("\t")[-1].strip() == str(high - 10)
    page.locator("#groups a", has_text="pricing-job").click()
    page.locator("#group-offsets tbody tr").first.wait_for()
    cells = [c.strip() for c in console.rows("group-offsets")[0].split("\t")]
    assert cells[:5] == ["prices", "0", "10", str(high), str(high - 10)]
    console.shot("groups")

    # snapshots: take one from the form, see it listed, delete it
    console.open("#/snapshots")
    page.locator("#create-snapshot input[name=topics]").fill("prices")
    page.locator("#create-snapshot button").click()
    page.locator("#snapshots tbody tr[data-snapshot]").wait_for()
    [snapshot] = client.get("/v1/snapshots").json()["snapshots"]
    assert snapshot["topics"] == ["prices"] and snapshot["id"] in console.rows("snapshots")[0]
    console.shot("snapshots")
    page.locator("#snapshots button", has_text="Delete").click()
    page.locator("dialog input").fill(snapshot["id"])
    page.locator("dialog").get_by_role("button", name="Delete").click()
    wait_until(lambda: client.get("/v1/snapshots").json()["snapshots"] == [], what="the snapshot deleted")
    page.locator("#snapshots td.muted", has_text="none").wait_for()

    # charts: rates from /metrics while records go in; a deleted topic is not listed
    client.post("/v1/topics", json={"name": "gone"}).raise_for_status()
    client.post("/v1/topics/gone/records", json={"records": [{"value": "v"}]}).raise_for_status()
    assert client.delete("/v1/topics/gone").status_code == 204
    console.open("#/charts")
    page.locator("#charts .chart").first.wait_for()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        client.post("/v1/topics/prices/records", json={"records": [{"key": "sku-1", "value": "y" * 100}] * 50}).raise_for_status()
        produced = page.locator(".chart[data-series='Produced records/s'] .now").inner_text()
        if float(produced) > 0 and page.locator("#topic-rates tr", has_text="prices").count():
            break
        time.sleep(0.3)
    else:
        raise AssertionError(f"the produce chart stayed at {produced}")
    assert page.locator(".chart[data-series='Produced records/s'] polyline").count() == 1
    assert "gone" not in page.locator("#topic-rates").inner_text()
    produced = page.locator(".chart[data-series='Produced records/s']")
    assert produced.locator(".max").inner_text().startswith("max ")
    axis = produced.locator(".axis").inner_text()
    assert axis.endswith("now") and " s" in axis, axis  # a time axis: −N s … now
    label = produced.locator(".max").bounding_box()
    assert label is not None and label["height"] >= 12, label  # readable, not squashed
    if SHOTS:  # a few minutes' worth of a chart for the docs: produce and read at a varying rate
        for i in range(12):
            client.post("/v1/topics/prices/records", json={"records": [{"key": "sku-1", "value": "y" * 100}] * (20 + 15 * (i % 5))})
            _fetch(client, "prices", 0)
            time.sleep(0.5)
    console.shot("charts")


def test_groups_are_shown_a_page_at_a_time(start, console_factory) -> None:
    """The groups view shows 100 groups (each with its lag) and pages on by name."""
    server, client = start(1)
    client.post("/v1/topics", json={"name": "jobs"}).raise_for_status()
    names = [f"job-{i:03d}" for i in range(101)]
    for name in names:
        commit = {"offsets": [{"topic": "jobs", "partition": 0, "offset": 0}]}
        client.post(f"/v1/groups/{name}/offsets", json=commit).raise_for_status()
    console = console_factory(server)
    page = console.page
    console.open("#/groups")
    page.locator("#groups tbody tr[data-group=job-099]").wait_for()
    assert len(console.rows("groups")) == 100
    page.locator("#next-groups").click()
    page.locator("#groups tbody tr[data-group=job-100]").wait_for()
    assert [r.split("\t")[0] for r in console.rows("groups")] == ["job-100"]
    assert page.locator("#next-groups button").is_disabled()
    listed = client.get("/v1/groups", params={"limit": 100}).json()
    assert listed["next_after"] == "job-099"


def test_a_groups_offsets_are_reset_from_its_page_with_commit_times(start, console_factory) -> None:
    """The group page shows each offset's commit time and resets offsets as Kafka's
    --reset-offsets: Preview (a dry run) shows the plan and commits nothing, Reset commits it;
    a refusal (shift without a committed offset) is shown and commits nothing. Each checked
    through the API."""
    server, client = start(1)
    client.post("/v1/topics", json={"name": "ledger", "partitions": 2}).raise_for_status()
    for p in range(2):
        records = [{"value": f"v{i}", "partition": p, "timestamp": T0 + 1000 * i} for i in range(6)]
        client.post("/v1/topics/ledger/records", json={"records": records}).raise_for_status()
    commit = {"offsets": [{"topic": "ledger", "partition": 0, "offset": 5}]}
    client.post("/v1/groups/settle/offsets", json=commit).raise_for_status()

    def committed() -> dict[int, int]:
        offsets = client.get("/v1/groups/settle/offsets").json()["offsets"]
        return {o["partition"]: o["offset"] for o in offsets}

    stamp = client.get("/v1/groups/settle/offsets").json()["offsets"][0]["commit_timestamp"]
    shown = datetime.fromtimestamp(stamp / 1000, timezone.utc).strftime("%Y-%m-%d %H:%M:%S")
    console = console_factory(server)
    page = console.page
    console.open("#/groups")
    page.locator("#groups tbody tr[data-group=settle]").wait_for()
    assert shown in console.rows("groups")[0]
    console.open("#/groups/settle")
    page.locator("#group-offsets tbody tr").first.wait_for()
    assert shown in console.rows("group-offsets")[0]

    form = page.locator("#reset-offsets")
    assert form.locator("input[name=topic]").input_value() == "ledger"  # the group's one topic
    form.locator("select[name=strategy]").select_option("to_earliest")
    form.locator("button[name=dry_run]").click()
    page.locator("#reset-plan tbody tr").nth(1).wait_for()
    plan = [r.split("\t") for r in console.rows("reset-plan")]
    assert [[c.strip() for c in r] for r in plan] == [
        ["ledger", "0", "5", "0"], ["ledger", "1", "–", "0"]
    ]
    assert committed() == {0: 5}  # a preview commits nothing

    # to a time (the browser's zone is UTC here): the record of T0 + 3 s is offset 3
    form.locator("select[name=strategy]").select_option("to_datetime")
    at = datetime.fromtimestamp(T0 / 1000 + 3, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")
    form.locator("input[name=value]").fill(at)
    form.locator("button[name=execute]").click()
    wait_until(lambda: committed() == {0: 3, 1: 3}, what="the reset to a time")
    page.locator("#banner", has_text="Reset 2 offset(s)").wait_for()
    page.locator("#group-offsets tbody tr").nth(1).wait_for()
    assert [r.split("\t")[2].strip() for r in console.rows("group-offsets")] == ["3", "3"]

    form = page.locator("#reset-offsets")
    form.locator("input[name=partitions]").fill("1")
    form.locator("select[name=strategy]").select_option("shift_by")
    form.locator("input[name=value]").fill("-2")
    form.locator("button[name=execute]").click()
    wait_until(lambda: committed() == {0: 3, 1: 1}, what="the shift of partition 1")
    console.shot("group-reset")

    client.post("/v1/topics", json={"name": "ledger-2"}).raise_for_status()
    form = page.locator("#reset-offsets")
    page.locator("#group-offsets tbody tr").nth(1).wait_for()
    form.locator("input[name=topic]").fill("ledger-2")
    form.locator("select[name=strategy]").select_option("shift_by")
    form.locator("input[name=value]").fill("1")
    form.locator("button[name=execute]").click()
    page.locator("#reset-result.error", has_text="no committed offset").wait_for()
    assert committed() == {0: 3, 1: 1}


def test_behind_auth_a_token_shows_only_what_it_may_do(tmp_path: Path, start, console_factory) -> None:
    auth = tmp_path / "auth.json"
    auth.write_text(json.dumps({"tokens": [
        {"name": "ops", "token": ADMIN, "role": "admin"},
        {"name": "billing-reader", "token": READER, "role": "consumer", "topics": ["billing."], "groups": ["reports-"]},
    ]}))
    server, admin = start(1, token=ADMIN, EVENTLOG_AUTH_FILE=str(auth))
    for name in ("billing.invoices", "hr.salaries"):
        admin.post("/v1/topics", json={"name": name}).raise_for_status()
    admin.post("/v1/topics/billing.invoices/records", json={"records": [{"key": "inv-1", "value": "due"}]}).raise_for_status()
    console = console_factory(server)
    page = console.page

    console.open()
    page.locator("#banner", has_text="needs a token").wait_for()
    assert page.locator("#topics").count() == 0
    page.locator("#token").fill("not-a-token")
    page.locator("#token-form button[type=submit]").click()
    page.locator("#banner", has_text="refused this token").wait_for()

    page.locator("#token").fill(READER)
    page.locator("#token-form button[type=submit]").click()
    page.locator("#identity", has_text="billing-reader · consumer").wait_for()
    page.locator("#topics tbody tr").first.wait_for()
    assert [r.split("\t")[0].strip() for r in console.rows("topics")] == ["billing.invoices"]
    assert page.locator("#create-topic").count() == 0
    console.open("#/topics/billing.invoices")
    page.locator("#partitions tbody tr").first.wait_for()
    assert page.locator("#delete-topic, #produce, #alter-configs, #add-partitions").count() == 0
    console.shot("auth-consumer")
    page.locator("a", has_text="Browse records").click()
    page.locator("#records tbody tr").first.wait_for()
    assert "inv-1" in console.rows("records")[0]
    console.open("#/topics/billing.invoices/partitions/0")
    page.locator("#segments tbody tr").first.wait_for()
    assert page.locator("#run-retention, #run-compaction").count() == 0
    console.open("#/snapshots")
    page.locator("main", has_text="for admin tokens").wait_for()
    # a topic outside its prefixes answers 403, said in the page
    console.open("#/topics/hr.salaries")
    page.locator("main", has_text="403").wait_for()

    # the token stays with the tab (session storage): a reload keeps it, a new tab asks again
    page.reload()
    page.locator("#identity", has_text="billing-reader").wait_for()
    other = console_factory(server)
    other.open()
    other.page.locator("#banner", has_text="needs a token").wait_for()

    # an admin token sees and does everything
    page.locator("#token").fill(ADMIN)
    page.locator("#token-form button[type=submit]").click()
    page.locator("#identity", has_text="ops · admin").wait_for()
    console.open("#/topics")
    page.locator("#create-topic").wait_for()
    assert sorted(r.split("\t")[0].strip() for r in console.rows("topics")) == ["billing.invoices", "hr.salaries"]
    page.locator("#token-clear").click()
    page.locator("#banner", has_text="needs a token").wait_for()


def test_the_page_runs_only_its_own_code_and_works_offline(server: ServerProcess) -> None:
    """No CDN: every asset the page names is served by the service, under a policy that allows
    nothing else; the page and assets need no token, the data does."""
    with server.client() as client:
        page = client.get("/console")
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        policy = page.headers["content-security-policy"]
        assert "script-src 'self'" in policy and "connect-src 'self'" in policy and "frame-ancestors 'none'" in policy
        assets = [part.split('"')[0] for part in page.text.split('="')[1:] if part.startswith("/console/assets/")]
        assert sorted(assets) == ["/console/assets/console.css", "/console/assets/console.js", "/console/assets/favicon.svg"]
        for asset in assets:
            answer = client.get(asset)
            assert answer.status_code == 200 and answer.content
            own = answer.content.replace(b"http://www.w3.org/2000/svg", b"")  # SVG's namespace, never fetched
            assert b"http://" not in own and b"https://" not in own
        assert client.get("/console/assets/../main.py").status_code == 404
        assert client.get("/console/assets/nothing.js").status_code == 404
        assert client.head("/console").status_code == 200
        root = client.get("/", follow_redirects=False)
        assert (root.status_code, root.headers["location"]) == (302, "/console")


DOCS_PAGES = ("/docs", "/redoc", "/docs/oauth2-redirect")
DOCS_ASSETS = tuple(
    f"/static/docs/{name}"
    for name in ("swagger-ui-bundle.js", "swagger-ui.css", "redoc.standalone.js", "favicon.png")
)


def test_the_documents_pages_run_only_their_own_code(server: ServerProcess) -> None:
    """/docs, /redoc (and Swagger UI's OAuth2 redirect page) and their assets are sent under
    the console's kind of policy (api/pages.py): scripts from the server or inline ones by hash
    (never 'unsafe-inline' scripts), requests to the server only, and no framing."""
    with server.client() as client:
        console_policy = client.get("/console").headers["content-security-policy"]
        for path in DOCS_PAGES + DOCS_ASSETS:
            answer = client.get(path)
            assert answer.status_code == 200, path
            given = answer.headers["content-security-policy"]
            policy = dict(d.strip().split(" ", 1) for d in given.split(";"))
            assert policy["default-src"] == "'none'", (path, policy)
            assert policy["connect-src"] == "'self'", (path, policy)
            assert policy["frame-ancestors"] == "'none'", path
            assert answer.headers["x-frame-options"] == "DENY", path
            assert answer.headers["x-content-type-options"] == "nosniff", path
            scripts = policy["script-src"].split()
            assert scripts[0] == "'self'", (path, scripts)
            assert all(s.startswith("'sha256-") for s in scripts[1:]), (path, scripts)
            assert "'unsafe-inline'" not in scripts and "'unsafe-eval'" not in scripts
            for directive in ("base-uri", "form-action", "img-src"):  # the console's, as they are
                assert directive + " " + policy[directive] in console_policy, (path, directive)
        # the console's own policy is unchanged by the documents' needs
        assert "'unsafe-inline'" not in console_policy and "sha256" not in console_policy
        assert client.get("/console").headers["x-frame-options"] == "DENY"


class DocsPage:
    """A browser tab on one of the documents' pages: every console error, script error and CSP
    violation it reports, and every request it makes."""

    def __init__(self, browser, server: ServerProcess, path: str) -> None:
        self.context = browser.new_context(viewport={"width": 1280, "height": 860})
        self.context.set_default_timeout(20_000)
        self.page = self.context.new_page()
        self.errors: list[str] = []
        self.requests: list[str] = []
        self.page.on("pageerror", lambda error: self.errors.append(f"page error: {error}"))
        self.page.on("console", self._console)
        self.page.on("request", lambda r: self.requests.append(r.url))
        # the violations the page's own code sees (an extension's script is not subject to the CSP)
        self.page.add_init_script(
            "window.__violations = []; document.addEventListener('securitypolicyviolation',"
            " e => window.__violations.push(e.violatedDirective + ' ' + e.blockedURI));"
        )
        self.response = self.page.goto(f"{server.url}{path}")
        self.url = server.url

    def _console(self, message) -> None:  # noqa: ANN001 -- playwright's ConsoleMessage
        if message.type == "error":
            self.errors.append(f"console {message.type}: {message.text}")

    def check(self) -> None:
        """No CSP violation, no error, nothing loaded from elsewhere."""
        violations = self.page.evaluate("window.__violations")
        self.context.close()
        assert not violations, violations
        assert not self.errors, self.errors
        own = (self.url + "/", "data:", "blob:")
        elsewhere = [u for u in self.requests if not u.startswith(own)]
        assert not elsewhere, elsewhere


def test_swagger_ui_and_redoc_render_under_their_policy(server: ServerProcess, browser) -> None:
    """Swagger UI draws every operation of the document and ReDoc draws the document, search
    included (its worker), with the CSP of api/pages.py enforced: not one violation."""
    with server.client() as client:
        document = client.get("/openapi.json").json()
    operations = [op for item in document["paths"].values() for op in item.values()]
    assert len(operations) > 20

    swagger = DocsPage(browser, server, "/docs")
    assert "content-security-policy" in swagger.response.headers
    swagger.page.locator(".opblock").first.wait_for()
    swagger.page.wait_for_function(
        f"document.querySelectorAll('.opblock').length >= {len(operations)}"
    )
    summaries = swagger.page.locator(".opblock-summary-description").all_inner_texts()
    fetch = next(op for op in operations if op["operationId"] == "fetchRecords")
    assert fetch["summary"] in summaries
    swagger.page.locator(".opblock-summary-control").first.click()  # an operation opens
    swagger.page.locator(".opblock-body").first.wait_for()
    swagger.check()

    redoc = DocsPage(browser, server, "/redoc")
    assert "content-security-policy" in redoc.response.headers
    redoc.page.locator("[data-section-id^='operation/']").first.wait_for(state="attached")
    drawn = redoc.page.locator("[data-section-id^='operation/']").count()
    assert drawn >= len(operations), (drawn, len(operations))
    search = redoc.page.locator("input[placeholder='Search...']")
    search.fill("fetch records")  # searched by ReDoc's worker
    redoc.page.locator("[data-role='search:results'] li, [role='search'] + * li").first.wait_for()
    redoc.check()


def test_the_documents_pages_behind_auth_ask_for_one_token_then_load(
    tmp_path: Path, start, browser
) -> None:
    """With an auth file and no token, /docs and /redoc show one token field and what to do
    (not Swagger UI's red "Failed to load API definition"); once it is given the document loads,
    and Swagger UI's own Authorize dialog is not a second place to put a token. With no auth
    file the field is not shown at all."""
    auth = tmp_path / "auth.json"
    auth.write_text(json.dumps({"tokens": [{"name": "ops", "token": ADMIN, "role": "admin"}]}))
    server, _ = start(1, token=ADMIN, EVENTLOG_AUTH_FILE=str(auth))
    for path, drawn in (("/docs", ".opblock"), ("/redoc", "[data-section-id^='operation/']")):
        tab = DocsPage(browser, server, path)
        page = tab.page
        page.locator("#eventlog-token-why", has_text="give a bearer token").wait_for()
        assert page.locator("input[type=password]:visible").count() == 1, path
        assert page.get_by_text("Failed to load API definition").count() == 0, path
        assert page.locator(drawn).count() == 0, path
        page.locator("#eventlog-token-input").fill("not-a-token")
        page.locator("#eventlog-token-input").press("Enter")
        page.locator("#eventlog-token-why", has_text="refused this token").wait_for()
        page.locator("#eventlog-token-input").fill(ADMIN)
        page.locator("#eventlog-token-apply").click()
        page.locator(drawn).first.wait_for(state="attached")
        assert page.locator("input[type=password]:visible").count() == 1, path
        assert page.get_by_text("Failed to load API definition").count() == 0, path
        if path == "/docs":
            assert not page.locator(".swagger-ui .authorize").first.is_visible()
            # what is tried from the page carries the token
            page.locator("#operations-health-getReadiness .opblock-summary-control").click()
            page.locator(".try-out__btn").first.click()
            page.locator(".execute").first.click()
            page.locator(".live-responses-table .response-col_status", has_text="200").wait_for()
        # the refused fetches are console errors by Chromium's doing; nothing else may be
        tab.errors = [e for e in tab.errors if "status of 401" not in e]
        tab.check()
    assert server.stop() == 0
    open_server, _ = start(1)  # the same data dir, no auth file
    for path, drawn in (("/docs", ".opblock"), ("/redoc", "[data-section-id^='operation/']")):
        tab = DocsPage(browser, open_server, path)
        tab.page.locator(drawn).first.wait_for(state="attached")
        assert not tab.page.locator("#eventlog-token").is_visible(), path
        tab.check()


def test_whoami_and_maintenance_in_the_api(server: ServerProcess) -> None:
    with server.client() as client:
        me = client.get("/v1/whoami").json()
        assert (me["name"], me["role"], me["server"]["auth"]) == ("anonymous", "admin", False)
        assert set(me["actions"]) == {"admin", "write", "read", "describe", "group", "monitor"}
        client.post("/v1/topics", json={"name": "t", "partitions": 2}).raise_for_status()
        state = client.get("/v1/topics/t/partitions/1/maintenance").json()
        assert state["last_retention"] is None and state["cleanup_policy"] == "delete"
        run = client.post("/v1/admin/retention/run", json={"topic": "t", "partition": 1})
        assert run.status_code == 200
        after = client.get("/v1/topics/t/partitions/1/maintenance").json()["last_retention"]
        assert after["outcome"] == "ok" and after["result"]["segments_deleted"] == 0
        assert client.get("/v1/topics/t/partitions/0/maintenance").json()["last_retention"] is None
        assert after["at_ms"] <= int(datetime.now(timezone.utc).timestamp() * 1000)
        bad = client.post("/v1/admin/retention/run", json={"partition": 1})
        assert (bad.status_code, bad.json()["code"]) == (422, "validation_error")
        missing = client.post("/v1/admin/compaction/run", json={"topic": "t", "partition": 7})
        assert (missing.status_code, missing.json()["code"]) == (404, "partition_not_found")
        assert client.get("/v1/topics/t/partitions/9/maintenance").status_code == 404
        # a topic deleted and created again starts with no passes of its own
        assert client.delete("/v1/topics/t").status_code == 204
        client.post("/v1/topics", json={"name": "t", "partitions": 2}).raise_for_status()
        assert client.get("/v1/topics/t/partitions/1/maintenance").json()["last_retention"] is None


def test_the_console_files_ship_in_the_package() -> None:
    """The page and every asset it serves are files of the api package's console_assets/, which
    pyproject.toml's package-data puts in the wheel (and so in the Docker image, which installs
    the project with pip)."""
    import tomllib

    from api import console

    from ..conftest import REPO

    here = {p.name for p in (REPO / "api" / "console_assets").iterdir()}
    assert here == {"index.html", *console.ASSETS}
    package_data = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    assert "console_assets/*" in package_data["api"]


# the layout checks (layoutFaults, hiddenColumns), added to every page of a test that uses them
LAYOUT_CHECKS = (Path(__file__).parent / "layout_checks.js").read_text()


def test_every_view_fits_widths_from_a_phone_to_a_wide_screen(
    tmp_path: Path, start, console_factory
) -> None:
    """At 360, 390, 1366, 1920 and 2560 px wide, no view has an element wider than its panel
    (tables scroll inside theirs), the page never scrolls sideways, and every column of the
    partitions table can be seen (at once, or by scrolling its box). Behind an auth file, so
    the header holds the token form (without one it is hidden) at its widest."""
    auth = tmp_path / "auth.json"
    auth.write_text(json.dumps({"tokens": [{"name": "ops", "token": ADMIN, "role": "admin"}]}))
    server, client = start(1, token=ADMIN, EVENTLOG_AUTH_FILE=str(auth))
    name = "payments.settlements.eu-west-1.v2"
    configs = {
        "cleanup.policy": "compact,delete", "segment.bytes": "1048576",
        "message.timestamp.type": "LogAppendTime", "min.compaction.lag.ms": "3600000",
        "max.compaction.lag.ms": "604800000",
    }
    created = client.post("/v1/topics", json={"name": name, "partitions": 3, "configs": configs})
    created.raise_for_status()
    items = [{"sku": f"sku-{i}", "qty": i} for i in range(30)]
    value = json.dumps({"id": "x" * 400, "items": items})
    trace = [{"key": "trace-id", "value": "0af7651916cd43dd8448eb211c80319c" * 3}]
    records = [
        {"key": f"customer-{i}-{'k' * 60}", "value": value, "partition": i % 3, "headers": trace}
        for i in range(30)
    ]
    client.post(f"/v1/topics/{name}/records", json={"records": records}).raise_for_status()
    commits = [{"topic": name, "partition": p, "offset": 3, "metadata": "m" * 80} for p in range(3)]
    group = "settlement-reconciliation-job"
    client.post(f"/v1/groups/{group}/offsets", json={"offsets": commits}).raise_for_status()
    # a queue with a dead letter: its window's 11 columns and a long record in its dead letters
    queue, dead = "settlement-retries", f"{name}.dead-letters"
    client.post("/v1/topics", json={"name": dead}).raise_for_status()
    made = client.put(f"/v1/topics/{name}/queues/{queue}", json={"dead_letter_topic": dead})
    made.raise_for_status()
    leased = client.post(f"/v1/topics/{name}/queues/{queue}/lease", json={"max_records": 1})
    rejected = {"leases": [leased.json()["records"][0]["lease"]]}
    client.post(f"/v1/topics/{name}/queues/{queue}/reject", json=rejected).raise_for_status()
    wait_until(lambda: _fetch(client, dead, 0), what="a dead letter")
    console = console_factory(server)
    page = console.page
    page.add_init_script(LAYOUT_CHECKS)
    page.add_init_script(f"sessionStorage.setItem('eventlog-token', {json.dumps(ADMIN)})")
    views = {
        "#/topics": "#topics tbody tr",
        f"#/topics/{name}": "#partitions tbody tr",
        f"#/topics/{name}/partitions/0": "#segments tbody tr",
        f"#/topics/{name}/records": "#records tbody tr",
        f"#/topics/{name}/tail": "#tail-status",
        "#/groups": "#groups tbody tr",
        f"#/groups/{group}": "#group-offsets tbody tr",
        "#/snapshots": "#create-snapshot",
        "#/charts": "#charts .chart",
        "#/queues": "#queues tbody tr",
        f"#/queues/{name}/{queue}": "#dead-letters tbody tr",
    }
    for width in (360, 390, 1366, 1920, 2560):
        page.set_viewport_size({"width": width, "height": 900})
        for view, ready in views.items():
            console.open(view)
            page.locator(ready).first.wait_for()
            page.wait_for_timeout(50)  # the last layout
            faults = page.evaluate("layoutFaults()")
            assert not faults, (width, view, faults[:10])
            if view == f"#/topics/{name}":
                assert page.locator("#partitions thead th").count() == 6
                assert page.evaluate("hiddenColumns('partitions')") == [], width
                assert page.evaluate("hiddenColumns('configs')") == [], width
                if width in (390, 1366):
                    console.shot(f"topic-{width}px")
        # the header's token form, its buttons and the Local / UTC switch stay in the window
        header = ("#token-form button[type=submit]", "#token-clear", "#zone-switch [data-zone=utc]")
        for button in header:
            box = page.locator(button).bounding_box()
            assert box is not None and 0 <= box["x"] <= width - box["width"], (width, button, box)


def _lines(page) -> list[tuple[int, int]]:
    """(partition, offset) of the records browser's lines, top to bottom."""
    cells = page.locator("#records tr.line").evaluate_all(
        "rows => rows.map(r => [Number(r.dataset.partition), Number(r.dataset.offset)])"
    )
    return [tuple(c) for c in cells]


def _browsed(client: httpx.Client, topic: str, **params) -> list[tuple[int, int]]:
    params = {"limit": 500, "value_format": "base64", **params}
    answer = client.get(f"/v1/topics/{topic}/records", params=params)
    answer.raise_for_status()
    return [(r["partition"], r["offset"]) for r in answer.json()["records"]]


def _jump(c, picked: str, records: int) -> tuple[str, str | None]:
    """Types `picked` into the browser's from-time picker and jumps (oldest first): the first
    line's time as shown and its title (the other zone, on hover)."""
    c.page.locator("#browse-form input[name=from_time]").fill(picked)
    c.page.locator("#browse-form button[type=submit]").click()
    c.page.wait_for_function("n => document.querySelectorAll('#records tr.line').length == n",
                             arg=records)
    first = c.page.locator("#records tr.line td.time").first
    return first.inner_text(), first.get_attribute("title")


def _picker(page) -> str:
    """The from-time picker's value, with its seconds (Chromium leaves ":00" out)."""
    value = page.locator("#browse-form input[name=from_time]").input_value()
    return f"{value}:00" if len(value) == 16 else value


def _pressed(page) -> str:
    """The position of the header's Local / UTC switch (its pressed button)."""
    return page.locator("#zone-switch button[aria-pressed=true]").get_attribute("data-zone")


def _switch(c, zone: str) -> None:
    """Flips the header's Local / UTC switch and waits for the view drawn again."""
    before = c.page.locator("#records").element_handle()
    c.page.locator(f"#zone-switch button[data-zone={zone}]").click()
    c.page.wait_for_function("table => !table.isConnected", arg=before)
    c.page.locator("#records tr.line").first.wait_for()
    assert _pressed(c.page) == zone


def _times_agree_with_the_picker(c, client: httpx.Client) -> None:
    """In both positions of the header's Local / UTC switch: the table's times are in the zone
    shown (named), the other zone on hover, and the picker is read in that zone: a time picked
    starts the page at the record the API gives for that instant, and a time copied from the
    table starts it at that record. The switch keeps the jump on its instant and is remembered."""
    page = c.page
    zone = page.evaluate("Intl.DateTimeFormat().resolvedOptions().timeZone")
    local = "EST" if zone == "America/New_York" else "UTC"  # 2026-01-01 is in winter
    c.open("#/topics/events/records?mode=browse&order=oldest")
    page.locator("#records tr.line").first.wait_for()
    assert _pressed(page) == "local"
    header = page.locator("#records th", has_text="Timestamp (local)")
    assert header.get_attribute("title") == f"in {zone}"
    # Local (the default): T0 + 10 min is 19:10 on Dec 31 in New York
    picked = "2025-12-31T19:10:00" if local == "EST" else "2026-01-01T00:10:00"
    shown, title = _jump(c, picked, 21)
    assert shown == f"{picked.replace('T', ' ')}.000 {local}", shown
    assert title == "2026-01-01 00:10:00.000 UTC", title
    assert _lines(page) == _browsed(client, "events", order="oldest", from_time=T0 + 600_000)
    # a time copied from the table (the 8th line's, T0 + 17 min) starts the page at its record
    row = page.locator("#records tr.line").nth(7)
    wanted = (int(row.get_attribute("data-partition")), int(row.get_attribute("data-offset")))
    copied = row.locator("td.time").inner_text()[:19].replace(" ", "T")
    utc = row.locator("td.time").get_attribute("title")
    instant = datetime.strptime(utc, "%Y-%m-%d %H:%M:%S.%f UTC")
    at = int(instant.replace(tzinfo=timezone.utc).timestamp() * 1000)
    _jump(c, copied, len(_browsed(client, "events", order="oldest", from_time=at)))
    assert _lines(page)[0] == wanted == _browsed(client, "events", order="oldest", from_time=at)[0]

    # UTC: the same page, every time in UTC, the picker rewritten to the same instant
    _jump(c, picked, 21)
    _switch(c, "utc")
    assert _picker(page) == "2026-01-01T00:10:00"
    assert page.locator("#records th", has_text="Timestamp (UTC)").count() == 1
    first = page.locator("#records tr.line td.time").first
    assert first.inner_text() == "2026-01-01 00:10:00.000 UTC"
    assert first.get_attribute("title") == f"{picked.replace('T', ' ')}.000 {local}"
    assert _lines(page) == _browsed(client, "events", order="oldest", from_time=T0 + 600_000)
    shown, _ = _jump(c, "2026-01-01T00:20:00", 11)  # now read as UTC
    assert shown == "2026-01-01 00:20:00.000 UTC", shown
    assert _lines(page) == _browsed(client, "events", order="oldest", from_time=T0 + 1_200_000)
    row = page.locator("#records tr.line").nth(3)
    wanted = (int(row.get_attribute("data-partition")), int(row.get_attribute("data-offset")))
    _jump(c, row.locator("td.time").inner_text()[:19].replace(" ", "T"), 8)
    assert _lines(page)[0] == wanted
    # remembered (localStorage) on the next visit; newest first from a time, read as UTC
    c.open("#/topics/events/records?mode=browse")
    page.locator("#records tr.line").first.wait_for()
    assert _pressed(page) == "utc"
    page.locator("#browse-form input[name=from_time]").fill("2026-01-01T00:10:00")
    page.locator("#browse-form button[type=submit]").click()
    page.wait_for_function("() => document.querySelectorAll('#records tr.line').length == 11")
    assert _lines(page) == _browsed(client, "events", from_time=T0 + 600_000)
    _switch(c, "local")
    assert page.locator("#records tr.line td.time").first.inner_text().endswith(f" {local}")
    assert _picker(page) == picked
    assert _lines(page) == _browsed(client, "events", from_time=T0 + 600_000)


def test_the_records_browser_merges_partitions_filters_pages_and_jumps(start, console_factory):
    """The records view's first tab: every partition merged (GET /v1/topics/{t}/records, on a
    family of 2), newest or oldest first, one line a record that opens; filters on key, value
    text, header and partition; pages; a jump to an offset or a time (the picker read in the
    zone the table shows: the browser's, or UTC with the switch; also in a browser whose zone is
    not UTC)."""
    server, client = start(2)
    client.post("/v1/topics", json={"name": "events", "partitions": 3}).raise_for_status()
    records = [
        {"key": f"user-{i % 5}", "value": json.dumps({"n": i, "kind": ("view", "click")[i % 2]}),
         "partition": i % 3, "timestamp": T0 + i * 60_000,
         "headers": [{"key": "source", "value": "web" if i % 3 == 0 else "app"}]}
        for i in range(30)
    ]
    client.post("/v1/topics/events/records", json={"records": records}).raise_for_status()
    value = base64.b64encode(b"\x00\x01hello\xff").decode()
    binary = {"key": "YmlufQ==", "value": value, "partition": 1,
              "timestamp": T0 + 31 * 60_000}
    client.post("/v1/topics/events/records", json={"records": [binary], "key_format": "base64",
                                                    "value_format": "base64"}).raise_for_status()
    console = console_factory(server)
    page = console.page

    console.open("#/topics/events")
    page.locator("a", has_text="Browse records").first.click()
    page.locator("#records tr.line").first.wait_for()
    assert _lines(page) == _browsed(client, "events") and len(_lines(page)) == 31
    assert _lines(page)[0] == (1, 10)  # the newest: the binary value
    heights = page.locator("#records tr.line").evaluate_all("rows => rows.map(r => r.offsetHeight)")
    assert max(heights) < 40, heights  # one line a record
    assert '{"n":29,"kind":"click"}' in page.locator("#records tr.line").nth(1).inner_text()
    # a line opens to the whole record: hex with an ASCII column for bytes that are not UTF-8
    page.locator("#records tr.line").first.click()
    detail = page.locator("#records tr.detail")
    detail.wait_for()
    assert "00 01 68 65 6c 6c 6f ff" in detail.inner_text() and "|..hello.|" in detail.inner_text()
    page.locator("#records tr.line").nth(2).click()
    page.locator("#records tr.detail pre.json").wait_for()
    assert '"kind": "view"' in page.locator("#records tr.detail").nth(1).inner_text()  # n = 28
    console.shot("records-browser")
    page.locator("#records tr.line").first.click()
    assert page.locator("#records tr.detail").count() == 1

    # filters, each checked against the API's answer
    form = page.locator("#browse-form")
    form.locator("input[name=key]").fill("user-3")
    form.locator("input[name=value_contains]").fill("click")
    form.locator("button[type=submit]").click()
    page.wait_for_function("() => document.querySelectorAll('#records tr.line').length === 3")
    assert _lines(page) == _browsed(client, "events", key="user-3", value_contains="click")
    assert all("user-3" in row for row in page.locator("#records tr.line").all_inner_texts())
    form.locator("input[name=key]").fill("")
    form.locator("input[name=value_contains]").fill("")
    form.locator("input[name=header]").fill("source=web")
    form.locator("select[name=order]").select_option("oldest")
    form.locator("button[type=submit]").click()
    page.wait_for_function("() => document.querySelectorAll('#records tr.line').length === 10")
    assert _lines(page) == _browsed(client, "events", header="source=web", order="oldest")
    assert {p for p, _ in _lines(page)} == {0}
    form.locator("input[name=header]").fill("")
    form.locator("select[name=partition]").select_option("2")
    form.locator("button[type=submit]").click()
    page.wait_for_function("() => document.querySelector('#records .line')?.dataset.partition == 2")
    assert _lines(page) == [(2, o) for o in range(10)]

    # pages of 20, oldest first: Next, Previous, First
    console.open("#/topics/events/records?mode=browse&order=oldest&size=20")
    page.locator("#records tr.line").first.wait_for()
    every = _browsed(client, "events", order="oldest")
    assert _lines(page) == every[:20]
    page.locator("#next").click()
    page.wait_for_function("() => document.querySelectorAll('#records tr.line').length === 11")
    assert _lines(page) == every[20:] and page.locator("#next button").is_disabled()
    assert "the end" in page.locator("#browse-summary").inner_text()
    page.locator("#previous").click()
    page.wait_for_function("() => document.querySelectorAll('#records tr.line').length === 20")
    assert _lines(page) == every[:20] and page.locator("#previous button").is_disabled()

    # a jump to an offset (in each partition) and to a time
    form.locator("input[name=from_offset]").fill("8")
    form.locator("button[type=submit]").click()
    page.wait_for_function("() => document.querySelectorAll('#records tr.line').length === 7")
    assert _lines(page) == _browsed(client, "events", order="oldest", from_offset=8)
    zoned = console_factory(server, zone="America/New_York")  # UTC-5
    for c in (console, zoned):
        _times_agree_with_the_picker(c, client)
    zoned.shot("records-browser-filtered")


def _queue_numbers(page, table: str) -> list[list[str]]:
    """The cells of a queue table's rows, as shown (age cells give their data-ms instead)."""
    return page.locator(f"#{table} tbody tr").evaluate_all(
        "rows => rows.map(r => [...r.cells].map(c => c.dataset.ms ?? c.innerText.trim()))"
    )


def _close_ages(shown: list[list[str]], wanted: list[list[int]], age_column: int) -> None:
    """Rows equal, but for the age (now less a timestamp: it grew between the two reads)."""
    assert len(shown) == len(wanted), (shown, wanted)
    for row, expected in zip(shown, wanted, strict=True):
        assert [c.replace(",", "") for i, c in enumerate(row) if i != age_column] == [
            str(c) for i, c in enumerate(expected) if i != age_column
        ], (row, expected)
        assert abs(int(row[age_column]) - expected[age_column]) < 10_000, (row, expected)


def _window(queue: dict) -> list[list[int]]:
    fields = ("partition", "start_offset", "end_offset", "available", "leased", "acked",
              "dead_lettered", "lag", "redeliveries", "lost_to_retention", "oldest_unacked_age_ms")
    return [[p[f] for f in fields] for p in queue["partitions"]]


def test_a_queue_from_creation_to_dead_letters_sent_back_and_deletion(
    tmp_path: Path, start, console_factory
) -> None:
    """Create a queue from the form; lease, release and reject through the API until a record
    dead-letters; the queue page shows its window (equal to the API's describe) and the dead
    letter with the headers that say where it came from; Send back produces it to its source
    partition, where the queue leases it again; a consumer token sees no Send back; delete;
    a queue that starts at a time picked in the form."""
    auth = tmp_path / "auth.json"
    auth.write_text(json.dumps({"tokens": [
        {"name": "ops", "token": ADMIN, "role": "admin"},
        {"name": "jobs-worker", "token": READER, "role": "consumer", "topics": ["jobs"]},
    ]}))
    server, client = start(1, token=ADMIN, EVENTLOG_AUTH_FILE=str(auth))
    client.post("/v1/topics", json={"name": "jobs", "partitions": 2}).raise_for_status()
    client.post("/v1/topics", json={"name": "jobs.dead"}).raise_for_status()
    trace = [{"key": "trace", "value": "t-1"}]
    jobs = [{"key": k, "value": f"resize {k}.png", "partition": p, "headers": trace}
            for k, p in (("a", 0), ("b", 0), ("c", 0), ("d", 1), ("e", 1))]
    client.post("/v1/topics/jobs/records", json={"records": jobs}).raise_for_status()
    console = console_factory(server)
    page = console.page
    page.add_init_script(f"sessionStorage.setItem('eventlog-token', {json.dumps(ADMIN)})")

    console.open("#/queues")
    page.locator("#queues").wait_for()
    page.locator("nav a.active", has_text="Queues").wait_for()
    form = page.locator("#create-queue")
    form.locator("input[name=topic]").fill("jobs")
    form.locator("input[name=queue]").fill("work")
    form.locator("input[name=lock_ms]").fill("60000")
    form.locator("input[name=max_deliveries]").fill("4")
    form.locator("select[name=ordering]").select_option("key")
    form.locator("input[name=dead_letter_topic]").fill("jobs.dead")
    form.locator("button[type=submit]").click()
    page.locator("h1", has_text="work").wait_for()
    assert page.url.endswith("#/queues/jobs/work")
    queue = client.get("/v1/topics/jobs/queues/work").json()
    shown = ("lock_ms", "max_deliveries", "ordering", "start", "dead_letter_topic")
    assert [queue[f] for f in shown] == [60000, 4, "key", "earliest", "jobs.dead"]
    settings = page.locator("#queue-settings").inner_text()
    assert "1 min" in settings and "jobs.dead" in settings and "earliest" in settings

    # through the API: every record leased, released, leased again; b rejected, a and d acked
    base = "/v1/topics/jobs/queues/work"
    every = {"max_records": 100, "wait_ms": 2000}
    first = client.post(f"{base}/lease", json=every).json()["records"]
    assert len(first) == 5
    client.post(f"{base}/release", json={"leases": [r["lease"] for r in first]}).raise_for_status()
    again = client.post(f"{base}/lease", json=every).json()["records"]
    assert sorted(r["delivery_count"] for r in again) == [2] * 5
    by_key = {r["key"]: r for r in again}
    rejected = client.post(f"{base}/reject", json={"leases": [by_key["b"]["lease"]]}).json()
    assert rejected["results"][0]["status"] == "rejected"
    done = [by_key["a"]["lease"], by_key["d"]["lease"]]
    acked = client.post(f"{base}/ack", json={"leases": done}).json()
    assert [r["status"] for r in acked["results"]] == ["acked", "acked"]
    wait_until(lambda: len(_fetch(client, "jobs.dead", 0)) == 1, what="b dead-lettered")

    page.locator("#queue-refresh").click()  # the window after the API's actions
    cell = page.locator("#queue-partitions tbody tr[data-partition='0'] td").nth(6)
    cell.filter(has_text="1").wait_for()
    _close_ages(_queue_numbers(page, "queue-partitions"), _window(client.get(base).json()), 10)
    # another queue of the topic shares the dead-letter topic: its dead letter is not shown here
    other = "/v1/topics/jobs/queues/other"
    client.put(other, json={"dead_letter_topic": "jobs.dead"}).raise_for_status()
    leased = client.post(f"{other}/lease", json={"max_records": 1, "wait_ms": 2000})
    [theirs] = leased.json()["records"]
    client.post(f"{other}/reject", json={"leases": [theirs["lease"]]}).raise_for_status()
    wait_until(lambda: len(_fetch(client, "jobs.dead", 0)) == 2, what="the other's dead letter")
    client.delete(other).raise_for_status()
    page.reload()  # drawn again: the dead letter too
    dead = page.locator("#dead-letters tbody tr")
    dead.first.wait_for()
    assert dead.count() == 1
    cells = dead.first.locator("td")
    assert cells.nth(2).inner_text() == "jobs 0:1"
    assert cells.nth(3).inner_text() == "2"
    assert cells.nth(4).inner_text() == "rejected"
    assert cells.nth(5).inner_text() == "b" and cells.nth(6).inner_text() == "resize b.png"
    # the dead-letter headers are the columns before; the record's own are left
    assert cells.nth(7).inner_text() == "trace: t-1"
    console.shot("queue")

    # a consumer token reads the queue and its dead letters, but may not produce them back
    worker = console_factory(server)
    worker.page.add_init_script(f"sessionStorage.setItem('eventlog-token', {json.dumps(READER)})")
    worker.open("#/queues/jobs/work")
    worker.page.locator("#dead-letters tbody tr").first.wait_for()
    assert worker.page.locator("#dead-letters button.send-back").count() == 0
    worker.open("#/queues")
    worker.page.locator("#queues tbody tr[data-queue='work']").wait_for()

    dead.first.get_by_role("button", name="Send back").click()
    sent = page.locator("#dead-letters .sent")
    sent.wait_for()
    offset = int(sent.inner_text().split("offset ")[1])
    assert sent.inner_text().startswith("sent back: jobs partition 0,")
    page.locator("#queue-result", has_text=f"offset {offset}").wait_for()
    [back] = [r for r in _fetch(client, "jobs", 0) if r["offset"] == offset]
    assert (back["key"], back["value"], back["headers"]) == ("b", "resize b.png", trace)
    # the window drawn again after the send back: one more record available on partition 0
    wanted = _window(client.get(base).json())
    assert wanted[0][3] == 1 and wanted[0][2] == offset + 1
    page.wait_for_function(
        "n => document.querySelector(\"#queue-partitions tr[data-partition='0']\")"
        ".cells[2].innerText.trim() == String(n)",
        arg=offset + 1)
    _close_ages(_queue_numbers(page, "queue-partitions"), _window(client.get(base).json()), 10)
    # leased again (c and e are still leased: the sent-back record is the only one available)
    [leased] = client.post(f"{base}/lease", json=every).json()["records"]
    fields = ("partition", "offset", "key", "delivery_count")
    assert [leased[f] for f in fields] == [0, offset, "b", 1]

    # the list's values are the describe's sums
    console.open("#/queues")
    row = page.locator("#queues tbody tr[data-queue='work']")
    row.wait_for()
    parts = client.get(base).json()["partitions"]
    sums = [sum(p[f] for p in parts) for f in ("available", "leased", "dead_lettered")]
    shown = _queue_numbers(page, "queues")[0]
    assert shown[:3] == ["work", "jobs", "key"]
    assert [int(c.replace(",", "")) for c in shown[3:6]] == sums == [0, 3, 1]
    assert abs(int(shown[6]) - max(p["oldest_unacked_age_ms"] for p in parts)) < 10_000

    # delete: type the name to confirm
    row.locator("a", has_text="work").click()
    page.locator("#delete-queue").click()
    dialog = page.locator("dialog")
    dialog.locator("input").fill("wor")
    assert dialog.get_by_role("button", name="Delete").is_disabled()
    dialog.locator("input").fill("work")
    dialog.get_by_role("button", name="Delete").click()
    page.locator("#banner", has_text="Queue work deleted").wait_for()
    assert page.url.endswith("#/queues")
    missing = client.get(base)
    assert (missing.status_code, missing.json()["code"]) == (404, "queue_not_found")
    page.locator("#queues tbody tr", has_text="none").wait_for()

    # a queue that starts at a time: the picker is read in the zone shown (UTC in this browser)
    form = page.locator("#create-queue")
    form.locator("input[name=topic]").fill("jobs")
    form.locator("input[name=queue]").fill("later")
    form.locator("select[name=start]").select_option("time")
    form.locator("input[name=start_time]").fill("2026-01-01T00:00:00")
    form.locator("button[type=submit]").click()
    page.locator("h1", has_text="later").wait_for()
    later = client.get("/v1/topics/jobs/queues/later").json()
    assert (later["start"], later["dead_letter_topic"]) == ({"timestamp": T0}, None)
    settings = page.locator("#queue-settings").inner_text()
    assert "time 2026-01-01 00:00:00.000 UTC" in settings and "archived" in settings
    page.locator("#dead-letters-box", has_text="no dead-letter topic").wait_for()
