//! The faults of the adversity suite, one function each. Each injects its fault and heals it
//! before it returns.

use std::time::Duration;

use fencelock::{Guard, Result};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::workload::{ChildWorker, Sessions, Workload};
use crate::proxy::{Mode, Proxy};
use crate::servers::Cluster;
use crate::target::{Kind, Target};

/// What a fault may act on.
pub struct Stage<'a> {
    /// The cluster under test.
    pub cluster: &'a dyn Cluster,
    /// The proxies (one per member) in front of the cut-off worker.
    pub proxies: &'a [Proxy],
    /// The worker in a child process.
    pub child: &'a mut ChildWorker,
    /// Where the sessions connect.
    pub target: &'a Target,
    /// The workload's settings.
    pub workload: &'a Workload,
    /// Every session opened (closed at the end).
    pub sessions: &'a Sessions,
    /// How long the cluster took to elect a leader after the last leader the faults took
    /// down, as the fault that took it down measured it.
    pub election: Option<Duration>,
}

impl std::fmt::Debug for Stage<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stage")
            .field("target", self.target)
            .field("workload", self.workload)
            .finish_non_exhaustive()
    }
}

impl Stage<'_> {
    fn ttl(&self) -> Duration {
        self.workload.ttl
    }
}

/// Kills the cluster's leader and restarts it after TTL + 1 s.
pub async fn kill_leader(st: &mut Stage<'_>) {
    let leader = st.cluster.leader().await;
    st.cluster.kill(leader);
    let killed = Instant::now();
    // (A Redis pair elects nothing: the harness promotes the replica as it kills the primary.)
    if st.cluster.kind() != Kind::Redis {
        report_election(st, leader, "killed", killed).await;
    }
    tokio::time::sleep((st.ttl() + Duration::from_secs(1)).saturating_sub(killed.elapsed())).await;
    st.cluster.restart(leader);
}

