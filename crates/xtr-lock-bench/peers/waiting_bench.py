"""The Python half of waiting-bench (xtr-lock 4.1.0).

Usage:
  python waiting_bench.py hold DSN RESOURCE       holds RESOURCE: prints "held", releases at the
                                                   next line on stdin, prints "released"
  python waiting_bench.py wait DSN RESOURCE N     N blocked waiters on RESOURCE: prints "parked",
                                                   stops at the next line on stdin
  python waiting_bench.py memory DSN N            bytes per held lock (tracemalloc), as JSON
"""

import asyncio
import json
import sys
import tracemalloc

from xtr_lock import LockFactory, StoreFactory


async def next_line():
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)


async def hold(dsn, resource):
    lock = LockFactory(StoreFactory.create_store(dsn)).create_lock(resource, ttl=60)
    assert await lock.acquire(blocking=False)
    print("held", flush=True)
    await next_line()
    await lock.release()
    print("released", flush=True)


async def wait(dsn, resource, n):
    factory = LockFactory(StoreFactory.create_store(dsn))
    locks = [factory.create_lock(resource, ttl=60) for _ in range(n)]
    tasks = [asyncio.create_task(lock.acquire(blocking=True)) for lock in locks]
    await asyncio.sleep(0.5)  # every waiter made its first attempt
    print("parked", flush=True)
    await next_line()
    for t in tasks:
        t.cancel()


async def memory(dsn, n):
    factory = LockFactory(StoreFactory.create_store(dsn))
    warm = factory.create_lock("bench:mem:warm", ttl=60)
    assert await warm.acquire(blocking=False)
    await warm.release()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    held = []
    for i in range(n):
        lock = factory.create_lock(f"bench:mem:{i:06}", ttl=60)
        assert await lock.acquire(blocking=False)
        held.append(lock)
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    for lock in held:
        await lock.release()
    print(json.dumps({"bytes_per_lock": (after - before) / n}))


def main():
    mode = sys.argv[1]
    if mode == "hold":
        asyncio.run(hold(sys.argv[2], sys.argv[3]))
    elif mode == "wait":
        asyncio.run(wait(sys.argv[2], sys.argv[3], int(sys.argv[4])))
    elif mode == "memory":
        asyncio.run(memory(sys.argv[2], int(sys.argv[3])))
    else:
        raise SystemExit(f"unknown mode {mode}")


if __name__ == "__main__":
    main()
