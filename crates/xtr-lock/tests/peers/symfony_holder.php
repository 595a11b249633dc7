<?php
// A Symfony Lock 5.4 holder (Debian's php-symfony-lock) for the SQL interop tests: takes one
// lock, prints each event on stdout as it happens, holds, releases.
//
// Usage: php symfony_holder.php STORE RESOURCE read|write SECONDS [--try] [--timeout=S] [--ttl=S]
//                           [--refresh=S] [--user=U] [--password=P] [--verbose]
//   STORE: a PDO DSN (pgsql:… or mysql:…) for PdoStore, pgsql+advisory:… for PostgreSqlStore,
//   semaphore for SemaphoreStore, or memcached://HOST:PORT for MemcachedStore (php-memcached).
//   --try: one attempt; --timeout=S: attempts every 100 ± 10 ms for S seconds; neither: Symfony's
//   own blocking acquire. --ttl=S: the store's initial ttl and the lock's ttl (0: no lock ttl).
//   --refresh=S: refresh every S seconds (0: never; default ttl/2 when ttl < SECONDS).
//   --repeat=N: take, hold and release N times (a new Key each time), for contention loops.
//   --occupy=FILE: while holding, FILE exists and names this process: made with O_EXCL after
//   each acquisition (OVERLAP if someone else's is there), removed before each release.
// Each line: <ISO-8601 UTC, µs> <epoch seconds, µs> pid=<pid> <EVENT> resource=<r> mode=<m> k=v…
// Events: INFO WAITING ACQUIRED TOKEN REFRESHED LOST BUSY TIMEOUT RELEASED ERROR OVERLAP.
// Exit: 0 done (also after SIGTERM/SIGINT, which release), 1 busy/timeout/lost, 2 error.

require_once '/usr/share/php/Symfony/Component/Lock/autoload.php';

use Symfony\Component\Lock\Exception\LockConflictedException;
use Symfony\Component\Lock\Key;
use Symfony\Component\Lock\LockFactory;
use Symfony\Component\Lock\Store\MemcachedStore;
use Symfony\Component\Lock\Store\PdoStore;
use Symfony\Component\Lock\Store\SemaphoreStore;
use Symfony\Component\Lock\Store\StoreFactory;

function field($v): string {
    $v = (string) $v;
    return preg_match('~^[A-Za-z0-9._:/+=-]+$~', $v) ? $v : json_encode($v, JSON_UNESCAPED_UNICODE);
}

function say(string $event, array $fields = []): void {
    global $resource, $mode;
    $t = microtime(true);
    $iso = gmdate('Y-m-d\TH:i:s', (int) $t) . sprintf('.%06dZ', (int) (($t - floor($t)) * 1e6));
    $line = sprintf('%s %.6f pid=%d %s resource=%s mode=%s', $iso, $t, getmypid(), $event,
        field($resource), $mode);
    foreach ($fields as $k => $v) {
        $line .= ' ' . $k . '=' . field($v);
    }
    fwrite(STDOUT, $line . "\n");
    fflush(STDOUT);
}

[$self, $storeArg, $resource, $mode, $seconds] = array_pad($argv, 5, null);
if ($seconds === null || !in_array($mode, ['read', 'write'], true)) {
    fwrite(STDERR, "usage: php symfony_holder.php STORE RESOURCE read|write SECONDS [options]\n");
    exit(2);
}
$opts = ['try' => false, 'timeout' => null, 'ttl' => 300.0, 'refresh' => null, 'user' => null,
    'password' => null, 'verbose' => false, 'repeat' => 1, 'occupy' => null];
foreach (array_slice($argv, 5) as $arg) {
    if ($arg === '--try') { $opts['try'] = true; continue; }
    if ($arg === '--verbose') { $opts['verbose'] = true; continue; }
    if (preg_match('/^--(timeout|ttl|refresh|user|password|repeat|occupy)=(.*)$/', $arg, $m)) {
        $opts[$m[1]] = $m[2];
        continue;
    }
    fwrite(STDERR, "unknown option $arg\n");
    exit(2);
}
$seconds = (float) $seconds;
$ttl = (float) $opts['ttl'];
$refresh = $opts['refresh'] === null ? ($ttl > 0 && $ttl < $seconds ? $ttl / 2 : 0.0)
    : (float) $opts['refresh'];

