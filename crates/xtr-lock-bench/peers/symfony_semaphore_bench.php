<?php
// The PHP half of redis-semaphore-bench: Symfony Semaphore 5.4 (phpredis).
// php symfony_semaphore_bench.php HOST PORT cycle N LIMIT -> JSON {n, p50_us, p99_us}: acquire +
//     release of one permit, timed with hrtime.
// php symfony_semaphore_bench.php HOST PORT waiter RESOURCE LIMIT -> per "go" line on stdin:
//     prints "waiting", polls acquire() every 100 ± 10 ms (Symfony Semaphore 5.4 has no blocking
//     acquire; Symfony Lock's blocking acquire polls so), prints hrtime (CLOCK_MONOTONIC ns) once
//     it holds, releases.
// php symfony_semaphore_bench.php HOST PORT poll RESOURCE LIMIT SECONDS -> polls as the waiter
//     does for SECONDS (the semaphore stays full), prints {"polls": N}.
require_once '/usr/share/php/Symfony/Component/Semaphore/autoload.php';

use Symfony\Component\Semaphore\SemaphoreFactory;
use Symfony\Component\Semaphore\Store\RedisStore;

function summary(array $samples): string
{
    sort($samples);
    $at = fn ($q) => $samples[(int) round((count($samples) - 1) * $q)] / 1000.0;
    return json_encode(['n' => count($samples), 'p50_us' => $at(0.5), 'p99_us' => $at(0.99)]);
}

$redis = new Redis();
$redis->connect($argv[1], (int) $argv[2]);
$factory = new SemaphoreFactory(new RedisStore($redis));

if ($argv[3] === 'cycle') {
    $semaphore = $factory->createSemaphore('bench:php-sem-cycle', (int) $argv[5], 1, 30.0, false);
    $samples = [];
    for ($i = 0; $i < 100 + (int) $argv[4]; $i++) {
        $t = hrtime(true);
        $semaphore->acquire() or exit(1);
        $semaphore->release();
        if ($i >= 100) {
            $samples[] = hrtime(true) - $t;
        }
    }
    echo summary($samples), "\n";
    exit(0);
}

$poll = fn () => usleep(random_int(90000, 110000));

if ($argv[3] === 'poll') {
    $semaphore = $factory->createSemaphore($argv[4], (int) $argv[5], 1, 30.0, false);
    $end = microtime(true) + (float) $argv[6];
    $polls = 0;
    while (microtime(true) < $end) {
        $semaphore->acquire() and exit(1);
        $polls++;
        $poll();
    }
    echo json_encode(['polls' => $polls]), "\n";
    exit(0);
}

while (($line = fgets(STDIN)) !== false) {
    if (trim($line) !== 'go') break;
    $semaphore = $factory->createSemaphore($argv[4], (int) $argv[5], 1, 30.0, false);
    echo "waiting\n";
    while (!$semaphore->acquire()) {
        $poll();
    }
    $got = hrtime(true);
    $semaphore->release();
    echo $got, "\n";
}
