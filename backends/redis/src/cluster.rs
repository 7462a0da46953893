//! Redis Cluster: the `redis+cluster://` URL, and the primaries of a cluster (for the reads
//! that must ask every one of them).

use fencelock::{Error, Result};
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};

use crate::con::{Inner, RedisConnection};
use crate::config::redact;

/// The port of a node given without one.
pub(crate) const DEFAULT_PORT: u16 = 6379;

/// The most nodes a URL may name (the client finds the others itself).
pub(crate) const MAX_NODES: usize = 64;

/// A `redis+cluster://` (or `rediss+cluster://`) URL taken apart.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct ClusterUrl {
    /// Whether the nodes speak TLS.
    pub(crate) tls: bool,
    /// The user info (`user:password`, still percent-encoded).
    pub(crate) userinfo: Option<String>,
    /// The `host:port`s of the nodes to start from.
    pub(crate) nodes: Vec<String>,
}

impl ClusterUrl {
    /// Parses `url` if it is a cluster URL: `Ok(None)` for any other URL.
    pub(crate) fn parse(url: &str) -> Result<Option<ClusterUrl>> {
        let (tls, rest) = if let Some(rest) = url.strip_prefix("redis+cluster://") {
            (false, rest)
        } else if let Some(rest) = url.strip_prefix("rediss+cluster://") {
            (true, rest)
        } else {
            return Ok(None);
        };
        let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
        if !path.is_empty() && path != "0" {
            return Err(Error::invalid_config(
                redact(url),
                "a Redis Cluster has database 0 only: redis+cluster://HOST:PORT[,HOST:PORT...]",
            ));
        }
        let (userinfo, nodes) =
            crate::hosts::parse(url, authority, DEFAULT_PORT, MAX_NODES, "node")?;
        Ok(Some(ClusterUrl {
            tls,
            userinfo,
            nodes,
        }))
    }

    /// The URL of the node at `host`, with the credentials of this URL.
    pub(crate) fn node_url(&self, host: &str) -> String {
        crate::hosts::server_url(self.tls, self.userinfo.as_deref(), host, None)
    }
}

/// A slot of every primary of the cluster that is not marked failed (the first it serves), from
/// `CLUSTER NODES` (asked of any node): a request routed by it goes to that primary through the
/// client's slot map, which makes the connection if it has none yet (routing by address
/// would fail then).
pub(crate) async fn primaries(con: &mut RedisConnection) -> redis::RedisResult<Vec<u16>> {
    let text: String = redis::cmd("CLUSTER").arg("NODES").query_async(con).await?;
    Ok(text
        .lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split(' ').collect();
            let flags = fields.get(2)?;
            let primary = flags.split(',').any(|f| f == "master")
                && !flags.split(',').any(|f| f == "fail" || f == "noaddr");
            // Slots from the ninth field: `0-5460`, `5461`, or `[…]` (a slot migrating).
            let first = fields.get(8..)?.iter().find_map(|r| {
                let start = r.split('-').next()?;
                start.parse::<u16>().ok()
            })?;
            primary.then_some(first)
        })
        .collect())
}

/// A `PING` to one node: on a cluster, a primary at random, tried up to three times (a
/// `PING` sent as is goes to every primary, and fails while any one is down).
pub(crate) async fn ping_one(con: &mut RedisConnection) -> redis::RedisResult<()> {
    let Inner::Cluster(c) = &mut con.0 else {
        return redis::cmd("PING").query_async(con).await;
    };
    let mut last = None;
    for _ in 0..3 {
        let routing = RoutingInfo::SingleNode(SingleNodeRoutingInfo::RandomPrimary);
        match c.route_command(redis::cmd("PING"), routing).await {
            Ok(_) => return Ok(()),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| (redis::ErrorKind::Io, "no node answered").into()))
}

/// Sends `cmd` to the primary that serves `slot` of the cluster `con` connects to.
pub(crate) async fn on_node<T: redis::FromRedisValue>(
    con: &mut RedisConnection,
    slot: u16,
    cmd: redis::Cmd,
) -> redis::RedisResult<T> {
    match &mut con.0 {
        Inner::Cluster(c) => {
            let routing = RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(Route::new(
                slot,
                SlotAddr::Master,
            )));
            let value = c.route_command(cmd, routing).await?;
            redis::from_redis_value(value).map_err(Into::into)
        }
        Inner::Server(_) => cmd.query_async(con).await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        assert_eq!(ClusterUrl::parse("redis://a:1").unwrap(), None);
        let u = ClusterUrl::parse("redis+cluster://u:p@a:7000,b,[::1]:7001/")
            .unwrap()
            .unwrap();
        assert_eq!(u.nodes, ["a:7000", "b:6379", "[::1]:7001"]);
        assert_eq!(u.node_url("a:7000"), "redis://u:p@a:7000");
        assert!(
            ClusterUrl::parse("rediss+cluster://a:1")
                .unwrap()
                .unwrap()
                .tls
        );
        for bad in [
            "redis+cluster://",
            "redis+cluster://a:1,,b:2",
            "redis+cluster://a:0",
            "redis+cluster://a:1/3",
            "redis+cluster://u:secret@a:x",
        ] {
            let e = ClusterUrl::parse(bad).unwrap_err().to_string();
            assert!(!e.contains("secret"), "{e}");
        }
        let many = (0..65)
            .map(|i| format!("h{i}:1"))
            .collect::<Vec<_>>()
            .join(",");
        assert!(ClusterUrl::parse(&format!("redis+cluster://{many}")).is_err());
    }
}
