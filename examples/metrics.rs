//! fencelock's metrics (see `fencelock::metrics` for the names) exported in Prometheus' text
//! format with `metrics-exporter-prometheus`: a small contended workload, then the scrape.
//!
//! ```text
//! cargo run -p fencelock-examples --example metrics                 # prints one scrape
//! cargo run -p fencelock-examples --example metrics -- --etcd 127.0.0.1:2379 --listen 127.0.0.1:9898
//! curl http://127.0.0.1:9898/metrics
//! ```
//!
//! With `--listen` it keeps the workload running and serves `/metrics` until ctrl-c (a minimal
//! HTTP responder: use the exporter's own listener, or your web framework, in a real service).

use std::time::Duration;

use clap::Parser;
use fencelock::Session;
use fencelock_examples::{shutdown_signal, BackendArgs};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use tokio::io::AsyncWriteExt;

#[derive(Parser, Debug)]
#[command(about = "fencelock metrics in Prometheus' text format")]
struct Args {
    #[command(flatten)]
    backend: BackendArgs,
    /// Serve `/metrics` on this address (and keep the workload running) instead of printing
    /// one scrape.
    #[arg(long)]
    listen: Option<String>,
}

/// Four sessions taking turns on one lock, `rounds` times each (0: until dropped).
async fn workload(
    backend: std::sync::Arc<dyn fencelock::backend::Backend>,
    rounds: u64,
) -> fencelock::Result<()> {
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let s = Session::builder(backend.clone()).start().await?;
        tasks.push(tokio::spawn(async move {
            let m = s.mutex("jobs/report")?;
            let mut i = 0;
            while rounds == 0 || i < rounds {
                let g = m.lock().await?;
                tokio::time::sleep(Duration::from_millis(2)).await;
                g.release().await?;
                // A try that finds the lock taken, now and then.
                if i % 5 == 0 {
                    let _ = m.try_lock().await?;
                }
                i += 1;
            }
            s.close().await
        }));
    }
    for t in tasks {
        t.await.expect("worker")?;
    }
    Ok(())
}

async fn serve(addr: &str, handle: PrometheusHandle) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    println!("serving http://{addr}/metrics; ctrl-c to stop");
    loop {
        let (mut conn, _) = listener.accept().await?;
        let body = handle.render();
        tokio::spawn(async move {
            let head = format!(
                "HTTP/1.0 200 OK\r\ncontent-type: text/plain; version=0.0.4\r\ncontent-length: {}\r\n\r\n",
                body.len()
            );
            let _ = conn.write_all(head.as_bytes()).await;
            let _ = conn.write_all(body.as_bytes()).await;
        });
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    let handle = PrometheusBuilder::new().install_recorder()?;
    let (backend, _) = args.backend.connect().await?;
    match &args.listen {
        None => {
            workload(backend, 20).await?;
            print!("{}", handle.render());
        }
        Some(addr) => {
            tokio::spawn(workload(backend, 0));
            tokio::select! {
                r = serve(addr, handle) => r?,
                _ = shutdown_signal() => {}
            }
        }
    }
    Ok(())
}
