"""The Python half of semaphore-bench: portalocker 4.4.2's NamedBoundedSemaphore, one slot of
LIMIT, uncontended acquire + release, measured like the Rust side (one sample per cycle).

Usage: python semaphore_bench.py DIR NAME LIMIT CYCLES   (prints one JSON summary)
"""

import json
import sys
import time

import portalocker
from benchlib import summary


def main():
    directory, name, limit, n = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    sem = portalocker.NamedBoundedSemaphore(limit, name=name, directory=directory, timeout=1)
    for _ in range(200):  # warm-up, unmeasured
        sem.acquire()
        sem.release()
    samples = []
    for _ in range(n):
        t = time.perf_counter_ns()
        sem.acquire()
        sem.release()
        samples.append(time.perf_counter_ns() - t)
    print(json.dumps(summary(samples)))


main()
