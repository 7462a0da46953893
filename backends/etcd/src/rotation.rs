//! The client's rotation: the endpoints etcd-client balances new requests and streams over,
//! which member each endpoint is, and taking a member out at once when a session's stream on
//! it went silent.
//!
//! The endpoint monitor ([`monitor`](crate::connect::monitor)) takes a member out after it
//! missed two status checks (about a second and a half), which is too late for a stream: at the
//! shortest TTL (2 s) a heartbeat has a third of a second left for its retry, and etcd-client's
//! balanced channel sends a new stream to any endpoint still in the rotation — possibly the
//! silent one again. A stream knows its member (every reply's header names it), so a stream
//! that goes silent takes its member out itself, before it is opened again; the monitor puts
//! the member back once it answers a check.

use std::collections::HashMap;

use etcd_client::Client;
use tokio::sync::Mutex as AsyncMutex;
use tracing::{debug, info};

/// The endpoints in and out of the client's rotation, shared by the monitor and the sessions.
#[derive(Debug)]
pub(crate) struct Rotation {
    inner: AsyncMutex<Inner>,
}

#[derive(Debug)]
struct Inner {
    /// Every endpoint of the configuration (in the form the client knows it).
    endpoints: Vec<String>,
    /// Those out of the rotation now.
    left_out: Vec<String>,
    /// The endpoint of each member id learned from a status reply.
    members: HashMap<u64, String>,
}

impl Rotation {
    /// A rotation of `endpoints` without `left_out`.
    pub(crate) fn new(endpoints: Vec<String>, left_out: Vec<String>) -> Self {
        Rotation {
            inner: AsyncMutex::new(Inner {
                endpoints,
                left_out,
                members: HashMap::new(),
            }),
        }
    }

    /// Records that `endpoint` is the member `member` (from its status reply).
    pub(crate) async fn learned(&self, endpoint: &str, member: u64) {
        self.inner
            .lock()
            .await
            .members
            .insert(member, endpoint.to_string());
    }

    /// Takes `endpoint` out of the rotation, unless it is out already or the last one in it
    /// (a client with no endpoint cannot even find out that one came back). Returns whether
    /// it was taken out.
    pub(crate) async fn take_out(&self, client: &Client, endpoint: &str) -> bool {
        let mut inner = self.inner.lock().await;
        if inner.left_out.iter().any(|e| e == endpoint)
            || inner.left_out.len() + 1 >= inner.endpoints.len()
        {
            return false;
        }
        // Awaited under the lock: the removal is queued before any stream opened after this
        // returns, so that stream cannot be sent to the endpoint.
        match client.remove_endpoint(endpoint).await {
            Ok(()) => {
                inner.left_out.push(endpoint.to_string());
                true
            }
            Err(e) => {
                debug!(endpoint, error = %e, "cannot take the endpoint out");
                false
            }
        }
    }

    /// Puts `endpoint` back into the rotation (it answers again).
    pub(crate) async fn put_back(&self, client: &Client, endpoint: &str) {
        let mut inner = self.inner.lock().await;
        if !inner.left_out.iter().any(|e| e == endpoint) {
            return;
        }
        match client.add_endpoint(endpoint).await {
            Ok(()) => {
                info!(
                    endpoint,
                    "etcd endpoint answers again: back in the rotation"
                );
                inner.left_out.retain(|e| e != endpoint);
            }
            Err(e) => debug!(endpoint, error = %e, "cannot add the endpoint back"),
        }
    }

    /// A stream on `member` got no answer in time: its endpoint is taken out of the rotation
    /// at once, so that the stream opened next goes to another member. The monitor puts it
    /// back as soon as it answers a status check: a member wrongly suspected (a follower that
    /// waited for a paused leader, a reply late on a loaded machine) is out for about half a
    /// second. An unknown member (no status reply from it yet) is left alone.
    pub(crate) async fn suspect(&self, client: &Client, member: u64) {
        let endpoint = self.inner.lock().await.members.get(&member).cloned();
        if let Some(endpoint) = endpoint {
            if self.take_out(client, &endpoint).await {
                info!(%endpoint, "etcd member silent on a stream: out of the rotation");
            }
        }
    }
}
