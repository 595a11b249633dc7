<?php
// The PHP half of redis-bench: Symfony Lock 5.4's RedisStore (phpredis).
// php symfony_bench.php HOST PORT cycle N          -> JSON {n, p50_us, p99_us}
// php symfony_bench.php HOST PORT waiter RESOURCE  -> per "go" line on stdin: prints "waiting",
//     blocks in acquire(true), prints hrtime (CLOCK_MONOTONIC ns) once it holds, releases.
require_once '/usr/share/php/Symfony/Component/Lock/autoload.php';

use Symfony\Component\Lock\LockFactory;
use Symfony\Component\Lock\Store\RedisStore;

$redis = new Redis();
$redis->connect($argv[1], (int) $argv[2]);
$factory = new LockFactory(new RedisStore($redis));

if ($argv[3] === 'cycle') {
    $n = (int) $argv[4];
    $lock = $factory->createLock('bench:php-cycle', 30.0, false);
    $samples = [];
    for ($i = 0; $i < $n; $i++) {
        $t = hrtime(true);
        $lock->acquire(false) or exit(1);
        $lock->release();
        $samples[] = hrtime(true) - $t;
    }
    sort($samples);
    $at = fn ($q) => $samples[(int) round((count($samples) - 1) * $q)] / 1000.0;
    echo json_encode(['n' => $n, 'p50_us' => $at(0.5), 'p99_us' => $at(0.99)]), "\n";
    exit(0);
}

while (($line = fgets(STDIN)) !== false) {
    if (trim($line) !== 'go') break;
    $lock = $factory->createLock($argv[4], 30.0, false);
    echo "waiting\n";
    $lock->acquire(true);
    $got = hrtime(true);
    $lock->release();
    echo $got, "\n";
}
