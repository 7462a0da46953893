//! The benchmark of fencelock (the program is `src/main.rs`), on the test harnesses of
//! `fencelock-integration`: latency histograms, interleaved
//! timing, contended throughput measured in alternating slices, and the leader-election rows
//! (generic over the backend); the etcd and ZooKeeper rows live in their own modules, the
//! gray-failure rows (a paused cluster member) in [`gray`].

pub mod alloc;
pub mod etcd;
pub mod family;
pub mod gray;
pub mod pingpong;
pub mod redis;
pub mod redis_cluster;
pub mod report;
pub mod scale;
pub mod zookeeper;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;

use fencelock_integration::faults::Holder;
use fencelock_integration::target::Target;

/// The benchmark's options.
#[derive(clap::Parser, Debug, Clone)]
#[command(about = "fencelock benchmark: latency and throughput side by side with the peers")]
pub struct Args {
    /// Which backends to measure: etcd, zookeeper, redis or all.
    #[arg(long, default_value = "all")]
    pub backend: String,
    /// Uncontended acquire+release rounds per row.
    #[arg(long, default_value_t = 500)]
    pub rounds: usize,
    /// Seconds of each contended throughput measurement.
    #[arg(long, default_value_t = 3.0)]
    pub seconds: f64,
    /// Failover repetitions per row (each takes about a TTL when killed).
    #[arg(long, default_value_t = 3)]
    pub failovers: usize,
    /// Contending session counts.
    #[arg(long, value_delimiter = ',', default_values_t = vec![1, 4, 16])]
    pub sessions: Vec<usize>,
    /// Only the lock family's rows (read-write lock, semaphore, notifications per acquisition).
    #[arg(long)]
    pub family_only: bool,
    /// Counts of distinct locks one session takes and holds (the held-locks rows).
    #[arg(long, value_delimiter = ',', default_values_t = vec![100, 1000, 10000])]
    pub held: Vec<usize>,
    /// Queue lengths of the handoff rows (each waiter its own session).
    #[arg(long, value_delimiter = ',', default_values_t = vec![1, 10, 100, 1000])]
    pub waiters: Vec<usize>,
    /// Skip the scale rows (held locks, handoffs against waiters).
    #[arg(long, conflicts_with = "scale_only")]
    pub no_scale: bool,
    /// Only the scale rows.
    #[arg(long, conflicts_with = "family_only")]
    pub scale_only: bool,
    /// Only the gray-failure rows (a member of a 3-member cluster paused for 3× the TTL).
    #[arg(long, conflicts_with_all = ["family_only", "scale_only", "no_gray"])]
    pub gray_only: bool,
    /// Only the contended rows and the handoff limit (etcd and ZooKeeper), for quick
    /// comparisons while working on the handoff.
    #[arg(long, conflicts_with_all = ["family_only", "scale_only", "gray_only"])]
    pub contended_only: bool,
    /// Skip the gray-failure rows (they take several minutes: 3× the TTL per trial).
    #[arg(long)]
    pub no_gray: bool,
    /// Trials per cell of the gray-failure rows.
    #[arg(long, default_value_t = 3)]
    pub gray_reps: usize,
    /// Locks held across a Redis Cluster's shards (the cluster's held-locks row).
    #[arg(long, default_value_t = 100_000)]
    pub cluster_held: usize,
    /// Skip the Redis Cluster rows.
    #[arg(long)]
    pub no_cluster: bool,
    /// Also write a markdown report with SVG plots into this directory.
    #[arg(long)]
    pub report: Option<std::path::PathBuf>,
}

/// Latency samples of one row, in a histogram of microseconds (3 significant digits), and the
/// median of each block of them that [`time_interleaved`] ran (empty for other samples).
#[derive(Debug, Clone)]
pub struct Samples(Histogram<u64>, Vec<Duration>);

