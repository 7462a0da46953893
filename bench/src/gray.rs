//! The gray-failure rows of the benchmark (`bench -- --gray-only`, and part of the full run
//! unless `--no-gray`): a member of a 3-member etcd cluster or ZooKeeper ensemble paused
//! (`SIGSTOP`: it accepts connections and answers nothing) for 3× the TTL, then resumed, while
//! fencelock and the bare clients of the same backend (etcd-client; zookeeper-client and Apache
//! Curator, the latter from Java: `tests/java/CuratorGray.java`) run side by side, each with its
//! own lock:
//!
//! - [`CONTENDERS`] sessions per implementation (one connection each) lock and release one lock
//!   in a loop; the first of them is the *measured* session, placed for the fault;
//! - fault (a), *follower*: a follower that the measured session's heartbeats do not go to;
//! - fault (b), *connected*: the follower that they go to (fencelock on etcd: the keep-alive
//!   stream's endpoint, picked from the lease id; etcd-client: the member named in the header of
//!   a keep-alive reply, its stream reopened until it is there; ZooKeeper: the server whose
//!   `cons` lists the session). Sessions are opened until one is where the fault needs it
//!   (Curator: the measured `CuratorFramework` is closed and reopened until it is).
//!
//! Measured per trial: the time from the `SIGSTOP` to the first grant that completes after it
//! (any contender), the grants during the pause, the longest time without a grant during it, the
//! measured session's longest time without a confirmed heartbeat around the pause (fencelock:
//! the instants its local deadline moved, polled every 5 ms; etcd-client: the replies of our own
//! keep-alive loop; zookeeper-client: our own `exists("/")` pings; Curator: our own background
//! `checkExists("/")`), and whether the measured session survived (as its own client can tell,
//! half a TTL plus a second after the resume; Curator: no `LOST` state, the same session id).
//! Curator's times are its wall clock (`System.currentTimeMillis()`), mapped onto the monotonic
//! clock of the rest through one (`Instant`, `SystemTime`) pair.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use fencelock::{Session, SessionState};
use tokio::task::JoinHandle;
use zookeeper_client as zk;

use super::Args;
use fencelock_integration::curator::{self, CuratorProgram, JavaClasses};
use fencelock_integration::servers::etcd::{self as etcd_harness, EtcdCluster};
use fencelock_integration::servers::zookeeper::{self as zk_harness, ZkEnsemble};
use fencelock_integration::servers::Cluster;
use fencelock_integration::stamps::{grants_between, longest_gap_across, median_gap, Stamps};
use fencelock_integration::target::Kind;

/// Contending sessions per implementation (the measured one included).
pub const CONTENDERS: usize = 3;

/// Grants each implementation must have made before the fault.
const WARM_GRANTS: usize = 10;

/// How long a bounded wait of the harness may take (a noisy 2-core machine).
const PATIENCE: Duration = Duration::from_secs(30);

/// How often the heartbeat watchers poll.
const POLL: Duration = Duration::from_millis(5);

/// Which member is paused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fault {
    /// A follower that the measured session's heartbeats do not go to.
    Follower,
    /// The follower that the measured session's heartbeats go to.
    Connected,
}

impl Fault {
    fn label(self) -> &'static str {
        match self {
            Fault::Follower => "(a) a follower",
            Fault::Connected => "(b) its own member",
        }
    }
}

/// Where the measured session must be.
#[derive(Clone, Copy, Debug)]
enum Place {
    On(usize),
    Off(usize),
}

impl Place {
    fn fits(self, member: usize) -> bool {
        match self {
            Place::On(v) => member == v,
            Place::Off(v) => member != v,
        }
    }
}

/// What one implementation records in one trial.
#[derive(Clone, Default)]
struct Probe {
    grants: Stamps,
    beats: Stamps,
    /// The measured session was found lost by its own client.
    lost: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
    /// The measured session was where the fault needs it.
    placed: Arc<AtomicBool>,
}

impl Probe {
    fn stopped(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }
}

/// One implementation running in a trial.
struct Contest {
    name: &'static str,
    probe: Probe,
    tasks: Vec<JoinHandle<()>>,
}

/// What one trial measured for one implementation.
#[derive(Debug, Clone)]
struct Outcome {
    first: Option<Duration>,
    during: usize,
    grant_gap: Duration,
    beat_gap: Duration,
    healthy_beat: Option<Duration>,
    survived: bool,
    placed: bool,
}

