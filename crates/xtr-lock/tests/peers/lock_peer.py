"""A Python xtr-lock 4.1.0 peer driven line by line over stdin, for the interop tests.

Usage: python lock_peer.py flock <dir>
       python lock_peer.py redis <dsn>

Each command is one line of JSON: {"op": ..., "resource": ...}; each answer is one line of JSON:
{"ok": true, "result": ...} or {"ok": false, "error": "..."}. Operations: try_write, try_read,
wait_write, wait_read, release, is_acquired, file_for, time (CLOCK_MONOTONIC in ns), quit.
One lock object (one holder) per resource.
"""

import asyncio
import json
import sys
import time

from xtr_lock import FlockStore, Key, LockFactory, StoreFactory


async def main() -> None:
    kind, location = sys.argv[1], sys.argv[2]
    if kind == "flock":
        store = FlockStore(location)
    elif kind == "redis":
        store = StoreFactory.create_store(location)
    else:
        raise SystemExit(f"unknown store kind {kind}")
    factory = LockFactory(store)
    locks = {}
    loop = asyncio.get_running_loop()
    print(json.dumps({"ok": True, "result": "ready"}), flush=True)
    while True:
        line = await loop.run_in_executor(None, sys.stdin.readline)
        if not line:
            return
        cmd = json.loads(line)
        op, resource = cmd["op"], cmd.get("resource", "")
        if resource not in locks:
            locks[resource] = factory.create_lock(resource, ttl=cmd.get("ttl"))
        lock = locks[resource]
        try:
            if op == "try_write":
                result = await lock.acquire(blocking=False)
            elif op == "try_read":
                result = await lock.acquire_read(blocking=False)
            elif op == "wait_write":
                result = await lock.acquire(blocking=True)
            elif op == "wait_read":
                result = await lock.acquire_read(blocking=True)
            elif op == "release":
                await lock.release()
                result = time.monotonic_ns()
            elif op == "refresh":
                await lock.refresh(cmd.get("ttl"))
                result = True
            elif op == "is_acquired":
                result = await lock.is_acquired()
            elif op == "file_for":
                result = str(store.file_for(Key(resource)))
            elif op == "time":
                result = time.monotonic_ns()
            elif op == "quit":
                return
            else:
                raise ValueError(f"unknown op {op}")
            print(json.dumps({"ok": True, "result": result, "at": time.monotonic_ns()}), flush=True)
        except Exception as e:  # the test wants to see any failure
            print(json.dumps({"ok": False, "error": f"{type(e).__name__}: {e}"}), flush=True)


asyncio.run(main())
