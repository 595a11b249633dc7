"""The Python half of redis-bench: xtr-lock 4.1.0's RedisStore and redis-py's Lock.

Usage: python redis_bench.py DSN CYCLES HANDOFFS   (prints one JSON object)
Latencies in µs: p50/p99 of an uncontended acquire+release, and of the hand-off from a release
to a blocked waiter (two tasks in one event loop; both peers poll while blocked).
"""

import asyncio
import json
import sys

from benchlib import cycles, handoffs

import redis.asyncio as aioredis
from xtr_lock import LockFactory, StoreFactory


async def xtr(dsn, n_cycles, n_handoffs):
    factory = LockFactory(StoreFactory.create_store(dsn))
    new = lambda resource: factory.create_lock(resource, ttl=30)
    return {
        "cycle": await cycles(new("bench:py-cycle"), n_cycles, lambda l: l.acquire()),
        "handoff": await handoffs(
            lambda: new("bench:py-handoff"), n_handoffs, lambda l: l.acquire(blocking=True)),
    }


async def redis_py(dsn, n_cycles, n_handoffs):
    client = aioredis.Redis.from_url(dsn)
    new = lambda resource: client.lock(resource, timeout=30)
    result = {
        "cycle": await cycles(
            new("bench:rpy-cycle"), n_cycles, lambda l: l.acquire(blocking=False)),
        "handoff": await handoffs(lambda: new("bench:rpy-handoff"), n_handoffs,
                                  lambda l: l.acquire()),
    }
    await client.aclose()
    return result


async def main():
    dsn, n_cycles, n_handoffs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    print(json.dumps({
        "xtr": await xtr(dsn, n_cycles, n_handoffs),
        "redis_py": await redis_py(dsn, n_cycles, n_handoffs),
    }))


asyncio.run(main())
