"""librdkafka load for the Kafka benchmarks (bench.kafka_small, bench.kafka_consume) and the
capacity run (bench/capacity/load.py): producer processes, a counting consumer, and kcat.

Standard library and confluent-kafka only, so the capacity run can import it where it has only
the project on sys.path and the wheels of .device/; and light to import, because every producer
process is started with the "spawn" method and imports this module afresh (matplotlib, httpx
and the rest of the benchmarks stay out of it).

Producers run in processes of their own: confluent-kafka's produce() costs 1-2 us of Python per
record, and a delivery report another, so one Python thread producing small records can be what
bounds the rate; several processes, each with its own librdkafka instance (its own connections
to every broker, its own batches), take that out of the measurement. Only failed deliveries are
reported back to Python (delivery.report.only.error): after flush() returns 0, every message
was acknowledged or counted as failed.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import resource
import shutil
import subprocess
import time
from typing import Any

PRODUCER_CONFIG = {
    "acks": "all",
    "linger.ms": 5,
    "enable.idempotence": True,  # the Java client's default since Kafka 3.0 (librdkafka's: false)
    "delivery.report.only.error": True,
}
CONSUMER_CONFIG = {
    "group.id": "bench-consume",  # librdkafka wants one; partitions are assign()ed, none committed
    "enable.auto.commit": False,
    "enable.partition.eof": True,
    "fetch.max.bytes": 64 << 20,
    # 4 MiB per partition: 1 MiB (the default) and 16 MiB were no faster here (kcat, 1 GB)
    "max.partition.fetch.bytes": 4 << 20,
    "queued.max.messages.kbytes": 256 << 10,
    # librdkafka stops fetching a partition whose local queue holds queued.min.messages (100,000
    # by default) and retries after fetch.queue.backoff.ms (1 s): a reader that drains the queue
    # in 0.4 s then waits 0.6 s with nothing to read. A reader of a whole topic wants neither.
    "queued.min.messages": 1_000_000,
    "fetch.queue.backoff.ms": 10,  # (librdkafka >= 2.1; not passed to an older kcat)
}
KCAT_SETTINGS = (
    "fetch.max.bytes",
    "max.partition.fetch.bytes",
    "queued.max.messages.kbytes",
    "queued.min.messages",
)
FLUSH_TIMEOUT_S = 120.0
READY_TIMEOUT_S = 60.0
CONSUME_TIMEOUT_S = 600.0


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)  # every thread: librdkafka's too
    return usage.ru_utime + usage.ru_stime


# -- producers ----------------------------------------------------------------------------------


def _producer(
    job: dict[str, Any], index: int, ready: Any, go: Any, start: Any, results: Any
) -> None:
    """One producer process: connect, wait for the common start, produce() one value cycling
    over the partitions for job["seconds"], flush; report the counts, the seconds from the
    common start to the flush's end, and the CPU spent from the start on."""
    from confluent_kafka import KafkaException, Producer

    failed: dict[str, int] = {}

    def on_delivery(err: Any, _msg: Any) -> None:  # only failures come here
        failed[str(err)] = failed.get(str(err), 0) + 1

    topic, partitions = job["topic"], job["partitions"]
    config = {"bootstrap.servers": job["bootstrap"], **PRODUCER_CONFIG, **job["config"]}
    producer = Producer({**config, "on_delivery": on_delivery})
    try:
        producer.list_topics(topic, timeout=30)
    except KafkaException as exc:
        results.put({"index": index, "error": str(exc)})
        ready.put(index)
        return
    value = b"v" * job["value_bytes"]
    produce, poll = producer.produce, producer.poll
    partition = (index * 37) % partitions  # each producer starts elsewhere
    sent = full = 0
    ready.put(index)
    go.wait()
    t0 = start.value
    cpu0 = _cpu_seconds()
    end = t0 + job["seconds"]
    while time.time() < end:
        for _ in range(500):
            try:
                produce(topic, value, partition=partition)
            except BufferError:  # queue.buffering.max.messages reached: the brokers are behind
                full += 1
                poll(0.001)
                continue
            sent += 1
            partition += 1
            if partition == partitions:
                partition = 0
        poll(0)
    produced = time.time()
    left = producer.flush(FLUSH_TIMEOUT_S)
    done = time.time()
    results.put(
        {
            "index": index,
            "sent": sent,
            "failed": sum(failed.values()),
            "errors": failed,
            "unflushed": left,
            "queue_full_waits": full,
            "produce_seconds": round(produced - t0, 4),
            "seconds": round(done - t0, 4),
            "cpu_seconds": round(_cpu_seconds() - cpu0, 4),
        }
    )


