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
        crate::hosts::no_slash_in_userinfo(url, rest)?;
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

/// How many hash slots a Redis Cluster has.
const SLOTS: usize = 16384;

/// A slot of every primary of the cluster that is not marked failed (the first it serves), from
/// `CLUSTER NODES` (asked of any node): a request routed by it goes to that primary through the
/// client's slot map, which makes the connection if it has none yet (routing by address
/// would fail then). A `CLUSTERDOWN` error (temporary) if those primaries do not serve every
/// slot: a shard without a live primary would be left out, and a listing of the others taken
/// for the whole (`fencelock list` printed nothing, exit 0, while a lock was held there).
pub(crate) async fn primaries(con: &mut RedisConnection) -> redis::RedisResult<Vec<u16>> {
    let text: String = redis::cmd("CLUSTER").arg("NODES").query_async(con).await?;
    let (firsts, served) = live_primaries(&text);
    if served < SLOTS {
        return Err(redis::RedisError::from((
            redis::ErrorKind::Server(redis::ServerErrorKind::ClusterDown),
            "not every slot has a live primary",
            format!("{served} of {SLOTS} slots are served"),
        )));
    }
    Ok(firsts)
}

/// The first slot of each live primary in a `CLUSTER NODES` reply, and how many slots they
/// serve together.
fn live_primaries(nodes: &str) -> (Vec<u16>, usize) {
    let mut served = vec![false; SLOTS];
    let firsts = nodes
        .lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split(' ').collect();
            let flags = fields.get(2)?;
            let primary = flags.split(',').any(|f| f == "master")
                && !flags.split(',').any(|f| f == "fail" || f == "noaddr");
            if !primary {
                return None;
            }
            // Slots from the ninth field: `0-5460`, `5461`, or `[…]` (a slot migrating).
            let ranges: Vec<(usize, usize)> = fields
                .get(8..)?
                .iter()
                .filter_map(|r| {
                    let (start, end) = r.split_once('-').unwrap_or((r, r));
                    let (start, end) = (start.parse().ok()?, end.parse().ok()?);
                    (start <= end && end < SLOTS).then_some((start, end))
                })
                .collect();
            for &(start, end) in &ranges {
                served[start..=end].iter_mut().for_each(|s| *s = true);
            }
            ranges.first().map(|&(start, _)| start as u16)
        })
        .collect();
    (firsts, served.iter().filter(|s| **s).count())
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
    fn slots_served_by_live_primaries() {
        let nodes = "\
a 127.0.0.1:1@2 myself,master - 0 0 1 connected 0-5460
b 127.0.0.1:3@4 master - 0 0 2 connected 5461-10922 [10923->-c]
c 127.0.0.1:5@6 master,fail - 0 0 3 connected 10923-16383
d 127.0.0.1:7@8 slave a 0 0 1 connected";
        let (firsts, served) = live_primaries(nodes);
        assert_eq!((firsts, served), (vec![0, 5461], 10923));
        let healed = nodes.replace("master,fail", "master");
        assert_eq!(live_primaries(&healed), (vec![0, 5461, 10923], SLOTS));
    }

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
