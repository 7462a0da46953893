//! Finding the primary through Redis Sentinel: the `redis+sentinel://` URL, and asking the
//! sentinels where the primary of a master name is.
//!
//! Written here rather than taken from redis-rs's `sentinel` module, which asks the sentinels
//! in their configured order and waits for each answer in that order, without a timeout: one
//! hung sentinel (a paused host) would stall every failover. Here every sentinel is asked at
//! once, each bounded by the request timeout, and the answers in once all are, or a moment
//! after the first (see [`ANSWER_GRACE`]), decide: the newest configuration wins (the highest
//! `config-epoch`, which each failover raises), then the address named most. Right after a
//! failover a majority of the sentinels may still name the old primary, which takes writes
//! until they reconfigure it: a majority's word alone moved sessions back to it, where their
//! keys had expired (black-box round 22).

use std::collections::HashMap;
use std::time::Duration;

use fencelock::{Error, Result};
use futures_util::stream::{FuturesUnordered, StreamExt};
use redis::aio::MultiplexedConnection;
use redis::AsyncConnectionConfig;
use tokio::sync::Mutex as AsyncMutex;

use crate::config::redact;
use crate::error::{map, NAME};

/// The port of a sentinel given without one.
pub(crate) const DEFAULT_PORT: u16 = 26379;

/// The most sentinels a URL may name.
pub(crate) const MAX_SENTINELS: usize = 64;

/// How long the other sentinels are waited for once one has named a primary (the server
/// named must still say it is a primary). Sentinels answer in about a millisecond; without
/// it, a hung one held every connect and re-check for the whole request timeout (`fencelock
/// leader` took 5 s).
const ANSWER_GRACE: Duration = Duration::from_millis(250);

/// A `redis+sentinel://` (or `rediss+sentinel://`) URL taken apart.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct SentinelUrl {
    /// Whether the sentinels and the servers speak TLS.
    pub(crate) tls: bool,
    /// The user info (`user:password`, still percent-encoded), for the servers.
    pub(crate) userinfo: Option<String>,
    /// The sentinels' `host:port`s.
    pub(crate) sentinels: Vec<String>,
    /// The master name the sentinels monitor.
    pub(crate) master: String,
    /// The database number, if given.
    pub(crate) db: Option<u32>,
}

impl SentinelUrl {
    /// Parses `url` if it is a Sentinel URL: `Ok(None)` for any other URL.
    pub(crate) fn parse(url: &str) -> Result<Option<SentinelUrl>> {
        let (tls, rest) = if let Some(rest) = url.strip_prefix("redis+sentinel://") {
            (false, rest)
        } else if let Some(rest) = url.strip_prefix("rediss+sentinel://") {
            (true, rest)
        } else {
            return Ok(None);
        };
        let bad = |why: &str| Error::invalid_config(redact(url), why.to_string());
        crate::hosts::no_slash_in_userinfo(url, rest)?;
        let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
        let (userinfo, sentinels) =
            crate::hosts::parse(url, authority, DEFAULT_PORT, MAX_SENTINELS, "sentinel")?;
        let mut segments = path.split('/');
        let master = segments.next().unwrap_or_default();
        if master.is_empty() {
            return Err(bad(
                "a Sentinel URL names the master: redis+sentinel://HOST:PORT[,HOST:PORT...]/MASTER[/DB]",
            ));
        }
        if master.len() > 256 || !master.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(bad("a master name is at most 256 printable characters"));
        }
        let db = match segments.next() {
            None | Some("") => None,
            Some(d) => Some(
                d.parse::<u32>()
                    .map_err(|_| bad("the database must be a number"))?,
            ),
        };
        if segments.next().is_some_and(|s| !s.is_empty()) {
            return Err(bad("nothing may follow the database number"));
        }
        Ok(Some(SentinelUrl {
            tls,
            userinfo,
            sentinels,
            master: master.to_string(),
            db,
        }))
    }

    /// The URL of a server at `host` (a placeholder until the sentinels name the primary),
    /// with the credentials and database of this URL.
    pub(crate) fn server_url(&self, host: &str) -> String {
        crate::hosts::server_url(self.tls, self.userinfo.as_deref(), host, self.db)
    }

    /// The URL of the sentinel at `host` (no credentials: they are the servers').
    pub(crate) fn sentinel_url(&self, host: &str) -> String {
        crate::hosts::server_url(self.tls, None, host, None)
    }
}

impl Sentinels {
    /// The sentinels at `clients`, of the master `master`.
    pub(crate) fn new(clients: Vec<(String, redis::Client)>, master: String) -> Self {
        let cons = clients.iter().map(|_| AsyncMutex::new(None)).collect();
        Sentinels {
            clients,
            master,
            cons,
        }
    }
}

/// The sentinels of one master name.
pub(crate) struct Sentinels {
    /// Each sentinel's `host:port` and client.
    pub(crate) clients: Vec<(String, redis::Client)>,
    pub(crate) master: String,
    /// Each sentinel's connection, kept between questions (dropped after a failure).
    pub(crate) cons: Vec<AsyncMutex<Option<MultiplexedConnection>>>,
}

