<?php
// The PHP halves of redis-bench and quorum-bench: Symfony Lock 5.4 (phpredis).
// php symfony_bench.php HOST PORT cycle N          -> JSON {n, p50_us, p99_us}
// php symfony_bench.php HOST PORT waiter RESOURCE  -> per "go" line on stdin: prints "waiting",
//     blocks in acquire(true), prints hrtime (CLOCK_MONOTONIC ns) once it holds, releases.
// php symfony_bench.php HOST PORT quorum N PORT2 PORT3 -> JSON: CombinedStore (consensus) over
//     the three servers, asked one after another as Symfony does.
require_once '/usr/share/php/Symfony/Component/Lock/autoload.php';

use Symfony\Component\Lock\LockFactory;
use Symfony\Component\Lock\Store\CombinedStore;
use Symfony\Component\Lock\Store\RedisStore;
use Symfony\Component\Lock\Strategy\ConsensusStrategy;

function summary(array $samples): string
{
    sort($samples);
    $at = fn ($q) => $samples[(int) round((count($samples) - 1) * $q)] / 1000.0;
    return json_encode(['n' => count($samples), 'p50_us' => $at(0.5), 'p99_us' => $at(0.99)]);
}

function cycles(LockFactory $factory, string $resource, int $n): array
{
    $lock = $factory->createLock($resource, 30.0, false);
    $samples = [];
    for ($i = 0; $i < $n; $i++) {
        $t = hrtime(true);
        $lock->acquire(false) or exit(1);
        $lock->release();
        $samples[] = hrtime(true) - $t;
    }
    return $samples;
}

if ($argv[3] === 'quorum') {
    $stores = [];
    foreach ([$argv[2], $argv[5], $argv[6]] as $port) {
        $r = new Redis();
        $r->connect($argv[1], (int) $port);
        $stores[] = new RedisStore($r);
    }
    $factory = new LockFactory(new CombinedStore($stores, new ConsensusStrategy()));
    cycles($factory, 'bench:php-quorum', 100); // warm up
    echo summary(cycles($factory, 'bench:php-quorum', (int) $argv[4])), "\n";
    exit(0);
}

$redis = new Redis();
$redis->connect($argv[1], (int) $argv[2]);
$factory = new LockFactory(new RedisStore($redis));

if ($argv[3] === 'cycle') {
    echo summary(cycles($factory, 'bench:php-cycle', (int) $argv[4])), "\n";
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
