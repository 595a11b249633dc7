"""The Python half of quorum-bench: xtr-lock 4.1.0's CombinedStore (consensus) over RedisStores.

Usage: python quorum_bench.py CYCLES DSN...   (prints one JSON object: {n, p50_us, p99_us})
The peer asks its stores one after another, as the issue says the peers do.
"""

import asyncio
import json
import sys

from benchlib import cycles

from xtr_lock import CombinedStore, ConsensusStrategy, LockFactory, StoreFactory


async def main():
    n, dsns = int(sys.argv[1]), sys.argv[2:]
    store = CombinedStore([StoreFactory.create_store(d) for d in dsns], ConsensusStrategy())
    lock = LockFactory(store).create_lock("bench:py-quorum", ttl=30)
    await cycles(lock, 100, lambda l: l.acquire())  # connections, scripts
    result = await cycles(lock, n, lambda l: l.acquire())
    await store.close()
    print(json.dumps(result))


asyncio.run(main())
