"""A producer process for crash tests: appends forever, printing each acknowledgement.

    python -m tests.engine.crash_writer DATA_DIR RUN_ID

Creates topic "crash" (3 partitions, small segments) if needed, then runs 6 producers that
append batches of 1-20 records (some compressed). After every acknowledged append it prints
"ACK <partition> <base_offset> <value>..." and flushes, so the parent knows exactly what was
acknowledged when it SIGKILLs this process.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

import anyio

from engine.errors import TopicExistsError
from engine.log_manager import EngineConfig, open_engine
from engine.partition_log import prepare_batches
from engine.records import encode_batch


async def main(data_dir: Path, run_id: str) -> None:
    async with open_engine(EngineConfig(log_dirs=(data_dir,), checkpoint_interval_ms=200)) as engine:
        try:
            await engine.create_topic("crash", 3, {"segment.bytes": 64 * 1024, "index.interval.bytes": 1024})
        except TopicExistsError:
            pass
        print("READY", flush=True)

        async def produce(p: int) -> None:
            rng = random.Random(f"{run_id}-{p}")
            i = 0
            while True:
                partition = rng.randrange(3)
                log = engine.partition("crash", partition)
                values = [f"{run_id}:{p}:{i}:{j}".encode() + b"." * rng.randrange(300) for j in range(rng.randint(1, 20))]
                batch = encode_batch(0, [(b"k%d" % p, v, 1_700_000_000_000 + i, []) for v in values], compression_type=rng.choice([0, 0, 1, 3]))
                result = await log.append(prepare_batches(batch, log.config))
                sys.stdout.write(f"ACK {partition} {result.base_offset} " + " ".join(v.decode() for v in values) + "\n")
                sys.stdout.flush()
                i += 1

        async with anyio.create_task_group() as tg:
            for p in range(6):
                tg.start_soon(produce, p)


if __name__ == "__main__":
    anyio.run(main, Path(sys.argv[1]), sys.argv[2])
