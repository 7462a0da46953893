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
//! the member back once it answers a check. The keep-alive stream, on which the session's life
//! depends, does not even rely on replies: it is opened on an endpoint chosen here, through a
//! client of its own on that endpoint, so that a stream whose very opening goes unanswered
//! takes that endpoint out too.

use std::collections::HashMap;
use std::time::Duration;

use etcd_client::{Client, ConnectOptions};
use fencelock::Result;
use tokio::sync::Mutex as AsyncMutex;
use tracing::{debug, info};

use crate::error::map;

/// How long a change of the rotation may wait for room in the client's queue of changes
/// before it is given up (the endpoint stays as it was; the monitor tries again).
const CHANGE_WAIT: Duration = Duration::from_secs(1);

/// Has a cheap request go through `client`'s balanced channel, which takes in the changes of
/// its endpoints only as requests go through it (tower's buffer polls its discovery then): a
/// process that only holds locks sends none on it (its keep-alives and watches have streams
/// of their own), and its queue of 64 changes would fill with a member that comes and goes,
/// holding the next change, and the rotation's lock with it, for ever.
fn take_in_changes(client: &Client) {
    let mut client = client.clone();
    tokio::spawn(async move {
        let _ = tokio::time::timeout(CHANGE_WAIT * 5, client.status()).await;
    });
}

/// The endpoints in and out of the client's rotation, shared by the monitor and the sessions.
pub(crate) struct Rotation {
    inner: AsyncMutex<Inner>,
    /// The options of the clients made for keep-alive streams (the backend's own: its
    /// credentials, TLS and timeouts).
    options: ConnectOptions,
    /// The id of the cluster the connect found: an endpoint that answers as a member of
    /// another is never put in the rotation.
    pub(crate) cluster: u64,
}

impl std::fmt::Debug for Rotation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Rotation").finish_non_exhaustive()
    }
}

struct Inner {
    /// Every endpoint of the configuration (in the form the client knows it).
    endpoints: Vec<String>,
    /// Those out of the rotation now.
    left_out: Vec<String>,
    /// The endpoint of each member id learned from a status reply.
    members: HashMap<u64, String>,
    /// A client per endpoint for keep-alive streams, made when first needed.
    clients: HashMap<String, Client>,
}

impl Rotation {
    /// A rotation of `endpoints` without `left_out`, of cluster `cluster`; clients for streams
    /// are made with `options`.
    pub(crate) fn new(
        endpoints: Vec<String>,
        left_out: Vec<String>,
        options: ConnectOptions,
        cluster: u64,
    ) -> Self {
        Rotation {
            inner: AsyncMutex::new(Inner {
                endpoints,
                left_out,
                members: HashMap::new(),
                clients: HashMap::new(),
            }),
            options,
            cluster,
        }
    }

    /// An endpoint in the rotation for a keep-alive stream (`seed` spreads sessions over the
    /// members).
    pub(crate) async fn stream_endpoint(&self, seed: u64) -> String {
        let inner = self.inner.lock().await;
        let up: Vec<&String> = inner
            .endpoints
            .iter()
            .filter(|e| !inner.left_out.contains(e))
            .collect();
        // Never empty (the last endpoint is never taken out); if it were, any will do.
        let from = if up.is_empty() {
            inner.endpoints.iter().collect()
        } else {
            up
        };
        from[(seed % from.len() as u64) as usize].clone()
    }

    /// A client on `endpoint` alone, for streams (shared by the backend's sessions). The
    /// caller bounds the wait: with credentials, a new client authenticates first.
    pub(crate) async fn stream_client(&self, endpoint: &str) -> Result<Client> {
        if let Some(client) = self.inner.lock().await.clients.get(endpoint) {
            return Ok(client.clone());
        }
        let client = Client::connect([endpoint], Some(self.options.clone()))
            .await
            .map_err(|e| map("keep-alive", e))?;
        let mut inner = self.inner.lock().await;
        Ok(inner
            .clients
            .entry(endpoint.to_string())
            .or_insert(client)
            .clone())
    }

    /// Takes `client`, connected to `endpoint` alone, as the streams' client there.
    pub(crate) async fn share(&self, endpoint: &str, client: Client) {
        self.inner
            .lock()
            .await
            .clients
            .entry(endpoint.to_string())
            .or_insert(client);
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
        let removed = tokio::time::timeout(CHANGE_WAIT, client.remove_endpoint(endpoint)).await;
        take_in_changes(client);
        match removed {
            Ok(Ok(())) => {
                inner.left_out.push(endpoint.to_string());
                true
            }
            Ok(Err(e)) => {
                debug!(endpoint, error = %e, "cannot take the endpoint out");
                false
            }
            Err(_) => {
                debug!(
                    endpoint,
                    "cannot take the endpoint out: the client's changes are full"
                );
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
        let added = tokio::time::timeout(CHANGE_WAIT, client.add_endpoint(endpoint)).await;
        take_in_changes(client);
        match added {
            Ok(Ok(())) => {
                info!(
                    endpoint,
                    "etcd endpoint answers again: back in the rotation"
                );
                inner.left_out.retain(|e| e != endpoint);
            }
            Ok(Err(e)) => debug!(endpoint, error = %e, "cannot add the endpoint back"),
            Err(_) => debug!(
                endpoint,
                "cannot add the endpoint back: the client's changes are full"
            ),
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