def run_producers(
    bootstrap: str,
    topic: str,
    partitions: int,
    value_bytes: int,
    count: int,
    seconds: float,
    *,
    config: dict[str, Any] | None = None,
    on_start: Any = None,
    cpus: list[int] | None = None,
) -> dict[str, Any]:
    """`count` producer processes (spawned, each connected before the start) producing for
    `seconds` from a common start; `on_start()` is called just before it (to start meters).
    Returns the summed counts, the wall time from the common start to the last flush's end and
    every producer's own report. `cpus`: pin the processes there (sched_setaffinity)."""
    job = {
        "bootstrap": bootstrap,
        "topic": topic,
        "partitions": partitions,
        "value_bytes": value_bytes,
        "seconds": seconds,
        "config": config or {},
    }
    spawn = mp.get_context("spawn")
    ready, results, go, start = spawn.Queue(), spawn.Queue(), spawn.Event(), spawn.Value("d", 0.0)
    procs = [
        spawn.Process(target=_producer, args=(job, i, ready, go, start, results), daemon=True)
        for i in range(count)
    ]
    for proc in procs:
        proc.start()
        if cpus and proc.pid is not None:
            os.sched_setaffinity(proc.pid, cpus)
    try:
        for _ in procs:
            ready.get(timeout=READY_TIMEOUT_S)
        if on_start is not None:
            on_start()
        start.value = time.time() + 0.02
        go.set()
        outs = [results.get(timeout=seconds + FLUSH_TIMEOUT_S + 60) for _ in procs]
    finally:
        for proc in procs:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.kill()
    broken = [o for o in outs if "error" in o]
    if broken:
        raise RuntimeError(f"producer failed: {broken}")
    sent = sum(o["sent"] for o in outs)
    failed = sum(o["failed"] for o in outs)
    unflushed = sum(o["unflushed"] for o in outs)
    return {
        "sent": sent,
        "failed": failed,
        "unflushed": unflushed,
        "acknowledged": sent - failed - unflushed,
        "seconds": max(o["seconds"] for o in outs),
        "producer_cpu_seconds": round(sum(o["cpu_seconds"] for o in outs), 3),
        "producers": sorted(outs, key=lambda o: o["index"]),
    }


# -- consumers ----------------------------------------------------------------------------------


