//! xtr-lock's metrics on a Prometheus endpoint: install the exporter, take locks, scrape.
//!
//! ```sh
//! cargo run -p xtr-lock --features metrics --example prometheus
//! curl -s localhost:9000/metrics | grep xtr_lock     # in another terminal, while it runs
//! ```
//!
//! The exporter comes from `metrics-exporter-prometheus` with
//! `default-features = false, features = ["http-listener"]` (its default features build a TLS
//! stack the listener does not need).

use std::net::SocketAddr;
use std::time::Duration;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
use xtr_lock::{InMemoryStore, LockFactory, Lockable as _};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let listen: SocketAddr = std::env::var("METRICS_ADDR")
        .unwrap_or_else(|_| "127.0.0.1:9000".into())
        .parse()?;
    // Every xtr-lock metric goes to this recorder from here on. Without buckets the exporter
    // shows the acquire latency as a summary (quantiles that cannot be aggregated across
    // processes); with them, as a histogram.
    PrometheusBuilder::new()
        .with_http_listener(listen)
        .set_buckets_for_metric(
            Matcher::Full("xtr_lock_acquire_seconds".into()),
            xtr_lock::ACQUIRE_SECONDS_BUCKETS,
        )?
        .install()?;
    println!("metrics on http://{listen}/metrics");

    let factory = LockFactory::new(InMemoryStore::new());
    let rounds: u32 = std::env::var("ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(20);
    for round in 0..rounds {
        let worker = factory.create_lock("report");
        let other = factory.create_lock("report");
        factory
            .run("report", xtr_lock::RunOptions::new(), || async {
                // Someone else tries meanwhile: a conflict, counted.
                let _ = other.try_acquire().await?;
                Ok::<_, xtr_lock::Error>(())
            })
            .await?;
        let _ = worker.acquire_timeout(Duration::from_millis(10)).await?;
        let _ = worker.release().await?;
        if round % 5 == 0 {
            println!("round {round}");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    Ok(())
}
