<?php
// The PHP half of symfony-stores-bench: Symfony Lock 5.4's SemaphoreStore (sysvsem) and
// MemcachedStore (php-memcached).
// php symfony_stores_bench.php STORE cycle N         -> JSON {n, p50_us, p99_us}: acquire(false)
//     + release on one lock, after 20 unmeasured cycles.
// php symfony_stores_bench.php STORE waiter RESOURCE -> per "go" line on stdin: prints "waiting",
//     acquires (SemaphoreStore: blocking, in the kernel; MemcachedStore: polling every
//     100 ± 10 ms, as Symfony's blocking acquire does), prints hrtime (CLOCK_MONOTONIC ns) once it
//     holds, releases.
// php symfony_stores_bench.php STORE holder RESOURCE -> per "go" line: acquires, prints "held";
//     per "release" line: prints hrtime, releases.
// STORE: semaphore, or memcached://HOST:PORT.
require_once '/usr/share/php/Symfony/Component/Lock/autoload.php';

use Symfony\Component\Lock\LockFactory;
use Symfony\Component\Lock\Store\MemcachedStore;
use Symfony\Component\Lock\Store\SemaphoreStore;

function summary(array $samples): string
{
    sort($samples);
    $at = fn ($q) => $samples[(int) round((count($samples) - 1) * $q)] / 1000.0;
    return json_encode(['n' => count($samples), 'p50_us' => $at(0.5), 'p99_us' => $at(0.99)]);
}

if ($argv[1] === 'semaphore') {
    $store = new SemaphoreStore();
    $ttl = null;
} elseif (preg_match('~^memcached://([^:/]+):(\d+)$~', $argv[1], $m)) {
    $memcached = new \Memcached();
    $memcached->addServer($m[1], (int) $m[2]);
    $store = new MemcachedStore($memcached, 30);
    $ttl = 30.0;
} else {
    fwrite(STDERR, "unknown store\n");
    exit(2);
}
$factory = new LockFactory($store);

if ($argv[2] === 'cycle') {
    $lock = $factory->createLock('bench:php-cycle', $ttl, false);
    for ($i = 0; $i < 20; $i++) { $lock->acquire(false) or exit(1); $lock->release(); }
    $samples = [];
    for ($i = 0; $i < (int) $argv[3]; $i++) {
        $t = hrtime(true);
        $lock->acquire(false) or exit(1);
        $lock->release();
        $samples[] = hrtime(true) - $t;
    }
    echo summary($samples), "\n";
    exit(0);
}

while (($line = fgets(STDIN)) !== false) {
    if (trim($line) !== 'go') break;
    $lock = $factory->createLock($argv[3], $ttl, false);
    if ($argv[2] === 'waiter') {
        echo "waiting\n";
        if ($store instanceof SemaphoreStore) {
            $lock->acquire(true);
        } else {
            while (!$lock->acquire(false)) { usleep(random_int(90000, 110000)); }
        }
        echo hrtime(true), "\n";
        $lock->release();
    } else {
        $lock->acquire(true);
        echo "held\n";
        if (trim((string) fgets(STDIN)) !== 'release') break;
        echo hrtime(true), "\n";
        $lock->release();
    }
}
