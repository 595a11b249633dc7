"""What the Python halves of the benchmarks share with each other and with the Rust side."""


def park(i):
    """Seconds a holder keeps the lock after the waiter parked, in hand-off round i: 5-104 ms,
    spread like the Rust side's `park`, so pollers are caught at every phase of their poll."""
    return (5 + (i * 37) % 100) / 1000


def summary(samples_ns):
    """p50/p99 in µs of samples in ns, as the Rust side reads them."""
    samples = sorted(samples_ns)
    at = lambda q: samples[round((len(samples) - 1) * q)] / 1000.0
    return {"n": len(samples), "p50_us": at(0.5), "p99_us": at(0.99)}
