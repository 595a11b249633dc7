"""The Python half of quorum-bench: xtr-lock 4.1.0's CombinedStore (consensus) over RedisStores.

Usage: python quorum_bench.py CYCLES DSN...   (prints one JSON object: {n, p50_us, p99_us})
The peer asks its stores one after another, as the issue says the peers do.
"""

import asyncio
import json
import sys
import time

from benchlib import summary

from xtr_lock import CombinedStore, ConsensusStrategy, LockFactory, StoreFactory


async def main():
    cycles, dsns = int(sys.argv[1]), sys.argv[2:]
    store = CombinedStore([StoreFactory.create_store(d) for d in dsns], ConsensusStrategy())
    lock = LockFactory(store).create_lock("bench:py-quorum", ttl=30)
    for _ in range(100):  # connections, scripts
        assert await lock.acquire()
        await lock.release()
    samples = []
    for _ in range(cycles):
        t = time.perf_counter_ns()
        assert await lock.acquire()
        await lock.release()
        samples.append(time.perf_counter_ns() - t)
    await store.close()
    print(json.dumps(summary(samples)))


asyncio.run(main())
