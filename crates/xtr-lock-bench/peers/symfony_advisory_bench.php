<?php
// The PHP half of advisory-bench: Symfony Lock 5.4's PostgreSqlStore (advisory locks, pdo_pgsql).
// php symfony_advisory_bench.php DSN cycle N         -> JSON {n, p50_us, p99_us}: acquire(false)
//     + release on one lock, after 20 unmeasured cycles.
// php symfony_advisory_bench.php DSN waiter RESOURCE -> per "go" line on stdin: prints "waiting",
//     blocks in acquire(true) (pg_advisory_lock: woken by the server), prints hrtime
//     (CLOCK_MONOTONIC ns) once it holds, releases.
// DSN: Symfony's, e.g. pgsql+advisory:host=127.0.0.1;port=5432;dbname=postgres;user=postgres
require_once '/usr/share/php/Symfony/Component/Lock/autoload.php';

use Symfony\Component\Lock\LockFactory;
use Symfony\Component\Lock\Store\StoreFactory;

function summary(array $samples): string
{
    sort($samples);
    $at = fn ($q) => $samples[(int) round((count($samples) - 1) * $q)] / 1000.0;
    return json_encode(['n' => count($samples), 'p50_us' => $at(0.5), 'p99_us' => $at(0.99)]);
}

$factory = new LockFactory(StoreFactory::createStore($argv[1]));

if ($argv[2] === 'cycle') {
    $lock = $factory->createLock('bench:php-cycle', null, false);
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
    $lock = $factory->createLock($argv[3], null, false);
    echo "waiting\n";
    $lock->acquire(true);
    echo hrtime(true), "\n";
    $lock->release();
}