impl Samples {
    /// An empty set of samples.
    pub fn new() -> Self {
        // Bounded from 1 µs to an hour: an auto-resizing histogram would clamp
        // (`saturating_record`) a first sample above its initial range to that range.
        Samples(
            Histogram::new_with_bounds(1, 3_600_000_000, 3).expect("a histogram"),
            Vec::new(),
        )
    }

    /// Records one sample.
    pub fn record(&mut self, d: Duration) {
        self.0.saturating_record(d.as_micros().max(1) as u64);
    }

    /// Adds `other`'s samples to these.
    pub fn merge(&mut self, other: &Samples) {
        let _ = self.0.add(&other.0);
    }

    /// The `p` quantile (0..=1).
    pub fn pct(&self, p: f64) -> Duration {
        Duration::from_micros(self.0.value_at_quantile(p))
    }

    /// How many samples were recorded.
    pub fn len(&self) -> u64 {
        self.0.len()
    }

    /// Whether no sample was recorded.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl Default for Samples {
    fn default() -> Self {
        Self::new()
    }
}

/// Milliseconds with three decimals.
pub fn ms(d: Duration) -> String {
    format!("{:.3}", d.as_secs_f64() * 1e3)
}

/// Prints one latency row per name: p50, p99, p50 against `samples[base]`'s, and the same
/// ratio block by block (blocks run back to back: a block of each saw the same moment of a
/// noisy machine), as the median of the blocks' ratios with their least and greatest.
pub fn latency_rows(names: &[&str], samples: &[Samples], base: usize) {
    let base = &samples[base];
    for (name, s) in names.iter().zip(samples) {
        let blocks: Vec<f64> =
            s.1.iter()
                .zip(&base.1)
                .map(|(a, b)| a.as_secs_f64() / b.as_secs_f64())
                .collect();
        crate::emit!(
            "| {name} | {} | {} | {:.2}x | {} |",
            ms(s.pct(0.5)),
            ms(s.pct(0.99)),
            s.pct(0.5).as_secs_f64() / base.pct(0.5).as_secs_f64(),
            spread(&blocks, "x")
        );
    }
}

/// The header of a table of [`latency_rows`] whose ratios are against `base`.
pub fn latency_header(base: &str) {
    crate::emit!("| implementation | p50 ms | p99 ms | p50 vs {base} | per block of {BLOCK}: median (least–greatest) |");
    crate::emit!("|---|---:|---:|---:|---:|");
}

/// Prints how close the contended rows come to the server's handoff limit, measured by a raw
/// two-client ping-pong [`PAIRS`] times (`limits`): each side's share of the median limit, with
/// the least and greatest of its pairs' rates over it.
pub fn limit_rows(peer: &str, limits: &[f64], rows: &[(usize, Pair)]) {
    let mut sorted = limits.to_vec();
    sorted.sort_by(f64::total_cmp);
    let limit = sorted.get(sorted.len() / 2).copied().unwrap_or(f64::NAN);
    crate::emit!(
        "\nThe handoff limit (two raw clients passing one lock back and forth: a delete, one watch event, one read per handoff): {limit:.0} handoffs/s, the median of {} measurements ({:.0}–{:.0}). Share of it reached (each side's rate over the median limit; in parentheses the least and greatest of its {PAIRS} slices):\n",
        sorted.len(),
        sorted.first().copied().unwrap_or(f64::NAN),
        sorted.last().copied().unwrap_or(f64::NAN),
    );
    crate::emit!("| sessions | fencelock Mutex | {peer} |");
    crate::emit!("|---:|---:|---:|");
    for (n, pair) in rows {
        let share = |rates: &[f64]| rates.iter().map(|r| r / limit).collect::<Vec<_>>();
        crate::emit!(
            "| {n} | {} | {} |",
            spread(&share(&pair.a_rates), ""),
            spread(&share(&pair.b_rates), "")
        );
    }
}

/// The median of a few durations.
pub fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

