<?php
// A Symfony Semaphore 5.4 peer (Debian's php-symfony-semaphore, phpredis) for the interop tests.
//
// Usage: php semaphore_peer.php HOST PORT (or: cluster HOST:PORT,HOST:PORT,... for phpredis's
//   RedisCluster; the cycle form takes the same two first arguments)
//   Driven line by line over stdin, JSON as lock_peer.php: {"op", "resource", "limit", "weight",
//   "ttl"}; ops try_acquire, release, refresh, is_acquired, quit. One semaphore (one holder) per
//   resource, made on first use with that limit, weight and ttl.
// Usage: php semaphore_peer.php HOST PORT cycle RESOURCE LIMIT WEIGHT ROUNDS COUNTER
//   ROUNDS times: take the permits (trying every 1-3 ms), INCRBY COUNTER WEIGHT, INCR
//   COUNTER:over if it went above LIMIT, hold 2-8 ms, DECRBY COUNTER WEIGHT, release. Prints
//   {"rounds": N} when done.

require_once '/usr/share/php/Symfony/Component/Semaphore/autoload.php';

use Symfony\Component\Semaphore\SemaphoreFactory;
use Symfony\Component\Semaphore\Store\RedisStore;

if ($argv[1] === 'cluster') {
    $redis = new RedisCluster(null, explode(',', $argv[2]));
} else {
    $redis = new Redis();
    $redis->connect($argv[1], (int) $argv[2]);
}
$factory = new SemaphoreFactory(new RedisStore($redis));

if (($argv[3] ?? '') === 'cycle') {
    [, , , , $resource, $limit, $weight, $rounds, $counter] = $argv;
    [$limit, $weight, $rounds] = [(int) $limit, (int) $weight, (int) $rounds];
    for ($i = 0; $i < $rounds; $i++) {
        $semaphore = $factory->createSemaphore($resource, $limit, $weight, 30.0, false);
        while (!$semaphore->acquire()) {
            usleep(random_int(1000, 3000));
        }
        if ($redis->incrBy($counter, $weight) > $limit) {
            $redis->incr($counter . ':over');
        }
        usleep(random_int(2000, 8000));
        $redis->decrBy($counter, $weight);
        $semaphore->release();
    }
    echo json_encode(['rounds' => $rounds]), "\n";
    exit(0);
}

$semaphores = [];
echo json_encode(['ok' => true, 'result' => 'ready']), "\n";
while (($line = fgets(STDIN)) !== false) {
    $cmd = json_decode($line, true);
    $resource = $cmd['resource'] ?? '';
    if (!isset($semaphores[$resource])) {
        $semaphores[$resource] = $factory->createSemaphore($resource, $cmd['limit'] ?? 1,
            $cmd['weight'] ?? 1, $cmd['ttl'] ?? 30.0, false);
    }
    $semaphore = $semaphores[$resource];
    try {
        switch ($cmd['op']) {
            case 'try_acquire': $result = $semaphore->acquire(); break;
            case 'release': $semaphore->release(); $result = true; break;
            case 'refresh': $semaphore->refresh($cmd['ttl'] ?? null); $result = true; break;
            case 'is_acquired': $result = $semaphore->isAcquired(); break;
            case 'quit': exit(0);
            default: throw new InvalidArgumentException("unknown op {$cmd['op']}");
        }
        echo json_encode(['ok' => true, 'result' => $result]), "\n";
    } catch (Throwable $e) {
        echo json_encode(['ok' => false, 'error' => get_class($e) . ': ' . $e->getMessage()]), "\n";
    }
}