def consume_all(
    bootstrap: str, topic: str, partitions: int, expected: int, config: dict[str, Any] | None = None
) -> dict[str, Any]:
    """confluent_kafka.Consumer reading every partition of `topic` from the beginning until it
    has `expected` messages, counting messages and value bytes (len(value()) of each, so every
    message is materialised in Python as an application would see it). Seconds from creating
    the consumer (connections, metadata and offset look-ups included, as in a kcat process) to
    the last message, and this process's CPU in that time.

    The end is the count, not the partitions' EOF events: an EOF comes from a fetch at the high
    watermark, which the broker holds for fetch.wait.max.ms (500 ms) before answering empty, a
    wait that is no part of reading; and consume() is asked for at most the messages still
    missing, so it never sits out its timeout waiting for a batch that cannot fill."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

    cpu0 = _cpu_seconds()
    t0 = time.perf_counter()
    consumer = Consumer({"bootstrap.servers": bootstrap, **CONSUMER_CONFIG, **(config or {})})
    try:
        # leaders first: partitions assign()ed before the metadata is in have their offset
        # look-ups retried ~0.5 s later (kcat's legacy consumer waits for metadata itself)
        consumer.list_topics(topic, timeout=30)
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
        messages = value_bytes = 0
        ended: set[int] = set()
        while messages < expected:
            batch = consumer.consume(num_messages=min(10_000, expected - messages), timeout=1.0)
            for msg in batch:
                err = msg.error()
                if err is None:
                    messages += 1
                    value_bytes += len(msg.value())
                elif err.code() == KafkaError._PARTITION_EOF:
                    ended.add(msg.partition())
                else:
                    raise RuntimeError(f"consume: {err}")
            if len(ended) == partitions and messages < expected:
                raise RuntimeError(f"consume: every partition ended at {messages} of {expected}")
            if time.perf_counter() - t0 > CONSUME_TIMEOUT_S:
                raise RuntimeError(f"consume: {messages} of {expected} messages after 600 s")
        seconds = time.perf_counter() - t0
        return {
            "messages": messages,
            "value_bytes": value_bytes,
            "seconds": round(seconds, 4),
            "client_cpu_seconds": round(_cpu_seconds() - cpu0, 4),
        }
    finally:
        consumer.close()


def _consume_child(job: tuple[Any, ...], results: Any) -> None:
    try:
        results.put(consume_all(*job))
    except Exception as exc:  # noqa: BLE001 -- reported to the parent, which raises it
        results.put({"error": repr(exc)})


def consume_in_process(
    bootstrap: str,
    topic: str,
    partitions: int,
    expected: int,
    *,
    config: dict[str, Any] | None = None,
    cpus: list[int] | None = None,
) -> dict[str, Any]:
    """consume_all in a spawned process of its own, pinned to `cpus` (the capacity run keeps
    its clients off the server's CPUs); its seconds and CPU are the child's, measured there."""
    spawn = mp.get_context("spawn")
    results = spawn.Queue()
    job = (bootstrap, topic, partitions, expected, config)
    proc = spawn.Process(target=_consume_child, args=(job, results), daemon=True)
    proc.start()
    if cpus and proc.pid is not None:
        os.sched_setaffinity(proc.pid, cpus)
    try:
        out = results.get(timeout=CONSUME_TIMEOUT_S + 60)
    finally:
        proc.join(timeout=10)
        if proc.is_alive():
            proc.kill()
    if "error" in out:
        raise RuntimeError(f"consumer process: {out['error']}")
    return out


def kcat_binary() -> str | None:
    return shutil.which("kcat") or shutil.which("kafkacat")


def kcat_consume(
    bootstrap: str,
    topic: str,
    expected_messages: int,
    *,
    check: bool = False,
    config: dict[str, Any] | None = None,
    taskset: list[str] | None = None,
) -> dict[str, Any]:
    """kcat (librdkafka in C) reading `topic` from the beginning, every value written to
    /dev/null: no Python on the client side. It exits at the last message (-c, as consume_all
    does; -e alone would add the broker's fetch.wait.max.ms at the high watermark before the
    EOF it waits for). With `check`, it prints each message's value size instead and the sizes
    are counted here (a pass that verifies what kcat reads; not for timing). A non-zero exit,
    or a short count, is an error."""
    binary = kcat_binary()
    if binary is None:
        raise RuntimeError("kcat not found: apt-get install -y kcat")
    settings = {k: v for k, v in CONSUMER_CONFIG.items() if k in KCAT_SETTINGS}
    settings.update(config or {})
    cmd = [*(taskset or []), binary, "-C", "-b", bootstrap, "-t", topic, "-o", "beginning"]
    cmd += ["-e", "-q", "-c", str(expected_messages)]
    for key, value in settings.items():
        cmd += ["-X", f"{key}={value}"]
    if check:
        cmd += ["-f", "%S\n"]
    usage0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    done = subprocess.run(
        cmd,
        stdout=subprocess.PIPE if check else subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        check=False,
    )
    seconds = time.perf_counter() - t0
    usage1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        stderr = done.stderr.decode(errors="replace")[-2000:]
        raise RuntimeError(f"{' '.join(cmd)} exited with {done.returncode}: {stderr}")
    cpu = usage1.ru_utime + usage1.ru_stime - usage0.ru_utime - usage0.ru_stime
    out: dict[str, Any] = {
        "seconds": round(seconds, 4),
        "client_cpu_seconds": round(cpu, 4),
        "command": " ".join(cmd),
    }
    if check:
        sizes = [int(x) for x in done.stdout.split()]
        out["messages"], out["value_bytes"] = len(sizes), sum(sizes)
        if len(sizes) != expected_messages:
            raise RuntimeError(
                f"kcat read {len(sizes)} messages, the topic holds {expected_messages}"
            )
    return out