/// One operation of a row (an acquire + release, say), repeatable.
pub use fencelock_integration::load::Op;

/// How many runs of one op [`time_interleaved`] times before it turns to the next.
pub const BLOCK: usize = 50;

/// Times `rounds` runs of each of `ops`, interleaved in blocks (after a warm-up of every op), so
/// that no row is favoured by running later on a warmer server.
pub async fn time_interleaved(rounds: usize, ops: &mut [Op]) -> Vec<Samples> {
    for op in ops.iter_mut() {
        for _ in 0..rounds / 5 + 10 {
            op().await;
        }
    }
    let mut out: Vec<Samples> = ops.iter().map(|_| Samples::new()).collect();
    let mut done = 0;
    while done < rounds {
        let n = BLOCK.min(rounds - done);
        for (op, samples) in ops.iter_mut().zip(out.iter_mut()) {
            let mut block = Samples::new();
            for _ in 0..n {
                let t = Instant::now();
                op().await;
                block.record(t.elapsed());
            }
            samples.merge(&block);
            samples.1.push(block.pct(0.5));
        }
        done += n;
    }
    out
}

/// The election rows of our `Election` on `t`: campaign → leadership → resign latency, and
/// failover (median) after the leader's session is closed and after its process is killed
/// (TTL 2 s; the process is this executable in its `holder` mode).
pub async fn election_rows(rounds: usize, failovers: usize, t: &Target) {
    let ns = fencelock::conformance::unique_namespace("bench-election");
    let ttl = Duration::from_secs(2);
    let s = t.session(&ns, Duration::from_secs(10)).await;
    let e = Arc::new(s.election("lat").expect("election"));
    let mut op: Op = Box::new(move || {
        let e = e.clone();
        Box::pin(async move {
            let l = e.campaign(b"v").await.expect("campaign");
            l.resign().await.expect("resign");
        })
    });
    let lat = time_interleaved((rounds / 2).max(1), std::slice::from_mut(&mut op))
        .await
        .remove(0);
    let failovers = failovers.max(1);
    let mut closed = Vec::new();
    for i in 0..failovers {
        let a = t.session(&ns, ttl).await;
        let name = format!("close-{i}");
        let _la = a
            .election(&name)
            .unwrap()
            .campaign(b"a")
            .await
            .expect("a leads");
        let eb = s.election(&name).unwrap();
        let waiter = tokio::spawn(async move {
            let l = eb.campaign(b"b").await.expect("b leads");
            let at = Instant::now();
            l.resign().await.expect("resign");
            at
        });
        tokio::time::sleep(Duration::from_millis(100)).await; // let b queue
        let t0 = Instant::now();
        a.close().await.expect("close");
        closed.push(waiter.await.expect("waiter") - t0);
    }
    let me = std::env::current_exe().expect("current exe");
    let mut killed = Vec::new();
    for i in 0..failovers {
        let name = format!("kill-{i}");
        let mut child = Holder::start_with(
            me.to_str().expect("utf-8 path"),
            &["holder"],
            t,
            &ns,
            "election",
            &name,
            ttl,
        );
        let eb = s.election(&name).unwrap();
        let waiter = tokio::spawn(async move {
            let l = eb.campaign(b"b").await.expect("b leads");
            let at = Instant::now();
            l.resign().await.expect("resign");
            at
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
        let t0 = Instant::now();
        child.kill();
        killed.push(waiter.await.expect("waiter") - t0);
    }
    election_row("fencelock Election", &lat, closed, killed);
    s.close().await.expect("close");
}

/// One row of the election table: campaign latency and the median failovers.
pub fn election_row(name: &str, lat: &Samples, closed: Vec<Duration>, killed: Vec<Duration>) {
    crate::emit!(
        "| {name} | {} | {} | {} | {} |",
        ms(lat.pct(0.5)),
        ms(lat.pct(0.99)),
        ms(median(closed)),
        ms(median(killed))
    );
}

/// The header of the election table.
pub fn election_header(what: &str) {
    crate::emit!("\nLeader election on {what}: campaign → leadership → resign latency uncontended, and failover");
    crate::emit!("(median) from the leader's session closed, and from the leader's process killed (TTL 2 s):\n");
    crate::emit!("| implementation | campaign p50 ms | campaign p99 ms | failover, closed ms | failover, killed ms |");
    crate::emit!("|---|---:|---:|---:|---:|");
}

/// Runs every op of `ops` in a loop of its own for `seconds`: each op's completions (in the
/// order of `ops`, counted until the stop), the time taken, and the ops back.
pub async fn run_slice(ops: Vec<Op>, seconds: f64) -> (Vec<u64>, f64, Vec<Op>) {
    let stop = Arc::new(AtomicBool::new(false));
    let counts: Vec<Arc<AtomicU64>> = ops.iter().map(|_| Arc::default()).collect();
    let start = Instant::now();
    let mut tasks = Vec::new();
    for (mut op, count) in ops.into_iter().zip(counts.iter().cloned()) {
        let stop = stop.clone();
        tasks.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                op().await;
                count.fetch_add(1, Ordering::Relaxed);
            }
            op
        }));
    }
    tokio::time::sleep(Duration::from_secs_f64(seconds)).await;
    stop.store(true, Ordering::Relaxed);
    let per_op = counts.iter().map(|c| c.load(Ordering::Relaxed)).collect();
    let elapsed = start.elapsed().as_secs_f64();
    let mut back = Vec::new();
    for t in tasks {
        back.push(t.await.expect("contender"));
    }
    (per_op, elapsed, back)
}

