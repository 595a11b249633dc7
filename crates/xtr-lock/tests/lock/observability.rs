//! Metrics (a debugging recorder) and logs (a capturing subscriber): what a service owner sees
//! for acquires, contention, waits, timeouts, cancellations, holds, losses and refresh failures,
//! at the levels of the behaviour contract, each log event naming the resource and the store.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use tracing::field::{Field, Visit};
use tracing_subscriber::layer::{Context, SubscriberExt as _};
use xtr_lock::{InMemoryStore, LockFactory, Lockable as _};

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// What a workload does to a memory store: a hold, a conflict, a timed-out wait, a cancelled
/// wait, a release, and a hold that expires unrenewed and is found lost.
async fn workload() {
    let clock: Arc<dyn xtr_lock::Clock> = Arc::new(xtr_lock::MonotonicClock);
    let factory =
        LockFactory::new(InMemoryStore::expiring(clock.clone())).with_clock(clock.clone());
    let a = factory.create_lock("job");
    let b = factory.create_lock("job");
    assert!(a.try_acquire().await.unwrap());
    assert!(!b.try_acquire().await.unwrap());
    assert!(!b.acquire_timeout(Duration::from_millis(30)).await.unwrap());
    let cancelled = tokio::time::timeout(Duration::from_millis(30), b.acquire()).await;
    assert!(cancelled.is_err());
    let _ = a.release().await.unwrap();
    let short = factory
        .create_lock("short")
        .with_ttl(Some(Duration::from_millis(40)));
    assert!(short.try_acquire().await.unwrap());
    // Unrenewed, its lifetime runs out; the store then finds it gone.
    while !short.is_expired() {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(!short.is_acquired().await.unwrap());
    // A refresh of the lost lock fails and says so.
    assert!(short.refresh(None).await.is_err());
    // A semaphore's permits: labelled apart from locks, held and released like them.
    let permits = factory.create_semaphore("pool", 2).unwrap();
    assert!(permits.try_acquire().await.unwrap());
    let _ = permits.release().await.unwrap();
}

#[test]
fn metrics_count_what_happened_with_bounded_labels() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::with_local_recorder(&recorder, || runtime().block_on(workload()));
    let mut seen: BTreeMap<String, DebugValue> = BTreeMap::new();
    for (key, _, _, value) in snapshotter.snapshot().into_vec() {
        let key = key.key();
        let mut labels: Vec<String> = key
            .labels()
            .map(|l| format!("{}={}", l.key(), l.value()))
            .collect();
        labels.sort();
        seen.insert(format!("{}{{{}}}", key.name(), labels.join(",")), value);
    }
    let count = |name: &str| match seen.get(name) {
        Some(DebugValue::Counter(n)) => *n,
        Some(DebugValue::Histogram(v)) => v.len() as u64,
        other => panic!("{name}: {other:?} in {:#?}", seen.keys()),
    };
    assert_eq!(
        count("xtr_lock_acquire_seconds{mode=write,outcome=acquired,store=in-memory}"),
        2
    );
    assert_eq!(
        count("xtr_lock_acquire_seconds{mode=write,outcome=conflict,store=in-memory}"),
        1
    );
    assert_eq!(
        count("xtr_lock_acquire_seconds{mode=permits,outcome=acquired,store=in-memory}"),
        1
    );
    assert_eq!(
        count("xtr_lock_acquire_seconds{mode=write,outcome=timeout,store=in-memory}"),
        1
    );
    assert_eq!(
        count("xtr_lock_acquire_seconds{mode=write,outcome=cancelled,store=in-memory}"),
        1
    );
    assert_eq!(count("xtr_lock_contended_total{store=in-memory}"), 3);
    assert_eq!(count("xtr_lock_waits_total{store=in-memory}"), 2);
    assert_eq!(
        count("xtr_lock_lost_total{reason=expired,store=in-memory}"),
        1
    );
    match seen.get("xtr_lock_held{store=in-memory}") {
        Some(DebugValue::Gauge(g)) => assert_eq!(g.into_inner(), 0.0, "nothing held at the end"),
        other => panic!("xtr_lock_held: {other:?}"),
    }
    // No label carries a resource name; every series names its store.
    assert!(
        seen.keys()
            .all(|k| !k.contains("job") && !k.contains("short") && !k.contains("pool"))
    );
    assert!(
        seen.keys().all(|k| k.contains("store=in-memory")),
        "{:#?}",
        seen.keys()
    );
}