$lock = null;
$held = false;
try {
    if (str_starts_with($storeArg, 'pgsql+advisory:')) {
        $store = StoreFactory::createStore($storeArg);
    } elseif ($storeArg === 'semaphore') {
        $store = new SemaphoreStore();
    } elseif (preg_match('~^memcached://([^:/]+):(\d+)$~', $storeArg, $mc)) {
        $memcached = new \Memcached();
        $memcached->addServer($mc[1], (int) $mc[2]);
        $store = new MemcachedStore($memcached, max(1, (int) ceil($ttl ?: 300)));
    } else {
        $options = [];
        if ($opts['user'] !== null) { $options['db_username'] = $opts['user']; }
        if ($opts['password'] !== null) { $options['db_password'] = $opts['password']; }
        $store = new PdoStore($storeArg, $options, 0.01, max(1, (int) ceil($ttl ?: 300)));
    }
    $logger = null;
    if ($opts['verbose']) {
        $logger = new class extends \Psr\Log\AbstractLogger {
            public function log($level, $message, array $context = []): void {
                fwrite(STDERR, "[$level] $message\n");
            }
        };
    }
    $factory = new LockFactory($store);
    if ($logger) { $factory->setLogger($logger); }
    $key = new Key($resource);
    $lock = $factory->createLockFromKey($key, $ttl > 0 ? $ttl : null, false);
    $crc = crc32($resource);
    $b64 = str_replace('/', '_', substr(base64_encode(hash('sha256', $resource, true)), 0, 7));
    say('INFO', ['store' => (new ReflectionClass($store))->getShortName(),
        'pdo_key_id' => hash('sha256', $resource), 'pg_advisory_bigint' => $crc,
        'flock_file' => 'sf.' . substr(preg_replace('/[^a-z0-9\._-]+/i', '-', $resource), 0, 50)
            . '.' . $b64 . '.lock',
        'redis_key' => $resource, 'sem_key' => unpack('i', md5($resource, true))[1]]);

    $release = function () use (&$lock, &$held) {
        if ($held) {
            $lock->release();
            $held = false;
        }
        say('RELEASED');
    };
    pcntl_async_signals(true);
    foreach ([SIGTERM, SIGINT] as $sig) {
        pcntl_signal($sig, function () use ($release) { $release(); exit(0); });
    }

    for ($round = 0; $round < (int) $opts['repeat']; $round++) {
    if ($round > 0) {
        $key = new Key($resource);
        $lock = $factory->createLockFromKey($key, $ttl > 0 ? $ttl : null, false);
    }
    $take = fn (bool $blocking) => $mode === 'read' ? $lock->acquireRead($blocking)
        : $lock->acquire($blocking);
    if ($opts['try']) {
        say('WAITING', ['strategy' => 'try']);
        if (!$take(false)) { say('BUSY'); exit(1); }
    } elseif ($opts['timeout'] !== null) {
        say('WAITING', ['strategy' => 'poll', 'timeout' => $opts['timeout']]);
        $deadline = microtime(true) + (float) $opts['timeout'];
        while (!$take(false)) {
            if (microtime(true) >= $deadline) { say('TIMEOUT'); exit(1); }
            usleep(random_int(90000, 110000));
        }
    } else {
        say('WAITING', ['strategy' => 'blocking']);
        $take(true);
    }
    $held = true;
    if ($opts['occupy'] !== null) {
        $f = @fopen($opts['occupy'], 'x');
        if ($f === false) {
            say('OVERLAP', ['found' => (string) @file_get_contents($opts['occupy'])]);
        } else {
            fwrite($f, 'php ' . getmypid());
            fclose($f);
        }
    }
    $left = $lock->getRemainingLifetime();
    say('ACQUIRED', ['remaining' => $left === null ? 'none' : sprintf('%.3f', $left)]);
    $class = get_class($store);
    $state = $key->hasState($class) ? $key->getState($class) : '';
    say('TOKEN', ['class' => $class, 'token' => is_string($state) ? $state : '']);

    $end = microtime(true) + $seconds;
    $next = $refresh > 0 ? microtime(true) + $refresh : INF;
    while (($now = microtime(true)) < $end) {
        usleep((int) (min($end, $next) - $now > 0.05 ? 50000 : max(1000, (min($end, $next) - $now) * 1e6)));
        if (microtime(true) >= $next) {
            try {
                $lock->refresh();
            } catch (LockConflictedException $e) {
                $held = false;
                say('LOST', ['error' => $e->getMessage()]);
                exit(1);
            }
            $left = $lock->getRemainingLifetime();
            say('REFRESHED', ['remaining' => $left === null ? 'none' : sprintf('%.3f', $left)]);
            $next = microtime(true) + $refresh;
        }
    }
    if ($opts['occupy'] !== null) {
        @unlink($opts['occupy']);
    }
    $release();
    }
    exit(0);
} catch (Throwable $e) {
    $prev = $e->getPrevious();
    say('ERROR', ['class' => get_class($e), 'message' => $e->getMessage(),
        'previous' => $prev ? $prev->getMessage() : '']);
    exit(2);
}