/// What a contended group reached: completions per second, and how alike its contenders were
/// served (the least-served one's completions as a share of the most-served one's: 1.00 all
/// alike, near 0 some starved).
#[derive(Debug, Clone, Copy)]
pub struct Contended {
    /// Completions per second.
    pub rate: f64,
    /// The least-served contender's completions over the most-served one's.
    pub fairness: f64,
}

impl Contended {
    /// The figures of a slice (or slices) that took `seconds`, from each contender's
    /// completions.
    pub fn of(per_op: &[u64], seconds: f64) -> Contended {
        let (min, max) = (
            per_op.iter().copied().min().unwrap_or(0),
            per_op.iter().copied().max().unwrap_or(0),
        );
        Contended {
            rate: per_op.iter().sum::<u64>() as f64 / seconds,
            fairness: min as f64 / max.max(1) as f64,
        }
    }
}

/// How many alternating pairs of slices [`throughput_pair`] measures: a ratio between the two
/// groups is the median of the pairs' ratios, printed with their least and greatest.
pub const PAIRS: usize = 5;

/// Two groups of contenders measured side by side in [`PAIRS`] alternating pairs of slices.
#[derive(Debug, Clone)]
pub struct Pair {
    /// The first group over every slice.
    pub a: Contended,
    /// The second group over every slice.
    pub b: Contended,
    /// The first group's rate in each pair.
    pub a_rates: Vec<f64>,
    /// The second group's rate in each pair.
    pub b_rates: Vec<f64>,
}

impl Pair {
    /// The first group's rate over the second's, pair by pair.
    pub fn ratios(&self) -> Vec<f64> {
        self.a_rates
            .iter()
            .zip(&self.b_rates)
            .map(|(a, b)| a / b.max(f64::MIN_POSITIVE))
            .collect()
    }
}

/// The median of `v` and its least and greatest, as `1.23x (1.01–1.40)`.
pub fn spread(v: &[f64], unit: &str) -> String {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    match (v.first(), v.last()) {
        (Some(lo), Some(hi)) => format!("{:.2}{unit} ({lo:.2}–{hi:.2})", v[v.len() / 2]),
        _ => "n/a".into(),
    }
}