/// What the sentinels said.
#[derive(Debug)]
pub(crate) enum Located {
    /// The primary's address, of the newest configuration the sentinels that answered named
    /// (named by the most of them), and that configuration's epoch.
    Primary(String, u16, u64),
    /// A majority of the listed sentinels answered that they do not know the master name, and
    /// none named a primary.
    UnknownMaster,
}

impl Sentinels {
    /// Asks every sentinel at once where the primary is, each within `timeout`; returns once
    /// every sentinel answered or timed out, or [`ANSWER_GRACE`] after the first named one:
    /// the address of the highest `config-epoch` named, the one named most of those, the
    /// first named on a tie. Fails (temporary) if no sentinel answered.
    pub(crate) async fn locate(&self, timeout: Duration) -> Result<Located> {
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(timeout))
            .set_response_timeout(Some(timeout));
        let mut asks: FuturesUnordered<_> = self
            .clients
            .iter()
            .zip(&self.cons)
            .map(|((addr, client), cached)| {
                let config = config.clone();
                async move {
                    // Held while asking: a question cancelled with its connection half-used
                    // drops the connection too.
                    let mut cached = cached.lock().await;
                    let ask = async {
                        let mut con = match cached.take() {
                            Some(con) => con,
                            None => {
                                client
                                    .get_multiplexed_async_connection_with_config(&config)
                                    .await?
                            }
                        };
                        // The address as clients are meant to read it (during a failover the
                        // sentinel that runs it names the promoted replica there, where
                        // `SENTINEL MASTER` still shows the old address with the new epoch),
                        // and the configuration's epoch. An epoch not given (an ACL user
                        // allowed the address alone) counts as 0.
                        let at = redis::cmd("SENTINEL")
                            .arg("GET-MASTER-ADDR-BY-NAME")
                            .arg(&self.master)
                            .query_async::<Option<(String, u16)>>(&mut con)
                            .await?;
                        let epoch = match at {
                            None => 0,
                            Some(_) => redis::cmd("SENTINEL")
                                .arg("MASTER")
                                .arg(&self.master)
                                .query_async::<HashMap<String, String>>(&mut con)
                                .await
                                .ok()
                                .and_then(|f| f.get("config-epoch")?.parse().ok())
                                .unwrap_or(0),
                        };
                        Ok::<_, redis::RedisError>((at.map(|(h, p)| (h, p, epoch)), con))
                    };
                    let answer = match tokio::time::timeout(timeout, ask).await {
                        Ok(Ok((at, con))) => {
                            *cached = Some(con);
                            Ok(at)
                        }
                        Ok(Err(e)) if not_a_sentinel(&e) => Err(Error::invalid_config(
                            addr.as_str(),
                            "not a sentinel (it does not know the SENTINEL command): a \
                             redis+sentinel:// URL names sentinels, not Redis servers",
                        )),
                        // Which password was refused: the sentinel's own, not the servers'.
                        Ok(Err(e)) => Err(match map("ask the sentinel", e) {
                            Error::Unauthenticated { backend, source } => Error::Unauthenticated {
                                backend,
                                source: format!(
                                    "the sentinel at {addr} (its own password, not the \
                                         servers'): {source}"
                                )
                                .into(),
                            },
                            other => other,
                        }),
                        Err(_) => Err(Error::backend(
                            NAME,
                            "ask the sentinel",
                            true,
                            format!("no answer within {timeout:?}"),
                        )),
                    };
                    (addr, answer)
                }
            })
            .collect();
        let majority = self.clients.len() / 2 + 1;
        let mut named: Vec<((String, u16, u64), usize)> = Vec::new();
        let mut unknown = 0;
        let mut failures: HashMap<&str, Error> = HashMap::new();
        // Once a sentinel named a primary, the others are waited for only `ANSWER_GRACE`.
        let mut settle = None;
        loop {
            let next = match settle {
                Some(at) => match tokio::time::timeout_at(at, asks.next()).await {
                    Ok(next) => next,
                    Err(_) => break,
                },
                None => asks.next().await,
            };
            let Some((addr, answer)) = next else { break };
            match answer {
                Ok(Some(at)) => {
                    match named.iter_mut().find(|(a, _)| *a == at) {
                        Some((_, n)) => *n += 1,
                        None => named.push((at, 1)),
                    }
                    settle.get_or_insert(tokio::time::Instant::now() + ANSWER_GRACE);
                }
                Ok(None) => unknown += 1,
                Err(e) => {
                    failures.insert(addr, e);
                }
            }
        }
        match pick(&named) {
            Some((host, port, epoch)) => Ok(Located::Primary(host, port, epoch)),
            // A setting to fix only on a majority's word: a sentinel restarted without its
            // configuration knows no master while the others, silent for now, do.
            None if unknown >= majority => Ok(Located::UnknownMaster),
            // No answer, and a sentinel refused our credentials (or an ACL without
            // `SENTINEL`): a setting to fix, whatever the others did.
            None if failures.values().any(refused) => {
                let key = failures
                    .iter()
                    .find(|(_, e)| refused(e))
                    .map(|(a, _)| *a)
                    .expect("found above");
                Err(failures.remove(key).expect("found above"))
            }
            None => {
                let mut why: Vec<String> = failures
                    .into_iter()
                    // The cause ("connection refused", "no answer within 5s"), not the
                    // operation's name alone.
                    .map(|(a, e)| match std::error::Error::source(&e) {
                        Some(cause) => format!("{a}: {cause}"),
                        None => format!("{a}: {e}"),
                    })
                    .collect();
                if unknown > 0 {
                    why.push(format!(
                        "{unknown} sentinel(s) know no master of that name (fewer than a majority)"
                    ));
                }
                why.sort();
                Err(Error::Connect {
                    backend: NAME,
                    endpoints: self
                        .clients
                        .iter()
                        .map(|(a, _)| a.as_str())
                        .collect::<Vec<_>>()
                        .join(","),
                    temporary: true,
                    source: format!("no sentinel named a primary: {}", why.join("; ")).into(),
                })
            }
        }
    }
}

