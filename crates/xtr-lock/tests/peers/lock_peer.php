<?php
// A Symfony Lock 5.4 peer (Debian's php-symfony-lock, phpredis) driven line by line over stdin,
// for the interop tests. Usage: php lock_peer.php <host> <port>, or on a Redis Cluster through
// phpredis's RedisCluster: php lock_peer.php cluster <host:port>,<host:port>,...
// Commands and answers are JSON lines, as for lock_peer.py: try_write, try_read, release,
// refresh, is_acquired, quit. One lock object (one holder) per resource.

require_once '/usr/share/php/Symfony/Component/Lock/autoload.php';

use Symfony\Component\Lock\LockFactory;
use Symfony\Component\Lock\Store\RedisStore;

if ($argv[1] === 'cluster') {
    $redis = new RedisCluster(null, explode(',', $argv[2]));
} else {
    $redis = new Redis();
    $redis->connect($argv[1], (int) $argv[2]);
}
$factory = new LockFactory(new RedisStore($redis));
$locks = [];
echo json_encode(['ok' => true, 'result' => 'ready']), "\n";
while (($line = fgets(STDIN)) !== false) {
    $cmd = json_decode($line, true);
    $op = $cmd['op'];
    $resource = $cmd['resource'] ?? '';
    if (!isset($locks[$resource])) {
        $locks[$resource] = $factory->createLock($resource, $cmd['ttl'] ?? 30.0, false);
    }
    $lock = $locks[$resource];
    try {
        switch ($op) {
            case 'try_write': $result = $lock->acquire(false); break;
            case 'try_read': $result = $lock->acquireRead(false); break;
            case 'release': $lock->release(); $result = true; break;
            case 'refresh': $lock->refresh($cmd['ttl'] ?? null); $result = true; break;
            case 'is_acquired': $result = $lock->isAcquired(); break;
            case 'quit': exit(0);
            default: throw new InvalidArgumentException("unknown op $op");
        }
        echo json_encode(['ok' => true, 'result' => $result]), "\n";
    } catch (Throwable $e) {
        echo json_encode(['ok' => false, 'error' => get_class($e) . ': ' . $e->getMessage()]), "\n";
    }
}
