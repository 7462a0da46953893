//! `fencelock observe`: the leader of an election, then every change, until interrupted. A
//! session lost meanwhile (the cluster paused or cut off past the TTL) is replaced by a new
//! one and the watch goes on: an observer owns nothing, and a monitor that ends at the first
//! hiccup of the cluster is no monitor. Only a cluster that cannot be reached again within
//! `--connect-timeout` ends it (69).

use fencelock::{Error, Result, Session, SessionEnd, SessionState};
use futures_util::StreamExt;

use crate::args::{ClusterArgs, Output};
use crate::message::describe;
use crate::signals::{Signals, Stopped};
use crate::{cluster, exit, print, show};

/// How one session's watch ended.
enum Ended {
    /// Nobody reads stdout any more, or a signal (0), or the output failed (70): done.
    Done(u8),
    /// The session was lost: a new one may go on.
    Lost(Error),
}

/// Watches `name` through `session`, then through new sessions as each is lost. Returns the
/// exit status.
pub(crate) async fn observe(
    session: &Session,
    args: &ClusterArgs,
    name: &str,
    output: Output,
    signals: &mut Signals,
) -> Result<u8> {
    // The last line printed: a new session's first answer repeats it unless it changed.
    let mut last = None;
    let mut current = session.clone();
    let mut replaced = false;
    let status = loop {
        match watch(&current, name, output, signals, &mut last).await {
            Err(e) => break Err(e),
            Ok(Ended::Done(code)) => break Ok(code),
            Ok(Ended::Lost(e)) => {
                say!("{} (starting a new session)", describe(&e));
                let next = match signals.until(cluster::session(args)).await {
                    Stopped::Signal(_) => break Ok(0),
                    Stopped::Done(Ok(s)) => s,
                    Stopped::Done(Err(e)) => {
                        say!("{}", describe(&e));
                        break Ok(exit::of_session_start(&e));
                    }
                };
                if replaced {
                    // Its close only ends it here if it is lost; bounded all the same (one
                    // given up after a TTL of temporary errors may still be live).
                    let _ = tokio::time::timeout(args.connect_timeout, current.close()).await;
                }
                current = next;
                replaced = true;
            }
        }
    };
    if replaced {
        let bound = args.connect_timeout;
        if tokio::time::timeout(bound, current.close()).await.is_err() {
            say!("closing the session: no answer within {bound:?}");
        }
    }
    status
}

/// One session's watch: prints each change (not a repeat of `last`).
async fn watch(
    session: &Session,
    name: &str,
    output: Output,
    signals: &mut Signals,
    last: &mut Option<String>,
) -> Result<Ended> {
    let changes = session.election(name)?.observe();
    let watched = signals
        .until(async {
            tokio::pin!(changes);
            // Failing since (temporary errors one after the other): for a TTL, as long as a
            // session holding something would have lasted, and the session is given up for a
            // new one, whose start says whether the cluster can be reached (a session holding
            // nothing may never be lost: on a Redis Cluster it sends no heartbeat).
            let mut failing_since: Option<tokio::time::Instant> = None;
            while let Some(change) = changes.next().await {
                if change.is_ok() {
                    failing_since = None;
                }
                match change {
                    Ok(leader) => {
                        let line = show::leader(name, leader.as_ref(), output);
                        if last.as_deref() == Some(line.as_str()) {
                            continue;
                        }
                        if let std::ops::ControlFlow::Break(code) = print(&line) {
                            return Ok(Ended::Done(code));
                        }
                        *last = Some(line);
                    }
                    Err(e @ Error::SessionLost(_)) => return Ok(Ended::Lost(e)),
                    Err(e) if e.is_temporary() => {
                        let since = *failing_since.get_or_insert_with(tokio::time::Instant::now);
                        if since.elapsed() >= session.ttl() {
                            return Ok(Ended::Lost(e));
                        }
                        say!("{} (retrying)", describe(&e))
                    }
                    Err(e) => return Err(e),
                }
            }
            // The stream ends with its session.
            let end = match session.state() {
                SessionState::Lost(end) => end,
                _ => SessionEnd::Closed,
            };
            Ok(Ended::Lost(Error::SessionLost(end)))
        })
        .await;
    match watched {
        Stopped::Signal(_) => Ok(Ended::Done(0)),
        Stopped::Done(r) => r,
    }
}