/// Prints the gray-failure tables for the backends of `args.backend` (etcd, ZooKeeper), with
/// `args.gray_reps` trials per cell. Starts (and stops) its own 3-member clusters; prints a skip
/// line for a backend that is not installed.
pub async fn gray_rows(args: &Args) {
    let reps = args.gray_reps.max(1);
    crate::emit!("\n## Gray failures: a paused member\n");
    crate::emit!(
        "A member of a 3-member cluster paused (SIGSTOP) for 3× the TTL, then resumed (SIGCONT); fencelock and the bare clients (etcd-client; zookeeper-client and Apache Curator) side by side in the same trials, each with {CONTENDERS} contending sessions (one connection each) locking and releasing its own lock in a loop. The first contender is the measured session: for (a) a follower is paused that its heartbeats do not go to; for (b) the follower that they go to (fencelock on etcd: the keep-alive stream's endpoint, chosen from the lease id; etcd-client: the member in a keep-alive reply's header, the stream reopened until it is on the victim; ZooKeeper: the server whose `cons` lists the session; sessions are opened until one is placed, Curator's measured `CuratorFramework` closed and reopened). {reps} trials per cell, the paused follower alternating; each cell: median (min–max)."
    );
    crate::emit!(
        "\nColumns: *first grant* — from the SIGSTOP to the first lock grant completed after it, by any contender; *grants* — during the pause; *grant gap* — the longest time without a grant during the pause (its ends count); *heartbeat gap* — the measured session's longest time without a confirmed heartbeat around the pause (up to half a TTL + 1 s after the resume if none came), next to its healthy period before the pause (fencelock: the instants its local deadline moved; etcd-client: replies to our own keep-alive loop, one every TTL/3, each awaited TTL/3, the stream reopened after a miss; zookeeper-client: our own `exists(\"/\")` every TTL/6, each awaited TTL/6; Curator: the same with `checkExists().inBackground()`); *survived* — measured sessions not lost, as their own client tells (fencelock: `state()`; etcd-client: a keep-alive reply or reopened stream saying the lease is gone; zookeeper-client: `SessionExpired`/`state()`; Curator: no `LOST` state and the same session id). Bare clients with default options: etcd-client's `lock()`/`unlock()`, zookeeper-client's `Client::lock` + `delete` and Curator's `InterProcessMutex` `acquire()` unbounded (Curator: one JVM, session and connection timeout = TTL, `RetryNTimes(3, 200)`); a contender whose session is lost takes a new one, like fencelock's (Curator does so by itself)."
    );
    if matches!(args.backend.as_str(), "etcd" | "all") {
        etcd_section(reps).await;
    }
    if matches!(args.backend.as_str(), "zookeeper" | "all") {
        zookeeper_section(reps).await;
    }
}

/// The TTLs measured on `kind`: the short one and 10 s.
fn ttls(kind: Kind) -> [Duration; 2] {
    match kind {
        Kind::ZooKeeper => [Duration::from_secs(4), Duration::from_secs(10)],
        _ => [Duration::from_secs(2), Duration::from_secs(10)],
    }
}

