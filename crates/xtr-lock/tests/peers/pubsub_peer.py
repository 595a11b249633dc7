"""portalocker 4.4.2's RedisLock as a peer of the Rust pub/sub store, for the interop tests.

Usage: pubsub_peer.py PORT SUBCOMMAND CHANNEL [options]

  hold CHANNEL MODE     take the lock once, hold it until a line (or EOF) on stdin, release
  loop CHANNEL MODE N   N times: acquire, hold, release, pause
  try CHANNEL MODE      one non-blocking attempt (fail_when_locked, timeout 0)
  probe CHANNEL WAIT    the read-only probe: one JSON line per holder
  ping CHANNEL WAIT     a raw ping: every reply printed as it came

Every stdout line is flushed at once; <t> is Unix time with 6 decimals.
"""

import argparse
import json
import os
import sys
import threading
import time

import redis
from portalocker import RedisLock, exceptions
from portalocker.constants import LockFlags


def now():
    return f"{time.time():.6f}"


def say(*parts):
    print(*parts, flush=True)


def client(port):
    return redis.Redis(host="127.0.0.1", port=port, decode_responses=True)


def make_lock(args, conn, mode, lost_flag=None):
    flags = LockFlags.SHARED if mode == "shared" else LockFlags.EXCLUSIVE
    lock = RedisLock(
        args.channel,
        connection=conn,
        timeout=args.timeout,
        check_interval=args.check_interval,
        fail_when_locked=args.fail_when_locked,
        thread_sleep_time=args.thread_sleep_time,
        unavailable_timeout=args.unavailable_timeout,
        flags=flags,
        on_lost=(lambda _lock: lost_flag.set()) if lost_flag is not None else None,
        interrupt_on_lost=False,
        fencing=args.fencing,
    )
    if args.holder_id:
        lock.holder_id = args.holder_id
    return lock


def hold(args):
    conn = client(args.port)
    lost = threading.Event()
    lock = make_lock(args, conn, args.mode, lost)
    print(
        f"INFO pid={os.getpid()} holder_id={lock.holder_id} client_name={lock.client_name} "
        f"channel={args.channel} mode={args.mode}",
        file=sys.stderr,
        flush=True,
    )
    start = time.time()
    try:
        lock.acquire()
    except exceptions.AlreadyLocked:
        say("NOT_ACQUIRED", now())
        return 1
    say("ACQUIRED", now())
    print(
        f"INFO waited={time.time() - start:.3f} mode={args.mode} "
        f"fence_token={getattr(lock, 'fence_token', None)}",
        file=sys.stderr,
        flush=True,
    )
    if args.wedge:
        # Frames are still read (the socket stays healthy, the holder counted); pings go
        # unanswered.
        for name in list(lock.pubsub.channels):
            lock.pubsub.channels[name] = lambda _message: None
    released = threading.Event()

    def wait_for_stdin():
        sys.stdin.readline()
        released.set()

    threading.Thread(target=wait_for_stdin, daemon=True).start()
    while not released.is_set():
        if lost.is_set() or lock.lost:
            say("LOST", now())
            return 3
        time.sleep(0.005)
    # Stamped before the release starts (portalocker closes the connection inside it), so an
    # interval from ACQUIRED to RELEASING lies inside the true hold.
    say("RELEASING", now())
    lock.release()
    say("RELEASED", now())
    return 0


def loop(args):
    conn = client(args.port)
    acquired = failed = 0
    for _ in range(args.iterations):
        lost = threading.Event()
        lock = make_lock(args, conn, args.mode, lost)
        start = time.time()
        try:
            lock.acquire()
        except exceptions.AlreadyLocked:
            say("NOT_ACQUIRED", now(), args.mode, lock.holder_id)
            failed += 1
            continue
        say("ACQUIRED", now(), args.mode, lock.holder_id, f"{time.time() - start:.3f}")
        acquired += 1
        time.sleep(args.hold)
        if lost.is_set() or lock.lost:
            say("LOST", now(), args.mode, lock.holder_id)
        say("RELEASED", now(), args.mode, lock.holder_id)
        lock.release()
        time.sleep(args.pause)
    say(f"DONE acquired={acquired} failed={failed}")
    return 0 if failed == 0 else 1


def attempt(args):
    conn = client(args.port)
    args.fail_when_locked = True
    args.timeout = 0
    lock = make_lock(args, conn, args.mode)
    try:
        lock.acquire()
    except exceptions.AlreadyLocked:
        say("NOT_ACQUIRED", now())
        return 1
    say("ACQUIRED", now())
    lock.release()
    say("RELEASED", now())
    return 0


def probe(args):
    conn = client(args.port)
    lock = make_lock(args, conn, "exclusive")
    try:
        holders = lock.probe(timeout=args.wait)
    except exceptions.LockException:
        say("PROBE_INCONCLUSIVE")
        return 2
    for h in holders:
        say(
            json.dumps(
                {
                    "holder_id": h.holder_id,
                    "mode": getattr(h.mode, "value", h.mode),
                    "elected": getattr(h, "elected", None),
                    "legacy": getattr(h, "legacy", False),
                }
            )
        )
    say("PROBE_DONE", len(holders))
    return 0


def ping(args):
    conn = client(args.port)
    response_channel = f"{args.channel}-{os.urandom(16).hex()}"
    pubsub = conn.pubsub()
    pubsub.subscribe(response_channel)
    deadline = time.time() + 1
    while time.time() < deadline:
        message = pubsub.get_message(timeout=0.1)
        if message and message["type"] == "subscribe":
            break
    payload = json.dumps({"message": "ping", "response_channel": response_channel})
    receivers = conn.publish(args.channel, payload)
    say(f"PUBLISHED receivers={receivers} response_channel={response_channel}")
    deadline = time.time() + args.wait
    while time.time() < deadline:
        message = pubsub.get_message(timeout=0.05)
        if message and message["type"] == "message":
            say("REPLY", message["data"])
    say("NUMSUB", conn.pubsub_numsub(args.channel)[0][1])
    return 0


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("port", type=int)
    parser.add_argument("command", choices=["hold", "loop", "try", "probe", "ping"])
    parser.add_argument("channel")
    parser.add_argument("rest", nargs="*")
    parser.add_argument("--timeout", type=float, default=30.0)
    parser.add_argument("--check-interval", type=float, default=0.25)
    parser.add_argument("--fail-when-locked", action="store_true")
    parser.add_argument("--thread-sleep-time", type=float, default=0.1)
    parser.add_argument("--unavailable-timeout", type=float, default=1.0)
    parser.add_argument("--holder-id")
    parser.add_argument("--wedge", action="store_true")
    parser.add_argument("--fencing", action="store_true")
    parser.add_argument("--hold", type=float, default=0.05)
    parser.add_argument("--pause", type=float, default=0.02)
    args = parser.parse_args()
    if args.command in ("hold", "try"):
        args.mode = args.rest[0]
    elif args.command == "loop":
        args.mode, args.iterations = args.rest[0], int(args.rest[1])
    else:
        args.wait = float(args.rest[0]) if args.rest else 1.0
    return {"hold": hold, "loop": loop, "try": attempt, "probe": probe, "ping": ping}[
        args.command
    ](args)


if __name__ == "__main__":
    sys.exit(main())
