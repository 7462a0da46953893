//! On a Redis Cluster, a primary that hangs (a suspended host: its connections stay open, and
//! nothing is answered) is failed over by the cluster like a dead one, but its clients do not
//! learn it by themselves: the cluster client retries a request that timed out on the same
//! node, and reads the slot map again only after a refusal, a broken connection or a redirect,
//! none of which a hung node sends. Every session holding a lock on that shard was then lost
//! at its deadline, seconds after the replica had taken over (black-box round 34). So a
//! request that times out, or a script call still unanswered after one attempt's time (the
//! cluster client's own bound, a second), has the cluster connection made again, in the
//! background, one at a time, [`REBUILD_EVERY`] apart: a new connection reads the slot map
//! from the first node that answers, and every new request takes it. Requests under way finish
//! on the old one.
//!
//! A rebuild connects to every node of the URL and of the slot map (replicas too). It happens
//! only while attempts exceed the cluster client's bound, when they fail anyway; a cluster that
//! slow for long has each client rebuild about once a second, a cost not made smaller here
//! (backing off would delay the recovery this is for).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use crate::con::RedisConnection;

use super::Primary;

/// The time from one rebuild's end to the next one's start: until the cluster has promoted
/// the replica (its node timeout and an election, seconds), each rebuild finds the hung node
/// still serving the slots.
pub(crate) const REBUILD_EVERY: Duration = Duration::from_secs(1);

impl Primary {
    /// On a cluster, how long a request's attempt may take (the cluster client's own bound);
    /// `None` elsewhere.
    pub(crate) fn cluster_attempt(&self) -> Option<Duration> {
        self.cluster
            .as_ref()
            .map(|_| self.config.timeout.min(crate::config::CLUSTER_ATTEMPT))
    }

    /// On a cluster, after a request timed out: a new connection to the cluster (in the
    /// background), unless one is being made or was made less than [`REBUILD_EVERY`] ago.
    pub(crate) fn rebuild(self: &Arc<Self>) {
        let Some(cluster) = self.cluster.clone() else {
            return;
        };
        if self.resolving.swap(true, Ordering::SeqCst) {
            return;
        }
        let primary = self.clone();
        tokio::spawn(async move {
            let made =
                tokio::time::timeout(primary.config.timeout, cluster.get_async_connection()).await;
            match made {
                Ok(Ok(con)) => {
                    primary.current().con = RedisConnection::cluster(con);
                    tracing::debug!("a request timed out: the cluster connection made again");
                }
                Ok(Err(e)) => tracing::debug!(error = %e, "no new cluster connection"),
                Err(_) => tracing::debug!("no new cluster connection within the timeout"),
            }
            tokio::time::sleep(REBUILD_EVERY).await;
            primary.resolving.store(false, Ordering::SeqCst);
        });
    }
}
