"""Reproducible benchmarks of the storage engine, each measured next to its peer or physical
limit in the same run (see bench/README.md). Run with `make bench` or `python -m bench`.

Modules: harness (context, machine facts, dd, reports), data (pre-encoded batches), and one
module per benchmark: append, read, lookup, restart (the engine in-process); http_produce,
http_raw, http_fetch (the HTTP API: `eventlog serve` as a subprocess, next to redis-server and
nats-server, with servers.py starting and stopping them); compaction (workers.cleaner's pass in a
fresh process, and produce latency of a real server while a pass runs); snapshot (1,000 segments
against cp -al and cp -r); spark (the eventlog PySpark data source against spark.read.parquet
of the same rows); http_shards (JSON produce from wrk against `eventlog serve --processes 1`
and `--processes 2`, with the server's cores per cell); http_small (one-record appends over 100
partitions from wrk, against Redis with appendfsync always); http_fanout (1,000 SSE subscribers
of one partition, from the C client in bench/fanout/, against Redis pub/sub); groups (one consumer
group's offsets and a page of GET /v1/groups at 10 to 100,000 groups); kafka_small (256 B
records over 100 partitions from librdkafka producers, against Redis AOF always -P 16 and our HTTP
one-record path) and kafka_consume (librdkafka reading 1 GB against cat of the segment files),
with kafka_clients holding their librdkafka load; keys_compaction (per-key reads around a
compaction pass) and scale (start, stop and the first append after a restart against
partitions and stored data, as log-log slopes); queues (workers leasing 100 records and
acknowledging them, against Redis Streams XREADGROUP + XACK and NATS JetStream); first_hour
(`make run` on a fresh clone until /readyz answers, and the size of the venv it made).
bench/capacity/ is the capacity run for big machines (its own scripts; see bench/README.md).
"""

BENCHMARKS = (
    "append", "read", "lookup", "restart", "http_produce", "http_raw", "http_fetch", "compaction", "snapshot", "spark",
    "http_shards", "http_small", "http_fanout", "http_keys", "groups",
    "kafka_small", "kafka_consume", "keys_compaction", "scale", "queues", "first_hour",
)
