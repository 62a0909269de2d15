"""Consumer-group offsets (engine/groups.py): indexed by group, so one group's offsets and a page
of the listing cost what they answer, not what the other groups hold (issue 28)."""

from __future__ import annotations

import random
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from engine import family as family_module
from engine.groups import CommittedOffset, GroupOffsets
from engine.log_manager import EngineConfig, open_engine

from .test_shards import family


def cfg(data: Path) -> EngineConfig:
    return EngineConfig(log_dirs=(data,))


def lines_run(call: Callable[[], Any]) -> tuple[int, Any]:
    """How many Python lines `call` runs, in every frame it enters: the work it does, counted
    the same on any machine (a scan over the stored offsets is a line per offset)."""
    count = 0

    def tracer(frame, event, arg):  # noqa: ANN001, ANN202
        nonlocal count
        if event == "line":
            count += 1
        return tracer

    sys.settrace(tracer)
    try:
        result = call()
    finally:
        sys.settrace(None)
    return count, result


def others(n: int) -> list[CommittedOffset]:
    return [CommittedOffset(f"other-{i:06d}", f"t{i % 7}", i % 3, i, "", 1) for i in range(n)]


async def test_one_groups_lookup_is_independent_of_other_groups(tmp_path: Path) -> None:
    work = []
    for n in (10, 20_000):
        async with open_engine(cfg(tmp_path / str(n))) as engine:
            groups = engine.groups
            assert isinstance(groups, GroupOffsets)
            await groups.merge(others(n))
            await groups.commit(
                "mine", [("t1", p, 10 + p, "") for p in range(4)] + [("t2", 0, 5, "x")]
            )
            fetch_all, got = lines_run(lambda: groups.fetch("mine"))  # noqa: B023
            assert [(c.topic, c.partition, c.offset) for c in got] == [
                ("t1", p, 10 + p) for p in range(4)
            ] + [("t2", 0, 5)]
            fetch_topic, got = lines_run(lambda: groups.fetch("mine", "t2"))  # noqa: B023
            assert [(c.topic, c.offset, c.metadata) for c in got] == [("t2", 5, "x")]
            fetch_none, got = lines_run(lambda: groups.fetch("nobody"))  # noqa: B023
            assert got == []
            page, got = lines_run(lambda: groups.groups_page(5, "other-000002"))  # noqa: B023
            assert got == ([f"other-{i:06d}" for i in range(3, 8)], "other-000007")
            work.append((fetch_all, fetch_topic, fetch_none, page))
    assert work[0] == work[1], work


async def test_the_index_matches_the_stored_offsets_through_every_change_and_a_replay(
    tmp_path: Path,
) -> None:
    rng = random.Random(28)
    model: dict[tuple[str, str, int], int] = {}
    names = [f"g{i}" for i in range(12)]
    topics = ["a", "b", "c"]

    def check(groups: GroupOffsets) -> None:
        for g in [*names, "never"]:
            want = sorted((t, p, o) for (mg, t, p), o in model.items() if mg == g)
            assert [(c.topic, c.partition, c.offset) for c in groups.fetch(g)] == want
            for t in topics:
                assert [(c.partition, c.offset) for c in groups.fetch(g, t)] == [
                    (p, o) for wt, p, o in want if wt == t
                ]
        assert groups.groups() == sorted({g for g, _t, _p in model})
        assert [(c.group, c.topic, c.partition, c.offset) for c in groups.committed()] == [
            (*k, o) for k, o in sorted(model.items())
        ]
        on_b = sorted({g for g, t, _p in model if t == "b"})
        assert groups.groups(lambda t: t == "b") == on_b
        # page through the groups with an offset on b, two at a time
        paged, after = [], None
        while True:
            page, after = groups.groups_page(2, after, lambda _g, ts: "b" in ts)
            paged += page
            assert len(page) <= 2
            if after is None:
                break
            assert page and after == page[-1]
        assert paged == on_b
        assert groups.page(None, 100) == [
            (g, sorted({t for mg, t, _p in model if mg == g})) for g in groups.groups()
        ]

    async with open_engine(cfg(tmp_path)) as engine:
        for t in topics:
            await engine.create_topic(t, 3)
        groups = engine.groups
        for step in range(150):
            g = rng.choice(names)
            roll = rng.random()
            if roll < 0.5:
                offsets = [
                    (rng.choice(topics), rng.randrange(3), rng.randrange(1000), "")
                    for _ in range(rng.randint(1, 4))
                ]
                await groups.commit(g, offsets)
                model.update({(g, t, p): o for t, p, o, _m in offsets})
            elif roll < 0.65:
                merged = [
                    CommittedOffset(
                        rng.choice(names), rng.choice(topics), rng.randrange(3), step, "m", 5
                    )
                    for _ in range(5)
                ]
                assert await groups.merge(merged) == 5
                model.update({(c.group, c.topic, c.partition): c.offset for c in merged})
            elif roll < 0.85:
                t = rng.choice([None, *topics])
                doomed = [k for k in model if k[0] == g and (t is None or k[1] == t)]
                assert await groups.delete(g, t) == len(doomed)
                for k in doomed:
                    del model[k]
            elif roll < 0.9:
                t = rng.choice(topics)
                doomed = [k for k in model if k[1] == t]
                assert await groups.forget_topic(t) == len(doomed)
                for k in doomed:
                    del model[k]
            if step % 10 == 0:
                check(groups)
        check(groups)
    async with open_engine(cfg(tmp_path)) as engine:
        check(engine.groups)  # replayed from __consumer_offsets


