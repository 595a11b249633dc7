"""The Python half of pubsub-bench: portalocker 4.4.2's RedisLock, defaults unless said.

Usage:
  pubsub_bench.py PORT cycle N            JSON: acquire, release, acquire+release samples (ns)
  pubsub_bench.py PORT handoff N          JSON: release -> a waiting thread holds, samples (ns)
  pubsub_bench.py PORT hold CHANNEL       takes the lock, prints "ACQUIRED <monotonic ns>",
                                          on a stdin line prints "RELEASING <ns>" and releases
  pubsub_bench.py PORT readers CHANNEL S  a reader holding 0.3 s, again at once, for S seconds
  pubsub_bench.py PORT writer CHANNEL N   N exclusive acquisitions (held 0.05 s); JSON waits (ns)
Times are CLOCK_MONOTONIC nanoseconds, comparable with the Rust side's.
"""

import json
import sys
import threading
import time

import redis
from benchlib import park
from portalocker import RedisLock
from portalocker.constants import LockFlags


def client(port):
    return redis.Redis(host="127.0.0.1", port=port, decode_responses=True)


def cycle(port, n):
    conn = client(port)
    acquire, release, both = [], [], []
    for _ in range(n):
        lock = RedisLock("bench-py-cycle", connection=conn, fail_when_locked=True, timeout=0)
        t0 = time.monotonic_ns()
        lock.acquire()
        t1 = time.monotonic_ns()
        lock.release()
        t2 = time.monotonic_ns()
        acquire.append(t1 - t0)
        release.append(t2 - t1)
        both.append(t2 - t0)
    return {"acquire": acquire, "release": release, "cycle": both}


def handoff(port, n):
    conn = client(port)
    samples = []
    for i in range(n):
        holder = RedisLock("bench-py-handoff", connection=conn, timeout=30)
        holder.acquire()
        got = {}
        started = threading.Event()

        def wait():
            waiter = RedisLock("bench-py-handoff", connection=client(port), timeout=30)
            started.set()
            waiter.acquire()
            got["at"] = time.monotonic_ns()
            waiter.release()

        thread = threading.Thread(target=wait)
        thread.start()
        started.wait()
        time.sleep(park(i))
        released = time.monotonic_ns()
        holder.release()
        thread.join()
        samples.append(got["at"] - released)
    return {"handoff": samples}


def hold(port, channel):
    lock = RedisLock(channel, connection=client(port), timeout=60, check_interval=0.25)
    lock.acquire()
    print("ACQUIRED", time.monotonic_ns(), flush=True)
    sys.stdin.readline()
    print("RELEASING", time.monotonic_ns(), flush=True)
    lock.release()
    print("RELEASED", time.monotonic_ns(), flush=True)


def readers(port, channel, seconds):
    conn = client(port)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        lock = RedisLock(channel, connection=conn, timeout=60, check_interval=0.02,
                         flags=LockFlags.SHARED)
        lock.acquire()
        time.sleep(0.3)
        lock.release()


def writer(port, channel, n):
    conn = client(port)
    waits = []
    for _ in range(n):
        lock = RedisLock(channel, connection=conn, timeout=60, check_interval=0.02)
        t = time.monotonic_ns()
        lock.acquire()
        waits.append(time.monotonic_ns() - t)
        time.sleep(0.05)
        lock.release()
    return {"waits": waits}


def main():
    port, command = int(sys.argv[1]), sys.argv[2]
    if command == "cycle":
        print(json.dumps(cycle(port, int(sys.argv[3]))))
    elif command == "handoff":
        print(json.dumps(handoff(port, int(sys.argv[3]))))
    elif command == "readers":
        readers(port, sys.argv[3], float(sys.argv[4]))
    elif command == "writer":
        print(json.dumps(writer(port, sys.argv[3], int(sys.argv[4]))))
    else:
        hold(port, sys.argv[3])


main()
