"""portalocker 4.4.2's NamedBoundedSemaphore as a peer of the Rust flock store's semaphores.

usage: bounded_semaphore_peer.py DIR NAME MAXIMUM MODE [ARGS]

  hold N          take N slots (N instances, one slot each), print "held <slot files>", hold
                  them until stdin closes or says anything, print "released"
  try TIMEOUT     one acquire with this timeout (check_interval 0.01): print "got" (and let
                  go) or "timeout"
  churn ROUNDS CHECKER
                  ROUNDS times: acquire (no timeout to speak of), enter the checker, hold a
                  moment, leave it, release; print "done"
  cycle ROUNDS    ROUNDS uncontended acquire + release, print "ns <nanoseconds per cycle>"

The checker is a file holding the permits in use now, changed under its own flock by every
holder (Python and Rust alike): "over" is appended to it by whoever finds it above MAXIMUM.
"""

import fcntl
import os
import sys
import time

import portalocker


def semaphore(directory, name, maximum, timeout=3600.0):
    return portalocker.NamedBoundedSemaphore(
        maximum, name=name, directory=directory, timeout=timeout, check_interval=0.01
    )


def checker_add(path, change, maximum):
    with open(path, "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        f.seek(0)
        lines = f.read().split("\n")
        now = int(lines[0] or "0") + change
        rest = [line for line in lines[1:] if line]
        if now > maximum:
            rest.append("over")
        f.seek(0)
        f.truncate()
        f.write("\n".join([str(now)] + rest) + "\n")


def main():
    directory, name, maximum, mode = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    args = sys.argv[5:]
    if mode == "hold":
        held = []
        for _ in range(int(args[0])):
            s = semaphore(directory, name, maximum, timeout=10)
            s.acquire()
            held.append(s)
        print("held " + " ".join(os.path.basename(s.lock.filename) for s in held), flush=True)
        sys.stdin.readline()
        for s in held:
            s.release()
        print("released", flush=True)
    elif mode == "try":
        s = semaphore(directory, name, maximum, timeout=float(args[0]))
        try:
            s.acquire()
            print("got", flush=True)
            s.release()
        except portalocker.exceptions.AlreadyLocked:
            print("timeout", flush=True)
    elif mode == "churn":
        rounds, checker = int(args[0]), args[1]
        s = semaphore(directory, name, maximum)
        for _ in range(rounds):
            s.acquire()
            checker_add(checker, 1, maximum)
            time.sleep(0.002)
            checker_add(checker, -1, maximum)
            s.release()
        print("done", flush=True)
    elif mode == "cycle":
        rounds = int(args[0])
        s = semaphore(directory, name, maximum)
        start = time.perf_counter_ns()
        for _ in range(rounds):
            s.acquire()
            s.release()
        print("ns %d" % ((time.perf_counter_ns() - start) // rounds), flush=True)
    else:
        sys.exit("unknown mode " + mode)


if __name__ == "__main__":
    main()