/// Waits until a member other than `victim` leads, and prints how long after `since` that was:
/// the gap between grants cannot be shorter than the cluster's election.
///
/// Panics (failing the run) if none leads within a minute: a cluster that never fails over
/// must not hold CI until its limit.
async fn report_election(st: &mut Stage<'_>, victim: usize, how: &str, since: Instant) {
    let bound = Duration::from_secs(60);
    loop {
        if st.cluster.leader().await != victim {
            break;
        }
        assert!(
            since.elapsed() < bound,
            "{:?}: no member but {victim} ({how}) led within {bound:?}",
            st.cluster.kind()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let election = since.elapsed();
    st.election = Some(election);
    println!(
        "{:?}: leader {victim} {how}; another elected after {election:.2?} (TTL {:?})",
        st.cluster.kind(),
        st.ttl()
    );
}

/// Kills a follower and restarts it after TTL + 1 s.
pub async fn kill_follower(st: &mut Stage<'_>) {
    let size = st.cluster.size();
    assert!(size > 1, "a cluster of one member has no follower");
    let victim = (st.cluster.leader().await + 1) % size;
    st.cluster.kill(victim);
    tokio::time::sleep(st.ttl() + Duration::from_secs(1)).await;
    st.cluster.restart(victim);
}

/// Kills every member, the leader last, then restarts them all after a second.
///
/// The leader goes last so that nothing fails over on the way down (a Redis pair promotes its
/// replica when the primary dies first): the cluster restarts on the data it had.
pub async fn restart_cluster(st: &mut Stage<'_>) {
    let size = st.cluster.size();
    let leader = st.cluster.leader().await;
    for i in (1..=size).map(|k| (leader + k) % size) {
        st.cluster.kill(i);
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    for i in 0..st.cluster.size() {
        st.cluster.restart(i);
    }
}

/// Black-holes the proxied worker's connections (nothing flows, nothing resets) past its TTL,
/// then heals.
pub async fn cut_off_client(st: &mut Stage<'_>) {
    for p in st.proxies {
        p.set(Mode::BlackHole);
    }
    tokio::time::sleep(st.ttl() + Duration::from_secs(1)).await;
    for p in st.proxies {
        p.set(Mode::Pass);
    }
}

/// Pauses the child worker with SIGSTOP while it holds the lock (if it gets it within 10 s),
/// past its TTL, then resumes it: its late write must be refused by the fence. Returns a
/// complaint if the child held nothing when paused (the fault then proved nothing).
pub async fn pause_holder(st: &mut Stage<'_>) -> Option<String> {
    let start = Instant::now();
    while st.child.holding.lock().unwrap().is_none() && start.elapsed() < Duration::from_secs(10) {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    st.child.pause();
    let complaint = st
        .child
        .holding
        .lock()
        .unwrap()
        .is_none()
        .then(|| "pause holder: the child held nothing within 10 s: paused idle".to_string());
    tokio::time::sleep(st.ttl() + Duration::from_millis(1500)).await;
    st.child.resume();
    complaint
}

/// Queues a new session on the lock, then stops its heartbeats so that it expires while it
/// waits. Returns its acquisition, which must end with `SessionLost` (or a grant before the
/// expiry).
pub async fn expire_waiter(st: &mut Stage<'_>) -> JoinHandle<Result<Guard>> {
    let s = st.target.session(&st.workload.namespace, st.ttl()).await;
    st.sessions.lock().unwrap().push((false, s.clone()));
    let m = s.mutex(&st.workload.lock).expect("mutex");
    let waiting = tokio::spawn(async move { m.lock_timeout(Duration::from_secs(30)).await });
    tokio::time::sleep(Duration::from_millis(200)).await;
    s.halt_heartbeats();
    tokio::time::sleep(st.ttl() + Duration::from_secs(1)).await;
    waiting
}

/// Pauses (SIGSTOP) the leader, or a follower, for 3 × TTL, then resumes it: a hung member
/// still accepts connections and answers nothing.
pub async fn pause_member(st: &mut Stage<'_>, leader: bool) {
    let size = st.cluster.size();
    assert!(size > 1, "a cluster of one member cannot lose one");
    let lead = st.cluster.leader().await;
    let victim = if leader { lead } else { (lead + 1) % size };
    if !leader {
        return pause_for(st, victim).await;
    }
    // How long the others take to elect another leader: with a short TTL, sessions may be
    // lost only if no leader could confirm anything before their deadline.
    st.cluster.pause(victim);
    let paused = Instant::now();
    report_election(st, victim, "paused", paused).await;
    tokio::time::sleep((st.ttl() * 3).saturating_sub(paused.elapsed())).await;
    st.cluster.resume(victim);
}

/// Pauses, for 3 × TTL, the follower that the first direct session connected to a follower
/// is connected to (where the cluster can tell: ZooKeeper), else a follower.
pub async fn pause_connected(st: &mut Stage<'_>) {
    let direct: Vec<String> = st
        .sessions
        .lock()
        .unwrap()
        .iter()
        .filter(|(direct, _)| *direct)
        .map(|(_, s)| s.id())
        .collect();
    let leader = st.cluster.leader().await;
    for id in direct {
        if let Some(member) = st.cluster.member_of(&id).await {
            if member != leader {
                return pause_for(st, member).await;
            }
        }
    }
    pause_member(st, false).await
}

async fn pause_for(st: &mut Stage<'_>, victim: usize) {
    st.cluster.pause(victim);
    tokio::time::sleep(st.ttl() * 3).await;
    st.cluster.resume(victim);
}

/// Delays the proxied worker's traffic by TTL/3 each way for 3 × TTL, then heals.
pub async fn slow_link(st: &mut Stage<'_>) {
    for p in st.proxies {
        p.set(Mode::Delay(st.ttl() / 3));
    }
    tokio::time::sleep(st.ttl() * 3).await;
    for p in st.proxies {
        p.set(Mode::Pass);
    }
}

/// Drops the proxied worker's server-to-client traffic (its requests still reach the
/// cluster) for 2 × TTL, then heals.
pub async fn one_way_link(st: &mut Stage<'_>) {
    for p in st.proxies {
        p.set(Mode::BlackHoleReplies);
    }
    tokio::time::sleep(st.ttl() * 2).await;
    for p in st.proxies {
        p.set(Mode::Pass);
    }
}
