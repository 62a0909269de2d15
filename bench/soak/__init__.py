"""The soak under faults: `python -m bench.soak --minutes N --kill-every M [--seed S]`.

A mixed load (JSON and raw producers, idempotent and conditional producers, fetchers,
long-pollers, SSE tailers, retention and compaction passes, snapshots) against one `eventlog
serve` process that is SIGKILLed every M seconds (jittered by the seed) and started again on
the same data dir. After every restart and at the end, the log is read back through the API
(and decoded from disk with kafka-python) and judged against a model of what the clients were
told: no acknowledged record lost, no offset duplicated, the compacted topic's table view as the
model's. See docs/RELIABILITY.md.

Between some kills the runner fills one topic's disk (injected ENOSPC: appends must answer 507
and leave nothing behind, reads go on) or slows every fsync; idempotent and conditional
producers retry each request in doubt with its Idempotency-Key until it is answered, and their
records must then be in the log exactly once.

Modules: model (what the clients know), load (the tasks), exact (the idempotent and conditional
producers), phases (the disk-fault phases), queue (the queue workers, their drain and
judgement), server (the subprocess), verify (the judgement, API and disk), runner (the
kill/restart/verify cycle: run_soak(SoakConfig)), report (JSON and plot).
Nothing is imported here, so tests can use model and verify alone.
"""
