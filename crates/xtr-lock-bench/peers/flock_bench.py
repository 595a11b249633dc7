"""The Python half of flock-bench: xtr-lock 4.1.0's FlockStore, measured like the Rust side.

Usage: python flock_bench.py DIR CYCLES HANDOFFS   (prints one JSON object)
       python flock_bench.py --child DIR RESOURCE  (the cross-process waiter)
"""

import asyncio
import json
import subprocess
import sys
import time

from benchlib import cycles, handoffs, park, summary

from xtr_lock import FlockStore, LockFactory


def handoff_x(directory, factory, n):
    child = subprocess.Popen(
        [sys.executable, __file__, "--child", directory, "bench:py-xproc"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1,
    )
    holder = factory.create_lock("bench:py-xproc", ttl=None)
    samples = []
    for i in range(n):
        assert asyncio.run(holder.acquire(blocking=True))
        child.stdin.write("go\n")
        child.stdin.flush()
        assert child.stdout.readline().strip() == "waiting"
        time.sleep(park(i))
        released = time.monotonic_ns()
        asyncio.run(holder.release())
        got = int(child.stdout.readline())
        samples.append(got - released)
    child.stdin.close()
    child.wait()
    return summary(samples)


def child(directory, resource):
    factory = LockFactory(FlockStore(directory))
    for line in sys.stdin:
        if line.strip() != "go":
            break
        waiter = factory.create_lock(resource, ttl=None)
        print("waiting", flush=True)
        asyncio.run(waiter.acquire(blocking=True))
        got = time.monotonic_ns()
        asyncio.run(waiter.release())
        print(got, flush=True)


def main():
    if sys.argv[1] == "--child":
        child(sys.argv[2], sys.argv[3])
        return
    directory, n_cycles, n_handoffs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    factory = LockFactory(FlockStore(directory))
    result = {
        "cycle": asyncio.run(cycles(
            factory.create_lock("bench:py-uncontended", ttl=None), n_cycles, lambda l: l.acquire())),
        "handoff_in": asyncio.run(handoffs(
            lambda: factory.create_lock("bench:py-handoff", ttl=None), n_handoffs,
            lambda l: l.acquire(blocking=True))),
        "handoff_x": handoff_x(directory, factory, n_handoffs),
    }
    print(json.dumps(result))


main()
