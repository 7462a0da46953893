//! Running the command under a grant: its environment, the signals passed on to it, what
//! happens when the grant is lost, and the exit status.

use std::time::Duration;

use fencelock::{Error, FencingToken, Guard, Leadership, LostReason};
use futures_util::FutureExt;
use rustix::process::Pid;
use tokio::process::Command;

use crate::args::RunArgs;
use crate::exit;
use crate::signals::{status_of, Signals};
use crate::tree::{self, Tree};

/// What the command runs under.
pub(crate) enum Grant {
    /// A held lock.
    Lock(Guard),
    /// A leadership.
    Leader(Leadership),
}

impl Grant {
    fn token(&self) -> FencingToken {
        match self {
            Grant::Lock(g) => g.token(),
            Grant::Leader(l) => l.epoch(),
        }
    }

    fn key(&self) -> &str {
        match self {
            Grant::Lock(g) => g.key(),
            Grant::Leader(l) => l.key(),
        }
    }

    fn what(&self) -> &'static str {
        match self {
            Grant::Lock(_) => "lock",
            Grant::Leader(_) => "leadership",
        }
    }

    fn lost(&self) -> std::pin::Pin<Box<dyn std::future::Future<Output = LostReason> + Send>> {
        match self {
            Grant::Lock(g) => Box::pin(g.lost()),
            Grant::Leader(l) => Box::pin(l.lost()),
        }
    }

    fn is_held(&self) -> bool {
        match self {
            Grant::Lock(g) => g.is_held(),
            Grant::Leader(l) => l.is_leader(),
        }
    }

    /// Releases (resigns), bounded by `within`. `Err` with the reason if the grant turned out
    /// to be lost already; a failure to reach the cluster is reported on stderr and counts as
    /// released (the session's close or its TTL removes the entry).
    async fn release(&self, within: Duration) -> Result<(), LostReason> {
        let release = async {
            match self {
                Grant::Lock(g) => g.release().await,
                Grant::Leader(l) => l.resign().await,
            }
        };
        match tokio::time::timeout(within, release).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(Error::NotHeld(reason))) => Err(reason),
            Ok(Err(e)) => {
                eprintln!("fencelock: releasing the {}: {e}", self.what());
                Ok(())
            }
            Err(_) => {
                eprintln!(
                    "fencelock: releasing the {}: no answer within {within:?}",
                    self.what()
                );
                Ok(())
            }
        }
    }
}

/// How the command ended.
enum End {
    /// It exited with this status (fencelock's exit status for it).
    Exited(u8),
    /// The grant was lost while it ran.
    Lost,
}

/// Runs `run.command` holding `grant` (named `name`) and returns fencelock's exit status.
///
/// The command is the leader of a process group of its own, and its whole tree (see
/// [`crate::tree`]) is stopped together:
/// - SIGINT, SIGTERM, SIGHUP and SIGQUIT that fencelock gets are passed on to the tree once.
///   Signals a terminal sends to its foreground job reach the command only once: when
///   fencelock runs in the terminal's foreground, the terminal is handed to the command's group.
/// - When the grant is lost, the tree gets SIGTERM, then SIGKILL after `run.grace`; the status
///   is [`exit::LOST`].
/// - When the command exits, whatever it left running is stopped the same way before the grant
///   is released: nothing of it runs on without the lock. If the grant was lost by then (say,
///   fencelock was paused past its TTL), the status is [`exit::LOST`], not the command's.
/// - A signal that arrived before the command could start stops fencelock without running it.
///
/// The grant is released (confirmed, or bounded by `release_within`) before this returns.
pub(crate) async fn run_under(
    grant: Grant,
    name: &str,
    run: &RunArgs,
    env: &[(String, Option<String>)],
    signals: &mut Signals,
    release_within: Duration,
) -> u8 {
    if let Some(sig) = signals.pending() {
        let _ = grant.release(release_within).await;
        return status_of(sig);
    }
    let (program, args) = run.command.split_first().expect("clap requires a command");
    let mut cmd = Command::new(program);
    cmd.args(args)
        .env("FENCELOCK_TOKEN", grant.token().to_string())
        .env("FENCELOCK_KEY", grant.key())
        .env("FENCELOCK_NAME", name)
        .process_group(0)
        .kill_on_drop(true);
    for (var, value) in env {
        match value {
            Some(v) => cmd.env(var, v),
            None => cmd.env_remove(var),
        };
    }
    tree::adopt_orphans();
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("fencelock: cannot run {program:?}: {e}");
            let _ = grant.release(release_within).await;
            return match e.kind() {
                std::io::ErrorKind::NotFound => exit::NOT_FOUND,
                _ => exit::CANNOT_RUN,
            };
        }
    };
    let Some(tree) = child
        .id()
        .and_then(|p| Pid::from_raw(p as i32))
        .map(Tree::new)
    else {
        eprintln!("fencelock: the command has no process id");
        let _ = grant.release(release_within).await;
        return exit::SOFTWARE;
    };
    let terminal = tree.take_terminal();
    // Only a command that has the terminal is followed into a stop (Ctrl-Z).
    let mut job_control = tokio::time::interval(Duration::from_millis(100));
    job_control.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut lost = grant.lost();
    let end = loop {
        tokio::select! {
            biased;
            reason = &mut lost => {
                eprintln!(
                    "fencelock: the {} {name:?} was lost ({reason}): stopping the command",
                    grant.what()
                );
                tree.stop(run.grace).await;
                let _ = tokio::time::timeout(run.grace, child.wait()).await;
                break End::Lost;
            }
            status = child.wait() => {
                break End::Exited(match status {
                    Ok(s) => exit::of_command(s),
                    Err(e) => {
                        eprintln!("fencelock: waiting for the command: {e}");
                        exit::SOFTWARE
                    }
                });
            }
            sig = signals.recv() => tree.signal(sig),
            _ = job_control.tick(), if terminal => {
                if tree.is_stopped() {
                    tree.follow_stop();
                }
            }
        }
    };
    let code = match end {
        End::Lost => return exit::LOST,
        End::Exited(code) => code,
    };
    // The command is gone; what it started must not run on once the grant is released.
    if !tree.members().is_empty() {
        eprintln!("fencelock: the command exited, leaving processes behind: stopping them");
        tree.stop(run.grace).await;
    }
    if !grant.is_held() {
        let reason = grant.lost().now_or_never();
        return lost_meanwhile(&grant, name, reason);
    }
    match grant.release(release_within).await {
        Ok(()) => code,
        // Held when the command exited; the session ended since (it cannot have lasted past
        // the local deadline that `is_held` checked): the command's status stands.
        Err(reason @ LostReason::Session(_)) => {
            eprintln!("fencelock: releasing the {}: {reason}", grant.what());
            code
        }
        // Deleted at some moment we cannot place: maybe while the command still ran.
        Err(reason) => lost_meanwhile(&grant, name, Some(reason)),
    }
}

/// The grant was found lost once the command had exited: the command may have run part of its
/// work without it, so its status cannot stand.
fn lost_meanwhile(grant: &Grant, name: &str, reason: Option<LostReason>) -> u8 {
    let reason = reason
        .map(|r| r.to_string())
        .unwrap_or_else(|| "no heartbeat confirmed in time".to_string());
    eprintln!(
        "fencelock: the {} {name:?} was lost while the command ran ({reason}): exit {}",
        grant.what(),
        exit::LOST
    );
    exit::LOST
}