async def test_groups_page(tmp_path: Path) -> None:
    async with open_engine(cfg(tmp_path)) as engine:
        groups = engine.groups
        assert groups.groups_page(10) == ([], None)
        await groups.merge(
            [CommittedOffset(g, "t", 0, 1, "", 1) for g in ["b", "a", "d", "c", "e"]]
        )
        assert groups.groups_page(10) == (["a", "b", "c", "d", "e"], None)
        assert groups.groups_page(5) == (["a", "b", "c", "d", "e"], None)  # exactly the last page
        assert groups.groups_page(2) == (["a", "b"], "b")
        assert groups.groups_page(2, "b") == (["c", "d"], "d")
        assert groups.groups_page(2, "d") == (["e"], None)
        assert groups.groups_page(2, "bb") == (["c", "d"], "d")  # a name that is not a group
        assert groups.groups_page(2, "z") == ([], None)
        assert groups.groups_page(1, None, lambda g, _ts: g in "ace") == (["a"], "a")
        assert groups.groups_page(1, "a", lambda g, _ts: g in "ace") == (["c"], "c")
        assert groups.groups_page(1, "c", lambda g, _ts: g in "ace") == (["e"], None)
        await groups.delete("c")
        await groups.commit("aa", [("t", 0, 3, "")])
        assert groups.groups_page(10) == (["a", "aa", "b", "d", "e"], None)


@pytest.mark.parametrize("call_groups", [2, 3, 10_000])
async def test_a_follower_shard_pages_through_shard_0_in_bounded_calls(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, call_groups: int
) -> None:
    monkeypatch.setattr(family_module, "PAGE_CALL_GROUPS", call_groups)
    async with family(tmp_path) as (s0, s1):
        await s0.create_topic("t", 1)
        await s0.create_topic("u", 1)
        names = [f"g{i:02d}" for i in range(11)]
        await s1.groups.merge(
            [CommittedOffset(g, "u" if i % 3 else "t", 0, i, "", 1) for i, g in enumerate(names)]
        )
        calls = []
        real = s1.groups._call

        async def counted(what: str, *args: Any) -> Any:
            result = await real(what, *args)
            if what == "page":
                calls.append(len(result))
            return result

        monkeypatch.setattr(s1.groups, "_call", counted)
        assert await s1.groups.groups_page(4) == (names[:4], "g03")
        assert await s1.groups.groups_page(4, "g07") == (names[8:], None)
        on_t = [g for i, g in enumerate(names) if i % 3 == 0]
        assert await s1.groups.groups_page(2, None, lambda _g, ts: "t" in ts) == (on_t[:2], "g03")
        assert await s1.groups.groups_page(2, "g03", lambda _g, ts: "t" in ts) == (on_t[2:], None)
        assert await s1.groups.groups() == names
        assert await s1.groups.groups(lambda t: t == "t") == on_t
        assert calls and max(calls) <= call_groups
        assert s0.groups.groups_page(100) == (names, None)