/// Prints the row of `n` sessions of a side-by-side contended table (each side's rate with its
/// fairness in parentheses, then ours over theirs: the median of the pairs' ratios, with their
/// least and greatest) and returns the two rates.
pub fn contended_row(n: usize, pair: &Pair) -> (f64, f64) {
    let (ours, theirs) = (pair.a, pair.b);
    crate::emit!(
        "| {n} | {:.0} ({:.2}) | {:.0} ({:.2}) | {} |",
        ours.rate,
        ours.fairness,
        theirs.rate,
        theirs.fairness,
        spread(&pair.ratios(), "x")
    );
    (ours.rate, theirs.rate)
}

/// Contended throughput of two groups of contenders, measured alternately in [`PAIRS`] pairs
/// of slices of `seconds / PAIRS` each, alternating which goes first (so that load drifting
/// on the machine hits both alike).
pub async fn throughput_pair(mut a: Vec<Op>, mut b: Vec<Op>, seconds: f64) -> Pair {
    let slice = seconds / PAIRS as f64;
    let (mut na, mut ta) = (vec![0; a.len()], 0.0);
    let (mut nb, mut tb) = (vec![0; b.len()], 0.0);
    let (mut a_rates, mut b_rates) = (Vec::new(), Vec::new());
    let add = |to: &mut Vec<u64>, from: &[u64]| to.iter_mut().zip(from).for_each(|(t, f)| *t += f);
    let rate = |n: &[u64], t: f64| n.iter().sum::<u64>() as f64 / t;
    for i in 0..PAIRS {
        for a_now in [i % 2 == 0, i % 2 != 0] {
            if a_now {
                let (n, t, ops) = run_slice(a, slice).await;
                add(&mut na, &n);
                a_rates.push(rate(&n, t));
                (ta, a) = (ta + t, ops);
            } else {
                let (n, t, ops) = run_slice(b, slice).await;
                add(&mut nb, &n);
                b_rates.push(rate(&n, t));
                (tb, b) = (tb + t, ops);
            }
        }
    }
    Pair {
        a: Contended::of(&na, ta),
        b: Contended::of(&nb, tb),
        a_rates,
        b_rates,
    }
}

/// Contended throughput of one group of contenders during `seconds`.
pub async fn throughput(ops: Vec<Op>, seconds: f64) -> f64 {
    let (n, t, _) = run_slice(ops, seconds).await;
    n.iter().sum::<u64>() as f64 / t
}

/// The figures of every backend's own rows, collected for the table across backends.
static SUMMARY: std::sync::Mutex<Vec<(String, String, String)>> = std::sync::Mutex::new(Vec::new());

/// Records `value` of column `col` for `backend`, for [`emit_summary`].
pub fn summary(backend: &str, col: &str, value: String) {
    SUMMARY
        .lock()
        .unwrap()
        .push((backend.to_string(), col.to_string(), value));
}

/// Prints our figures on every backend measured, one row per backend, one column per figure.
pub fn emit_summary() {
    let rows = SUMMARY.lock().unwrap().clone();
    let mut cols: Vec<String> = Vec::new();
    let mut backends: Vec<String> = Vec::new();
    for (b, c, _) in &rows {
        if !cols.contains(c) {
            cols.push(c.clone());
        }
        if !backends.contains(b) {
            backends.push(b.clone());
        }
    }
    if backends.is_empty() {
        return;
    }
    crate::emit!(
        "
## fencelock Mutex across backends (from the rows above)
"
    );
    crate::emit!("| backend | {} |", cols.join(" | "));
    crate::emit!("|---|{}", "---:|".repeat(cols.len()));
    for b in &backends {
        let cells: Vec<String> = cols
            .iter()
            .map(|c| {
                rows.iter()
                    .find(|(rb, rc, _)| rb == b && rc == c)
                    .map_or("–".to_string(), |(_, _, v)| v.clone())
            })
            .collect();
        crate::emit!("| {b} | {} |", cells.join(" | "));
    }
}