/// Of the addresses the sentinels named (with their configuration's epoch, and how many named
/// each), the newest configuration's, then the first of the most named.
fn pick(named: &[((String, u16, u64), usize)]) -> Option<(String, u16, u64)> {
    // `max_by_key` keeps the last of equals: reversed, the first named.
    named
        .iter()
        .rev()
        .max_by_key(|((_, _, epoch), n)| (*epoch, *n))
        .map(|(a, _)| a.clone())
}

/// Whether `e` is a refusal of our credentials or rights.
fn refused(e: &Error) -> bool {
    matches!(
        e,
        Error::Unauthenticated { .. } | Error::PermissionDenied { .. } | Error::InvalidConfig(_)
    )
}

/// Whether `e` says that the server asked does not know the `SENTINEL` command: a Redis server
/// (or a cluster node) named as a sentinel.
fn not_a_sentinel(e: &redis::RedisError) -> bool {
    e.code() == Some("ERR") && e.detail().is_some_and(|d| d.starts_with("unknown command"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_newest_configuration_wins_then_the_most_named() {
        let at = |port, epoch| ("h".to_string(), port, epoch);
        // Two sentinels not yet told of a failover name the old primary; one names the new.
        assert_eq!(pick(&[(at(1, 3), 2), (at(2, 4), 1)]), Some(at(2, 4)));
        assert_eq!(pick(&[(at(1, 4), 2), (at(2, 4), 1)]), Some(at(1, 4)));
        assert_eq!(pick(&[(at(1, 4), 1), (at(2, 4), 1)]), Some(at(1, 4)));
        assert_eq!(pick(&[]), None);
    }

    #[test]
    fn parses_sentinel_urls() {
        assert_eq!(SentinelUrl::parse("redis://h:1").unwrap(), None);
        let u = SentinelUrl::parse("redis+sentinel://app:pw@a:1,b,[::1]:3/main/2")
            .unwrap()
            .unwrap();
        assert_eq!(
            u,
            SentinelUrl {
                tls: false,
                userinfo: Some("app:pw".into()),
                sentinels: vec!["a:1".into(), "b:26379".into(), "[::1]:3".into()],
                master: "main".into(),
                db: Some(2),
            }
        );
        assert_eq!(u.server_url("x"), "redis://app:pw@x/2");
        assert_eq!(u.sentinel_url("a:1"), "redis://a:1");
        let t = SentinelUrl::parse("rediss+sentinel://s/m")
            .unwrap()
            .unwrap();
        assert!(t.tls && t.db.is_none() && t.userinfo.is_none());
        assert_eq!(t.server_url("x"), "rediss://x");
    }

    #[test]
    fn refuses_bad_sentinel_urls() {
        for bad in [
            "redis+sentinel://a:1",
            "redis+sentinel://a:1/",
            "redis+sentinel://a:1,,b/m",
            "redis+sentinel://a:0/m",
            "redis+sentinel://a:x/m",
            "redis+sentinel://:1/m",
            "redis+sentinel://a/m/x",
            "redis+sentinel://a/m/1/extra",
            "redis+sentinel://a/m\u{7f}",
            // A raw '/' in the password: read as a sentinel `app:1234` and shown (review).
            "redis+sentinel://app:1234/xyz@s1",
            // One sentinel named twice would count twice toward the majority.
            "redis+sentinel://s1,s1:26379,s2/m",
        ] {
            let e = SentinelUrl::parse(bad).unwrap_err();
            assert!(matches!(e, Error::InvalidConfig(_)), "{bad}: {e:?}");
        }
        let many = (0..=MAX_SENTINELS)
            .map(|i| format!("h{i}"))
            .collect::<Vec<_>>()
            .join(",");
        assert!(SentinelUrl::parse(&format!("redis+sentinel://{many}/m")).is_err());
        // The password never shows, whatever it holds.
        for url in [
            "redis+sentinel://u:s3cret@a:1",
            "redis+sentinel://u:s3cret/x@a:1/m",
        ] {
            let e = SentinelUrl::parse(url).unwrap_err();
            assert!(!format!("{e} {e:?}").contains("s3cret"), "{url}: {e}");
        }
    }
}
