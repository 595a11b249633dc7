"""What the Python halves of the benchmarks share with each other and with the Rust side."""

import asyncio
import time


def park(i):
    """Seconds a holder keeps the lock after the waiter parked, in hand-off round i: 5-104 ms,
    spread like the Rust side's `park`, so pollers are caught at every phase of their poll."""
    return (5 + (i * 37) % 100) / 1000


def summary(samples_ns):
    """p50/p99 in µs of samples in ns, as the Rust side reads them."""
    samples = sorted(samples_ns)
    at = lambda q: samples[round((len(samples) - 1) * q)] / 1000.0
    return {"n": len(samples), "p50_us": at(0.5), "p99_us": at(0.99)}


async def cycles(lock, n, acquire):
    """p50/p99 of n uncontended acquire + release cycles of `lock`; `acquire(lock)` must take it
    at once (each peer spells that differently)."""
    samples = []
    for _ in range(n):
        t = time.perf_counter_ns()
        assert await acquire(lock)
        await lock.release()
        samples.append(time.perf_counter_ns() - t)
    return summary(samples)


async def handoffs(new_lock, n, acquire):
    """p50/p99 of n hand-offs in one event loop: a holder releases `park(i)` after a waiter (a new
    holder, in another task) blocked in `acquire(lock)`; the sample is release -> the waiter
    holds. `new_lock()` makes a holder of the resource."""
    samples = []
    for i in range(n):
        holder = new_lock()
        assert await acquire(holder)
        waiter = new_lock()

        async def wait():
            await acquire(waiter)
            got = time.monotonic_ns()
            await waiter.release()
            return got

        task = asyncio.create_task(wait())
        await asyncio.sleep(park(i))
        released = time.monotonic_ns()
        await holder.release()
        samples.append(await task - released)
    return summary(samples)
