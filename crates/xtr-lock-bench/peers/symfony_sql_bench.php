<?php
// The PHP half of sql-bench: Symfony Lock 5.4's PdoStore (pdo_pgsql, pdo_mysql).
// php symfony_sql_bench.php PDO_DSN USER cycle N             -> JSON {n, p50_us, p99_us}
// php symfony_sql_bench.php PDO_DSN USER waiter RESOURCE     -> per "go" line on stdin: prints
//     "waiting", blocks in acquire(true) (Symfony polls every 100 ms), prints hrtime
//     (CLOCK_MONOTONIC ns) once it holds, releases.
// php symfony_sql_bench.php PDO_DSN USER loop SECONDS K TAG  -> JSON {n}: acquire + release
//     over K resources (blocking) for SECONDS.
require_once '/usr/share/php/Symfony/Component/Lock/autoload.php';

use Symfony\Component\Lock\LockFactory;
use Symfony\Component\Lock\Store\PdoStore;

function summary(array $samples): string
{
    sort($samples);
    $at = fn ($q) => $samples[(int) round((count($samples) - 1) * $q)] / 1000.0;
    return json_encode(['n' => count($samples), 'p50_us' => $at(0.5), 'p99_us' => $at(0.99)]);
}

$factory = new LockFactory(new PdoStore($argv[1], ['db_username' => $argv[2]], 0.01, 30));

if ($argv[3] === 'cycle') {
    $lock = $factory->createLock('bench:php-cycle', 30.0, false);
    for ($i = 0; $i < 20; $i++) { $lock->acquire(false) or exit(1); $lock->release(); }
    $samples = [];
    for ($i = 0; $i < (int) $argv[4]; $i++) {
        $t = hrtime(true);
        $lock->acquire(false) or exit(1);
        $lock->release();
        $samples[] = hrtime(true) - $t;
    }
    echo summary($samples), "\n";
    exit(0);
}

if ($argv[3] === 'loop') {
    $end = microtime(true) + (float) $argv[4];
    $n = 0;
    while (microtime(true) < $end) {
        $lock = $factory->createLock('bench:tp:' . random_int(0, (int) $argv[5] - 1), 30.0, false);
        $lock->acquire(true);
        $lock->release();
        $n++;
    }
    echo json_encode(['n' => $n]), "\n";
    exit(0);
}

while (($line = fgets(STDIN)) !== false) {
    if (trim($line) !== 'go') break;
    $lock = $factory->createLock($argv[4], 30.0, false);
    echo "waiting\n";
    $lock->acquire(true);
    echo hrtime(true), "\n";
    $lock->release();
}
