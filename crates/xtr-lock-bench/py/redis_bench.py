"""The Python half of redis-bench: xtr-lock 4.1.0's RedisStore and redis-py's Lock.

Usage: python redis_bench.py DSN CYCLES HANDOFFS   (prints one JSON object)
Latencies in µs: p50/p99 of an uncontended acquire+release, and of the hand-off from a release
to a blocked waiter (two tasks in one event loop; both peers poll while blocked).
"""

import asyncio
import json
import sys
import time

from benchlib import park, summary

import redis.asyncio as aioredis
from xtr_lock import LockFactory, StoreFactory


async def xtr(dsn, cycles, handoffs):
    factory = LockFactory(StoreFactory.create_store(dsn))
    lock = factory.create_lock("bench:py-cycle", ttl=30)
    samples = []
    for _ in range(cycles):
        t = time.perf_counter_ns()
        assert await lock.acquire()
        await lock.release()
        samples.append(time.perf_counter_ns() - t)
    cycle = summary(samples)
    samples = []
    holder = factory.create_lock("bench:py-handoff", ttl=30)
    for i in range(handoffs):
        assert await holder.acquire(blocking=True)
        waiter = factory.create_lock("bench:py-handoff", ttl=30)

        async def wait():
            await waiter.acquire(blocking=True)
            got = time.monotonic_ns()
            await waiter.release()
            return got

        task = asyncio.create_task(wait())
        await asyncio.sleep(park(i))
        released = time.monotonic_ns()
        await holder.release()
        samples.append(await task - released)
    return {"cycle": cycle, "handoff": summary(samples)}


async def redis_py(dsn, cycles, handoffs):
    client = aioredis.Redis.from_url(dsn)
    lock = client.lock("bench:rpy-cycle", timeout=30)
    samples = []
    for _ in range(cycles):
        t = time.perf_counter_ns()
        assert await lock.acquire(blocking=False)
        await lock.release()
        samples.append(time.perf_counter_ns() - t)
    cycle = summary(samples)
    samples = []
    for i in range(handoffs):
        holder = client.lock("bench:rpy-handoff", timeout=30)
        assert await holder.acquire()
        waiter = client.lock("bench:rpy-handoff", timeout=30)

        async def wait():
            await waiter.acquire()
            got = time.monotonic_ns()
            await waiter.release()
            return got

        task = asyncio.create_task(wait())
        await asyncio.sleep(park(i))
        released = time.monotonic_ns()
        await holder.release()
        samples.append(await task - released)
    await client.aclose()
    return {"cycle": cycle, "handoff": summary(samples)}


async def main():
    dsn, cycles, handoffs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    print(json.dumps({
        "xtr": await xtr(dsn, cycles, handoffs),
        "redis_py": await redis_py(dsn, cycles, handoffs),
    }))


asyncio.run(main())