/// What a Prometheus scrape shows: the acquire latency as a histogram with the suggested
/// buckets, and a `# HELP` line for every metric.
#[test]
fn a_prometheus_scrape_has_help_texts_and_a_real_histogram() {
    use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
    let recorder = PrometheusBuilder::new()
        .set_buckets_for_metric(
            Matcher::Full("xtr_lock_acquire_seconds".into()),
            xtr_lock::ACQUIRE_SECONDS_BUCKETS,
        )
        .unwrap()
        .build_recorder();
    let handle = recorder.handle();
    metrics::with_local_recorder(&recorder, || {
        xtr_lock::describe_metrics();
        runtime().block_on(workload());
    });
    let scrape = handle.render();
    assert!(
        scrape.contains("xtr_lock_acquire_seconds_bucket{"),
        "{scrape}"
    );
    // The exporter shows the metrics recorded; the workload records all but refresh failures.
    let shown: Vec<_> = xtr_lock::METRICS
        .iter()
        .filter(|m| scrape.contains(&format!("# TYPE {} {}", m.name, m.kind)))
        .collect();
    assert_eq!(shown.len(), xtr_lock::METRICS.len() - 1, "{scrape}");
    for metric in shown {
        assert!(
            scrape.contains(&format!("# HELP {} {}", metric.name, metric.help)),
            "no help for {} in {scrape}",
            metric.name
        );
    }
}

/// One captured event: level, message, fields.
#[derive(Debug, Clone)]
struct Event {
    level: tracing::Level,
    fields: BTreeMap<String, String>,
}

#[derive(Clone, Default)]
struct Capture(Arc<Mutex<Vec<Event>>>);

struct Fields<'a>(&'a mut BTreeMap<String, String>);

impl Visit for Fields<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }
}

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Capture {
    fn on_event(&self, event: &tracing::Event<'_>, _: Context<'_, S>) {
        if event.metadata().target() != "xtr_lock" {
            return;
        }
        let mut fields = BTreeMap::new();
        event.record(&mut Fields(&mut fields));
        self.0.lock().unwrap().push(Event {
            level: *event.metadata().level(),
            fields,
        });
    }
}

#[test]
fn logs_follow_the_levels_and_name_the_resource_and_the_store() {
    let capture = Capture::default();
    let subscriber = tracing_subscriber::registry().with(capture.clone());
    tracing::subscriber::with_default(subscriber, || runtime().block_on(workload()));
    let events = capture.0.lock().unwrap().clone();
    let find = |level: tracing::Level, text: &str| {
        events
            .iter()
            .find(|e| e.level == level && e.fields.get("message").is_some_and(|m| m == text))
            .unwrap_or_else(|| panic!("no {level} {text:?} in {events:#?}"))
    };
    find(tracing::Level::DEBUG, "acquired the lock");
    find(
        tracing::Level::INFO,
        "failed to acquire the lock, someone else holds it",
    );
    find(tracing::Level::DEBUG, "released the lock");
    find(tracing::Level::WARN, "the lock was lost");
    for e in &events {
        assert!(e.fields.contains_key("resource"), "{e:?}");
        assert_eq!(
            e.fields.get("store").map(String::as_str),
            Some("in-memory"),
            "{e:?}"
        );
    }
}

#[test]
fn a_refresh_that_cannot_reach_its_store_is_counted_as_a_failure() {
    let mut server = xtr_lock_testkit::redis::RedisServer::start();
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::with_local_recorder(&recorder, || {
        runtime().block_on(async {
            let store = xtr_lock::RedisStore::from_dsn(&server.url(0)).unwrap();
            let lock = LockFactory::new(store).create_lock("renewed");
            assert!(lock.try_acquire().await.unwrap());
            server.kill();
            let err = lock.refresh(None).await.unwrap_err();
            assert!(!err.is_lost(), "unreachable, not lost: {err}");
        });
    });
    let failures: u64 = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .filter(|(k, ..)| k.key().name() == "xtr_lock_refresh_failures_total")
        .map(|(_, _, _, v)| match v {
            DebugValue::Counter(n) => n,
            other => panic!("{other:?}"),
        })
        .sum();
    assert_eq!(failures, 1);
}