/// One row of results: (TTL, fault, implementation) and its trials.
type Rows = Vec<((Duration, Fault, &'static str), Vec<Outcome>)>;

fn add(rows: &mut Rows, key: (Duration, Fault, &'static str), o: Outcome) {
    match rows.iter_mut().find(|(k, _)| *k == key) {
        Some((_, v)) => v.push(o),
        None => rows.push((key, vec![o])),
    }
}

async fn etcd_section(reps: usize) {
    if etcd_harness::missing().is_some() {
        crate::emit!("\n(etcd not installed: the gray-failure rows skipped)");
        return;
    }
    let cluster = Arc::new(
        tokio::task::spawn_blocking(|| EtcdCluster::start(3))
            .await
            .expect("start etcd"),
    );
    let ids = etcd_member_ids(&cluster).await;
    let mut rows = Rows::new();
    for ttl in ttls(Kind::Etcd) {
        for fault in [Fault::Follower, Fault::Connected] {
            for rep in 0..reps {
                let (victim, place) = choose(&*cluster, fault, rep).await;
                let ns = fencelock::conformance::unique_namespace("gray");
                let contests = vec![
                    fencelock_contest(cluster.clone(), place, ttl, &ns).await,
                    etcd_client_contest(&cluster, &ids, place, ttl, &format!("{ns}-etcd-client"))
                        .await,
                ];
                for (name, o) in trial(&*cluster, contests, victim, ttl).await {
                    eprintln!("etcd TTL {ttl:?} {fault:?} #{rep} {name}: {o:?}");
                    add(&mut rows, (ttl, fault, name), o);
                }
            }
        }
    }
    table("etcd", &rows);
}

async fn zookeeper_section(reps: usize) {
    if zk_harness::missing().is_some() {
        crate::emit!("\n(ZooKeeper not installed: the gray-failure rows skipped)");
        return;
    }
    let ensemble = Arc::new(
        tokio::task::spawn_blocking(|| ZkEnsemble::start(3))
            .await
            .expect("start ZooKeeper"),
    );
    let classes = curator_classes().await;
    let mut rows = Rows::new();
    for ttl in ttls(Kind::ZooKeeper) {
        for fault in [Fault::Follower, Fault::Connected] {
            for rep in 0..reps {
                let (victim, place) = choose(&*ensemble, fault, rep).await;
                let ns = fencelock::conformance::unique_namespace("gray");
                let mut contests = vec![
                    fencelock_contest(ensemble.clone(), place, ttl, &ns).await,
                    zk_client_contest(ensemble.clone(), place, ttl, &format!("/{ns}-zk-client"))
                        .await,
                ];
                if let Ok(classes) = &classes {
                    let path = format!("/{ns}-curator");
                    contests.push(curator_contest(&ensemble, classes, place, ttl, &path).await);
                }
                for (name, o) in trial(&*ensemble, contests, victim, ttl).await {
                    eprintln!("ZooKeeper TTL {ttl:?} {fault:?} #{rep} {name}: {o:?}");
                    add(&mut rows, (ttl, fault, name), o);
                }
            }
        }
    }
    table("ZooKeeper", &rows);
    if let Err(why) = classes {
        crate::emit!("\n(Apache Curator rows skipped: {why})");
    }
}

/// The follower to pause in trial `rep` (alternating between the two), and where the measured
/// session must be for `fault`.
async fn choose(cluster: &dyn Cluster, fault: Fault, rep: usize) -> (usize, Place) {
    let leader = cluster.leader().await;
    let followers: Vec<usize> = (0..cluster.size()).filter(|i| *i != leader).collect();
    let victim = followers[rep % followers.len()];
    let place = match fault {
        Fault::Follower => Place::Off(victim),
        Fault::Connected => Place::On(victim),
    };
    (victim, place)
}

/// Runs one trial: waits until every contest is granted locks, pauses `victim` for 3 × `ttl`,
/// resumes it, lets the clients settle, and measures; then stops the contests.
async fn trial(
    cluster: &dyn Cluster,
    contests: Vec<Contest>,
    victim: usize,
    ttl: Duration,
) -> Vec<(&'static str, Outcome)> {
    let warm = Instant::now();
    while contests.iter().any(|c| c.probe.grants.len() < WARM_GRANTS) && warm.elapsed() < PATIENCE {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // A few healthy heartbeats before the fault (the bare etcd loop beats every TTL/3).
    tokio::time::sleep(ttl).await;
    let healthy_from = warm;
    let from = Instant::now();
    cluster.pause(victim);
    tokio::time::sleep(ttl * 3).await;
    let to = Instant::now();
    cluster.resume(victim);
    tokio::time::sleep(ttl / 2 + Duration::from_secs(1)).await;
    let end = Instant::now();
    let mut out = Vec::new();
    for c in &contests {
        let grants = c.probe.grants.sorted();
        let beats = c.probe.beats.sorted();
        let (during, grant_gap) = grants_between(&grants, from, to);
        out.push((
            c.name,
            Outcome {
                first: c.probe.grants.first_after(from).map(|t| t - from),
                during,
                grant_gap,
                beat_gap: longest_gap_across(&beats, from, to, end),
                healthy_beat: median_gap(&beats, healthy_from, from),
                survived: !c.probe.lost.load(Ordering::SeqCst),
                placed: c.probe.placed.load(Ordering::SeqCst),
            },
        ));
    }
    for c in &contests {
        c.probe.stop.store(true, Ordering::SeqCst);
    }
    // Every task stops within a few seconds (a contender still waiting for a grant is aborted).
    let give_up = tokio::time::Instant::now() + Duration::from_secs(5);
    for t in contests.into_iter().flat_map(|c| c.tasks) {
        let abort = t.abort_handle();
        if tokio::time::timeout_at(give_up, t).await.is_err() {
            abort.abort();
        }
    }
    // Healthy again before the next trial.
    cluster.leader().await;
    out
}

/// Prints the table of one backend.
fn table(backend: &str, rows: &Rows) {
    crate::emit!("\n### {backend}\n");
    crate::emit!("| TTL | paused | implementation | first grant s | grants | grant gap s | heartbeat gap s (healthy) | survived |");
    crate::emit!("|---:|---|---|---:|---:|---:|---:|---:|");
    for ((ttl, fault, name), outcomes) in rows {
        let firsts: Vec<f64> = outcomes
            .iter()
            .map(|o| o.first.map_or(f64::INFINITY, |d| d.as_secs_f64()))
            .collect();
        let grants: Vec<f64> = outcomes.iter().map(|o| o.during as f64).collect();
        let gaps: Vec<f64> = outcomes.iter().map(|o| o.grant_gap.as_secs_f64()).collect();
        let beats: Vec<f64> = outcomes.iter().map(|o| o.beat_gap.as_secs_f64()).collect();
        let healthy: Vec<f64> = outcomes
            .iter()
            .filter_map(|o| o.healthy_beat.map(|d| d.as_secs_f64()))
            .collect();
        let survived = outcomes.iter().filter(|o| o.survived).count();
        let unplaced = outcomes.iter().filter(|o| !o.placed).count();
        let note = if unplaced > 0 {
            format!(" ({unplaced} not placed)")
        } else {
            String::new()
        };
        crate::emit!(
            "| {} s | {} | {name}{note} | {} | {} | {} | {} ({}) | {survived}/{} |",
            ttl.as_secs(),
            fault.label(),
            spread(&firsts, 3),
            spread(&grants, 0),
            spread(&gaps, 2),
            spread(&beats, 2),
            if healthy.is_empty() {
                "–".to_string()
            } else {
                format!("{:.2}", median_f(&healthy))
            },
            outcomes.len()
        );
    }
}

fn median_f(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// `median (min–max)` with `decimals`; `none` stands for a trial with no value (infinite).
fn spread(v: &[f64], decimals: usize) -> String {
    let f = |x: f64| {
        if x.is_finite() {
            format!("{x:.decimals$}")
        } else {
            "none".to_string()
        }
    };
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    if s.len() == 1 {
        return f(s[0]);
    }
    format!("{} ({}–{})", f(s[s.len() / 2]), f(s[0]), f(s[s.len() - 1]))
}

// ---------------------------------------------------------------------------------------------
// fencelock

/// Starts a session on `endpoints`, retrying (bounded) while the cluster elects a leader or a
/// member is still being taken out.
async fn start_session(
    cluster: &dyn Cluster,
    endpoints: &str,
    namespace: &str,
    ttl: Duration,
) -> Session {
    let give_up = Instant::now() + PATIENCE;
    let target = cluster.target();
    loop {
        let backend = target.backend_at(endpoints).await;
        match Session::builder(backend)
            .namespace(namespace)
            .ttl(ttl)
            .start()
            .await
        {
            Ok(s) => return s,
            Err(e) if e.is_temporary() && Instant::now() < give_up => {
                tokio::time::sleep(Duration::from_millis(100)).await
            }
            Err(e) => panic!("cannot start a session: {e:?}"),
        }
    }
}

/// The member that a fencelock session's heartbeats go to: on etcd the keep-alive stream's
/// endpoint (the lease id modulo the endpoints, all in the rotation of a fresh backend); on
/// ZooKeeper the server whose `cons` lists the session.
async fn fencelock_member(cluster: &dyn Cluster, s: &Session) -> Option<usize> {
    match cluster.kind() {
        Kind::Etcd => u64::from_str_radix(&s.id(), 16)
            .ok()
            .map(|lease| (lease % cluster.size() as u64) as usize),
        _ => cluster.member_of(&s.id()).await,
    }
}

/// fencelock's contenders on `cluster`, the first placed at `place`.
async fn fencelock_contest(
    cluster: Arc<dyn Cluster>,
    place: Place,
    ttl: Duration,
    ns: &str,
) -> Contest {
    let probe = Probe::default();
    let endpoints = cluster.endpoints().join(",");
    let mut measured = None;
    for _ in 0..40 {
        let s = start_session(&*cluster, &endpoints, ns, ttl).await;
        if fencelock_member(&*cluster, &s)
            .await
            .is_some_and(|m| place.fits(m))
        {
            measured = Some(s);
            break;
        }
        let _ = s.close().await;
    }
    probe.placed.store(measured.is_some(), Ordering::SeqCst);
    let measured = match measured {
        Some(s) => s,
        None => start_session(&*cluster, &endpoints, ns, ttl).await,
    };
    let mut tasks = vec![tokio::spawn(watch_deadline(
        measured.clone(),
        probe.clone(),
    ))];
    for i in 0..CONTENDERS {
        let s = if i == 0 {
            measured.clone()
        } else {
            start_session(&*cluster, &endpoints, ns, ttl).await
        };
        tasks.push(tokio::spawn(fencelock_worker(
            cluster.clone(),
            endpoints.clone(),
            ns.to_string(),
            ttl,
            s,
            probe.clone(),
        )));
    }
    Contest {
        name: "fencelock Mutex",
        probe,
        tasks,
    }
}

/// Records every move of `s`'s local deadline (a confirmed heartbeat) and whether it is lost.
async fn watch_deadline(s: Session, probe: Probe) {
    let mut last = s.deadline();
    while !probe.stopped() {
        if matches!(s.state(), SessionState::Lost(_)) {
            probe.lost.store(true, Ordering::SeqCst);
            return;
        }
        let d = s.deadline();
        if d != last {
            probe.beats.record();
            last = d;
        }
        tokio::time::sleep(POLL).await;
    }
}

/// One fencelock contender: `lock_timeout(ttl)` + release in a loop; a lost session is replaced.
async fn fencelock_worker(
    cluster: Arc<dyn Cluster>,
    endpoints: String,
    ns: String,
    ttl: Duration,
    mut s: Session,
    probe: Probe,
) {
    while !probe.stopped() {
        let m = s.mutex("m").expect("mutex");
        match m.lock_timeout(ttl).await {
            Ok(g) => {
                probe.grants.record();
                let _ = g.release().await;
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
        }
        if matches!(s.state(), SessionState::Lost(_)) && !probe.stopped() {
            s = start_session(&*cluster, &endpoints, &ns, ttl).await;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// etcd-client

/// Every member's id, by index.
async fn etcd_member_ids(cluster: &EtcdCluster) -> Vec<u64> {
    let mut ids = Vec::new();
    for ep in cluster.endpoints() {
        let mut c = etcd_client::Client::connect([ep.as_str()], None)
            .await
            .expect("connect to an etcd member");
        let s = c.status().await.expect("etcd status");
        ids.push(s.header().expect("a header").member_id());
    }
    ids
}

type KeepAlive = (etcd_client::LeaseKeeper, etcd_client::LeaseKeepAliveStream);

/// Connects an etcd-client to every member (bounded retries).
async fn etcd_connect(endpoints: &[String]) -> etcd_client::Client {
    let give_up = Instant::now() + PATIENCE;
    loop {
        match etcd_client::Client::connect(endpoints, None).await {
            Ok(c) => return c,
            Err(e) if Instant::now() < give_up => {
                let _ = e;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("cannot connect etcd-client: {e}"),
        }
    }
}

/// A lease of `ttl` and its keep-alive stream, each request bounded by `ttl` and retried
/// (bounded); `None` if it cannot be had.
async fn etcd_lease(client: &mut etcd_client::Client, ttl: Duration) -> Option<(i64, KeepAlive)> {
    let give_up = Instant::now() + PATIENCE;
    while Instant::now() < give_up {
        let granted = tokio::time::timeout(ttl, client.lease_grant(ttl.as_secs() as i64, None));
        if let Ok(Ok(g)) = granted.await {
            let opened = tokio::time::timeout(ttl, client.lease_keep_alive(g.id())).await;
            if let Ok(Ok(ka)) = opened {
                return Some((g.id(), ka));
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    None
}

/// The member (by index in `ids`) that a keep-alive stream is on, from a reply's header.
async fn stream_member(ka: &mut KeepAlive, ids: &[u64], ttl: Duration) -> Option<usize> {
    let reply = tokio::time::timeout(ttl, async {
        ka.0.keep_alive().await?;
        ka.1.message().await
    })
    .await;
    let Ok(Ok(Some(resp))) = reply else {
        return None;
    };
    let member = resp.header()?.member_id();
    ids.iter().position(|id| *id == member)
}

/// etcd-client's contenders (`lock()` with a lease kept alive by our own loop), the first with
/// its keep-alive stream placed at `place`.
async fn etcd_client_contest(
    cluster: &EtcdCluster,
    ids: &[u64],
    place: Place,
    ttl: Duration,
    name: &str,
) -> Contest {
    let probe = Probe::default();
    let endpoints = cluster.endpoints();
    let mut tasks = Vec::new();
    for i in 0..CONTENDERS {
        let mut client = etcd_connect(&endpoints).await;
        let (lease, mut ka) = etcd_lease(&mut client, ttl).await.expect("an etcd lease");
        if i == 0 {
            // Reopen the stream (a new client every ten tries) until it is on the member.
            let mut placed = false;
            for attempt in 0..60 {
                if stream_member(&mut ka, ids, ttl)
                    .await
                    .is_some_and(|m| place.fits(m))
                {
                    placed = true;
                    break;
                }
                if attempt % 10 == 9 {
                    client = etcd_connect(&endpoints).await;
                }
                if let Ok(Ok(k)) = tokio::time::timeout(ttl, client.lease_keep_alive(lease)).await {
                    ka = k;
                }
            }
            probe.placed.store(placed, Ordering::SeqCst);
        }
        let measured = i == 0;
        tasks.push(tokio::spawn(etcd_client_worker(
            client,
            lease,
            ka,
            measured,
            ttl,
            name.to_string(),
            probe.clone(),
        )));
    }
    Contest {
        name: "etcd-client lock()",
        probe,
        tasks,
    }
}

/// Keeps `lease` alive the way a careful user of etcd-client would: a keep-alive every TTL/3,
/// its reply awaited TTL/3, a new stream opened (bounded by TTL/3) after a miss. Records every
/// confirmation in `beats` (if measured) and sets `lost` once the lease is reported gone.
#[allow(clippy::too_many_arguments)]
async fn keep_lease(
    mut client: etcd_client::Client,
    lease: i64,
    mut ka: Option<KeepAlive>,
    ttl: Duration,
    beats: Option<Stamps>,
    lost: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
    retired: Arc<AtomicBool>,
) {
    let period = ttl / 3;
    let mut next = Instant::now() + period;
    let confirmed = |at: Instant| {
        if let Some(b) = &beats {
            b.record_at(at);
        }
    };
    loop {
        if stop.load(Ordering::SeqCst) || retired.load(Ordering::SeqCst) {
            return;
        }
        tokio::time::sleep(next.saturating_duration_since(Instant::now())).await;
        let Some((keeper, stream)) = ka.as_mut() else {
            match tokio::time::timeout(period, client.lease_keep_alive(lease)).await {
                // Opening reads a first reply with a positive TTL: a confirmation.
                Ok(Ok(k)) => {
                    confirmed(Instant::now());
                    ka = Some(k);
                    next = Instant::now() + period;
                }
                Ok(Err(e)) if e.to_string().contains("lease not found") => {
                    lost.store(true, Ordering::SeqCst);
                    return;
                }
                _ => next = Instant::now() + Duration::from_millis(20),
            }
            continue;
        };
        let sent = Instant::now();
        let reply = tokio::time::timeout(period, async {
            keeper.keep_alive().await?;
            stream.message().await
        })
        .await;
        match reply {
            Ok(Ok(Some(resp))) if resp.ttl() > 0 => {
                confirmed(Instant::now());
                next = sent + period;
            }
            Ok(Ok(Some(_))) => {
                lost.store(true, Ordering::SeqCst);
                return;
            }
            _ => {
                ka = None;
                next = Instant::now();
            }
        }
    }
}

/// One etcd-client contender: `lock(name, lease)` + `unlock(key)` in a loop, unbounded (the
/// client's defaults); a lost lease is replaced by a new one.
async fn etcd_client_worker(
    mut client: etcd_client::Client,
    lease: i64,
    ka: KeepAlive,
    measured: bool,
    ttl: Duration,
    name: String,
    probe: Probe,
) {
    let mut lease = lease;
    let mut lost = if measured {
        probe.lost.clone()
    } else {
        Arc::new(AtomicBool::new(false))
    };
    let mut retired = Arc::new(AtomicBool::new(false));
    tokio::spawn(keep_lease(
        client.clone(),
        lease,
        Some(ka),
        ttl,
        measured.then(|| probe.beats.clone()),
        lost.clone(),
        probe.stop.clone(),
        retired.clone(),
    ));
    while !probe.stopped() {
        let options = etcd_client::LockOptions::new().with_lease(lease);
        let failed = match client.lock(name.as_str(), Some(options)).await {
            Ok(resp) => {
                probe.grants.record();
                let _ = client.unlock(resp.key().to_vec()).await;
                false
            }
            Err(e) => {
                if e.to_string().contains("lease not found") {
                    lost.store(true, Ordering::SeqCst);
                }
                true
            }
        };
        if lost.load(Ordering::SeqCst) && !probe.stopped() {
            // A new lease, and a keep-alive loop of its own (not measured).
            retired.store(true, Ordering::SeqCst);
            let Some((l, ka)) = etcd_lease(&mut client, ttl).await else {
                continue;
            };
            lease = l;
            lost = Arc::new(AtomicBool::new(false));
            retired = Arc::new(AtomicBool::new(false));
            tokio::spawn(keep_lease(
                client.clone(),
                lease,
                Some(ka),
                ttl,
                None,
                lost.clone(),
                probe.stop.clone(),
                retired.clone(),
            ));
        } else if failed {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    retired.store(true, Ordering::SeqCst);
}

// ---------------------------------------------------------------------------------------------
// zookeeper-client

/// A zookeeper-client session of `ttl` on every server (bounded retries).
async fn zk_connect(connect: &str, ttl: Duration) -> zk::Client {
    let give_up = Instant::now() + PATIENCE;
    loop {
        match zk::Client::connector()
            .with_session_timeout(ttl)
            .connect(connect)
            .await
        {
            Ok(c) => return c,
            Err(e) if Instant::now() < give_up => {
                let _ = e;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("cannot connect zookeeper-client: {e}"),
        }
    }
}

fn zk_sid(c: &zk::Client) -> String {
    format!("{:x}", c.session_id().0 as u64)
}

fn zk_terminal(state: zk::SessionState) -> bool {
    matches!(
        state,
        zk::SessionState::Expired | zk::SessionState::Closed | zk::SessionState::AuthFailed
    )
}

/// zookeeper-client's contenders (its lock recipe, `Client::lock` + a confirmed delete), the
/// first placed at `place`.
async fn zk_client_contest(
    cluster: Arc<ZkEnsemble>,
    place: Place,
    ttl: Duration,
    dir: &str,
) -> Contest {
    let probe = Probe::default();
    let connect = cluster.connect_string();
    let mut measured = None;
    for _ in 0..40 {
        let c = zk_connect(&connect, ttl).await;
        if cluster
            .member_of(&zk_sid(&c))
            .await
            .is_some_and(|m| place.fits(m))
        {
            measured = Some(c);
            break;
        }
    }
    probe.placed.store(measured.is_some(), Ordering::SeqCst);
    let measured = match measured {
        Some(c) => c,
        None => zk_connect(&connect, ttl).await,
    };
    let mut tasks = vec![tokio::spawn(zk_ping(measured.clone(), ttl, probe.clone()))];
    for i in 0..CONTENDERS {
        let c = if i == 0 {
            measured.clone()
        } else {
            zk_connect(&connect, ttl).await
        };
        tasks.push(tokio::spawn(zk_client_worker(
            c,
            connect.clone(),
            ttl,
            dir.to_string(),
            probe.clone(),
        )));
    }
    Contest {
        name: "zookeeper-client Client::lock",
        probe,
        tasks,
    }
}

/// Our own heartbeat on a zookeeper-client session: `exists("/")` every TTL/6, awaited TTL/6;
/// records the answered ones, and whether the session is lost.
async fn zk_ping(c: zk::Client, ttl: Duration, probe: Probe) {
    let period = ttl / 6;
    while !probe.stopped() {
        let sent = Instant::now();
        match tokio::time::timeout(period, c.check_stat("/")).await {
            Ok(Ok(_)) => probe.beats.record(),
            Ok(Err(zk::Error::SessionExpired)) => probe.lost.store(true, Ordering::SeqCst),
            _ => {}
        }
        if zk_terminal(c.state()) {
            probe.lost.store(true, Ordering::SeqCst);
        }
        if probe.lost.load(Ordering::SeqCst) {
            return;
        }
        tokio::time::sleep((sent + period).saturating_duration_since(Instant::now())).await;
    }
}

/// One zookeeper-client contender: `Client::lock` (Curator's naming, as in the ZooKeeper rows)
/// and a confirmed delete in a loop; a lost session is replaced.
async fn zk_client_worker(
    mut c: zk::Client,
    connect: String,
    ttl: Duration,
    dir: String,
    probe: Probe,
) {
    while !probe.stopped() {
        let prefix = zk::LockPrefix::new_curator(&dir, "lock-").expect("prefix");
        let options = zk::LockOptions::new(zk::Acls::anyone_all())
            .with_ancestor_options(zk::CreateMode::Container.with_acls(zk::Acls::anyone_all()))
            .expect("lock options");
        match c.lock(prefix, b"", options).await {
            Ok(lock) => {
                probe.grants.record();
                let path = lock.lock_path().to_string();
                // Released here, confirmed: skip the drop's background delete.
                std::mem::forget(lock);
                for _ in 0..100 {
                    match c.delete(&path, None).await {
                        Err(zk::Error::ConnectionLoss) => {
                            tokio::time::sleep(Duration::from_millis(10)).await
                        }
                        _ => break,
                    }
                }
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
        }
        if zk_terminal(c.state()) && !probe.stopped() {
            c = zk_connect(&connect, ttl).await;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Apache Curator (Java)

/// The compiled Java programs of `tests/java/`, or why the Curator rows are skipped.
async fn curator_classes() -> Result<JavaClasses, String> {
    if !curator::installed() {
        return Err(format!("missing {}", curator::missing().join(", ")));
    }
    tokio::task::spawn_blocking(JavaClasses::compile)
        .await
        .map_err(|e| e.to_string())?
}

/// Maps the wall-clock milliseconds that the Java program prints (`System.currentTimeMillis()`)
/// onto the monotonic clock of the other implementations' records (and of the `SIGSTOP`),
/// through one (`Instant`, `SystemTime`) pair read together when the program starts.
#[derive(Clone, Copy)]
struct WallClock {
    at: Instant,
    /// Microseconds since the Unix epoch at `at`.
    micros: i128,
}

impl WallClock {
    fn now() -> Self {
        let at = Instant::now();
        let micros = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_micros() as i128);
        WallClock { at, micros }
    }

    /// The instant of `millis` milliseconds since the Unix epoch.
    fn instant(self, millis: i64) -> Instant {
        let delta = i128::from(millis) * 1000 - self.micros;
        let d = Duration::from_micros(delta.unsigned_abs() as u64);
        if delta >= 0 {
            self.at + d
        } else {
            self.at.checked_sub(d).unwrap_or(self.at)
        }
    }
}

/// Curator's contenders: `tests/java/CuratorGray.java` in a JVM of its own, [`CONTENDERS`]
/// `CuratorFramework`s (one connection each, session and connection timeout `ttl`,
/// `RetryNTimes(3, 200)`) looping `InterProcessMutex` acquire + release on `path`; the first
/// (measured) one closed and reopened until its session is placed at `place`.
async fn curator_contest(
    cluster: &ZkEnsemble,
    classes: &JavaClasses,
    place: Place,
    ttl: Duration,
    path: &str,
) -> Contest {
    let probe = Probe::default();
    let clock = WallClock::now();
    let connect = cluster.connect_string();
    let mut java = CuratorProgram::gray(classes, &connect, path, CONTENDERS, ttl, ttl, ttl / 6);
    let mut sid = String::new();
    let mut placed = false;
    for attempt in 0..40 {
        if attempt > 0 {
            java.tell("REOPEN").expect("CuratorGray runs");
        }
        sid = java.expect("SESSION ", PATIENCE).await;
        if cluster.member_of(&sid).await.is_some_and(|m| place.fits(m)) {
            placed = true;
            break;
        }
    }
    probe.placed.store(placed, Ordering::SeqCst);
    java.tell("START").expect("CuratorGray runs");
    let tasks = vec![tokio::spawn(curator_watch(java, sid, clock, probe.clone()))];
    Contest {
        name: "Curator InterProcessMutex",
        probe,
        tasks,
    }
}

/// Records `CuratorGray`'s grants and heartbeats into `probe`, and the measured session (`sid`)
/// as lost on a `LOST` state or a new session id; once the trial stops, stops the program (it is
/// killed if it does not exit within a few seconds).
async fn curator_watch(mut java: CuratorProgram, sid: String, clock: WallClock, probe: Probe) {
    let mut states = Vec::new();
    while !probe.stopped() {
        let Some(line) = java.next_line(Duration::from_millis(50)).await else {
            if java.exited().is_some() {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            continue;
        };
        let mut words = line.split_whitespace();
        let stamp = |w: &str| w.parse().ok().map(|ms| clock.instant(ms));
        match words.next() {
            Some("GRANT") => {
                for at in words.filter_map(stamp) {
                    probe.grants.record_at(at);
                }
            }
            Some("BEAT") => {
                if let Some(at) = words.next().and_then(stamp) {
                    probe.beats.record_at(at);
                }
            }
            Some("STATE") => {
                let at = words
                    .next()
                    .and_then(stamp)
                    .map_or(0.0, |t| t.saturating_duration_since(clock.at).as_secs_f64());
                let state = words.next().unwrap_or("?");
                if state == "LOST" {
                    probe.lost.store(true, Ordering::SeqCst);
                }
                states.push(format!("{state}@{at:.1}s"));
            }
            Some("SESSION") => {
                let new = words.next().unwrap_or("?");
                if new != sid {
                    probe.lost.store(true, Ordering::SeqCst);
                }
                states.push(format!("session {new}"));
            }
            Some("ERROR") => eprintln!("CuratorGray: {line}"),
            _ => {}
        }
    }
    eprintln!("Curator measured session {sid}: {states:?}");
    let _ = java.tell("STOP");
    let give_up = Instant::now() + Duration::from_secs(4);
    while java.exited().is_none() && Instant::now() < give_up {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
