//! Running the command under a grant: its environment, the signals passed on to it, what
//! happens when the grant is lost, and the exit status.

use std::time::Duration;

use fencelock::{Error, FencingToken, Guard, Leadership, LostReason, Session, SessionEnd};
use futures_util::FutureExt;
use rustix::process::{Pid, Signal};
use tokio::process::Command;

use crate::args::RunArgs;
use crate::exit;
use crate::signals::{self, status_of, Caught, Signals};
use crate::terminal;
use crate::tree::{self, Tree};

/// How long a Ctrl-Z is given to stop the command's processes (each gets it from the terminal)
/// before fencelock sends SIGTSTP to those still running, and that before SIGSTOP.
const TSTP_WAIT: Duration = Duration::from_millis(300);

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
                say!(
                    "releasing the {}: {}",
                    self.what(),
                    crate::message::describe(&e)
                );
                Ok(())
            }
            Err(_) => {
                say!("releasing the {}: no answer within {within:?}", self.what());
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
/// The command's whole tree (see [`crate::tree`]) is stopped together:
/// - Every signal fencelock catches (see [`crate::signals`]) is passed on to the tree once,
///   but those the terminal sent the command itself ([`passes_on`]).
/// - When the grant is lost, the tree gets SIGTERM, then SIGKILL after `run.grace`, cut to what
///   is left before the cluster may grant the lock to another ([`grace_after_loss`]): SIGKILL
///   at once when that moment has passed or the cluster ended the grant itself; the status is
///   [`exit::LOST`].
/// - When the command exits, whatever it left running is stopped the same way before the grant
///   is released: nothing of it runs on without the lock. If the grant was lost by then (say,
///   fencelock was paused past its TTL), the status is [`exit::LOST`], not the command's.
/// - SIGTSTP (job control) stops the command with fencelock; continued with a grant lost
///   meanwhile, the command is stopped for good without running again. On a terminal, in an
///   orphaned process group (`ssh -t host fencelock …`: nobody to continue it), SIGTSTP is
///   ignored, as the kernel discards a Ctrl-Z for the command. For a shell's background job,
///   job control is relayed ([`relay_job_control`]).
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
    session: &Session,
) -> u8 {
    if let Some(sig) = signals.pending() {
        let _ = grant.release(release_within).await;
        return status_of(sig);
    }
    let (program, args) = run.command.split_first().expect("clap requires a command");
    // In a terminal's foreground the command shares fencelock's process group; elsewhere it
    // has its own (see `tree.rs`). In a terminal's background (a shell's `fencelock … &`),
    // fencelock relays job control between the shell and the command's group (below).
    let shared_group = tree::in_terminal_foreground();
    let job = !shared_group && tree::has_terminal();
    let leads_session = tree::leads_session();
    let mut cmd = Command::new(program);
    cmd.args(args)
        .env("FENCELOCK_TOKEN", grant.token().to_string())
        .env("FENCELOCK_KEY", grant.key())
        .env("FENCELOCK_NAME", name)
        .kill_on_drop(true);
    if !shared_group {
        cmd.process_group(0);
    }
    for (var, value) in env {
        match value {
            Some(v) => cmd.env(var, v),
            None => cmd.env_remove(var),
        };
    }
    tree::adopt_orphans();
    // The command may not read our environment (credentials) through /proc; it gets its own
    // dumpable state back at exec.
    let _ = rustix::process::set_dumpable_behavior(rustix::process::DumpableBehavior::NotDumpable);
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            say!("cannot run {program:?}: {e}");
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
        .map(|pid| Tree::new(pid, !shared_group))
    else {
        say!("the command has no process id");
        let _ = grant.release(release_within).await;
        return exit::SOFTWARE;
    };
    // A grant found lost by the clock (a resume from a long stop or suspend) stops the command
    // at once, not at the heartbeat task's next tick (a cheap check); orphans are reaped on the
    // way, once a second.
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut ticks: u64 = 0;
    let mut lost = grant.lost();
    let end = loop {
        let reason = tokio::select! {
            biased;
            reason = &mut lost => Some(reason),
            status = child.wait() => {
                break End::Exited(match status {
                    Ok(s) => exit::of_command(s),
                    Err(e) => {
                        say!("waiting for the command: {e}");
                        exit::SOFTWARE
                    }
                });
            }
            caught = signals.recv() => {
                let sig = caught.signal;
                if sig == Signal::TSTP && !signals.may_stop() {
                    continue;
                }
                if sig == Signal::TSTP {
                    // Job control (Ctrl-Z, `kill -TSTP`): the command stops with fencelock. In
                    // a terminal's job it got the signal already (a Ctrl-Z, a shell's `kill
                    // -TSTP %1`), and the shell continues both (one group); what a `kill -TSTP`
                    // aimed at fencelock alone left running is stopped here. Elsewhere it is
                    // stopped here. Either way it is continued once fencelock is, if the
                    // grant was not lost meanwhile (then the lost path stops it without
                    // letting it run again).
                    let mut stopped_here = Vec::new();
                    if shared_group {
                        stopped_here = tree.stopped_with_us(TSTP_WAIT).await;
                    } else {
                        tree.signal(Signal::TSTP);
                    }
                    signals::stop_self();
                    if !grant.is_held() {
                        tick.reset_immediately();
                    } else if !shared_group {
                        tree.signal(Signal::CONT);
                    } else {
                        for pid in stopped_here {
                            let _ = rustix::process::kill_process(pid, Signal::CONT);
                        }
                    }
                    continue;
                }
                if passes_on(caught, shared_group, leads_session) {
                    tree.signal(sig);
                    tree.signal(Signal::CONT);
                }
                None
            }
            _ = tick.tick() => {
                // Reaping reads /proc: once a second is enough for zombies.
                ticks += 1;
                if ticks.is_multiple_of(10) {
                    tree.reap();
                }
                if job && grant.is_held() {
                    relay_job_control(&tree, &grant);
                }
                (!grant.is_held()).then(|| grant.lost().now_or_never()).flatten()
            }
        };
        if let Some(reason) = reason {
            let grace = grace_after_loss(reason, run.grace, session);
            if grace.is_zero() {
                // The lock may be another's already: not one more instruction of the tree.
                tree.signal(Signal::KILL);
            }
            say!(
                "the {} {name:?} was lost ({reason}): stopping the command",
                grant.what()
            );
            // The command reaped as it exits (not once the tree is gone): without a `/proc`
            // of our own, its zombie would keep its process group counted as alive.
            let _ = tokio::join!(
                tree.stop(grace),
                tokio::time::timeout(grace + tree::KILL_WAIT, child.wait())
            );
            break End::Lost;
        }
    };
    if let (true, Some(group)) = (job, tree.group()) {
        terminal::take_back_from(group);
    }
    let code = match end {
        End::Lost => return exit::LOST,
        End::Exited(code) => code,
    };
    // The command is gone; what it started must not run on once the grant is released, nor
    // once it is lost meanwhile.
    if !tree.members().is_empty() {
        say!("the command exited, leaving processes behind: stopping them");
        tokio::select! {
            () = tree.stop(run.grace) => {}
            reason = grant.lost() => {
                let grace = grace_after_loss(reason, run.grace, session);
                tree.stop(grace).await;
            }
        }
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
            say!("releasing the {}: {reason}", grant.what());
            code
        }
        // Deleted at some moment we cannot place: maybe while the command still ran.
        Err(reason) => lost_meanwhile(&grant, name, Some(reason)),
    }
}

/// How long the tree may take to exit after SIGTERM once the grant is found lost for
/// `reason`: `grace`, cut to what is left before the cluster may give the lock to another
/// (half the session's safety margin past its local deadline, the other half left for the
/// clocks' drift); nothing at all (SIGKILL at once) once that moment has passed (fencelock was
/// stopped or paused meanwhile), or when the cluster ended the grant itself (expired it, or
/// its entry was deleted): the lock may be another's already.
fn grace_after_loss(reason: LostReason, grace: Duration, session: &Session) -> Duration {
    match reason {
        LostReason::Session(SessionEnd::LocalDeadline) => {
            let kill_by = session.deadline() + session.safety_margin() / 2;
            grace.min(kill_by.saturating_duration_since(tokio::time::Instant::now()))
        }
        _ => Duration::ZERO,
    }
}

/// Job control for a job's command, in a process group of its own (a shell's `fencelock … &`;
/// the shell knows fencelock alone, and waits for it):
/// - The job brought to the foreground (`fg`: fencelock's group has the terminal): the
///   terminal goes to the command's group, which then reads it and gets its Ctrl-C.
/// - The command stopped by itself (SIGTTIN for a read of the terminal from the background,
///   SIGTTOU for a write under `stty tostop`, SIGTSTP for a Ctrl-Z once it has the terminal):
///   fencelock stops too, so that the shell sees the job stopped, and once continued (`fg`,
///   `bg`) continues the command, the terminal handed over if the job is in the foreground —
///   unless the grant was lost meanwhile (the caller's lost path then stops it for good). A
///   terminal read stopped in the foreground only because the terminal was not handed over
///   yet is continued at once. In an orphaned group nothing could continue fencelock: it does
///   not stop (and the kernel stops nothing there for a terminal read: the read fails).
fn relay_job_control(tree: &Tree, grant: &Grant) {
    let Some(group) = tree.group() else {
        return;
    };
    let Some(stopped_by) = tree.command_stopped_by() else {
        terminal::hand_to(group);
        return;
    };
    let terminal_read = matches!(stopped_by, Signal::TTIN | Signal::TTOU);
    if !(terminal_read && tree::in_terminal_foreground()) {
        if tree::group_is_orphaned() {
            return;
        }
        if terminal_read {
            // Its default action stops fencelock, and the shell reports why.
            let _ = signal_hook::low_level::raise(stopped_by.as_raw());
        } else {
            // SIGTSTP is fencelock's own to handle: stopped the plain way.
            signals::stop_self();
        }
    }
    if grant.is_held() {
        terminal::hand_to(group);
        tree.signal(Signal::CONT);
    }
}

/// Whether `caught` is passed on to the command's tree: every signal but one the kernel sent
/// the command itself. A terminal's Ctrl-C, Ctrl-\ and hangup go from the kernel to its whole
/// foreground process group, the command's too where it shares fencelock's
/// (`shared_group`); but the hangup of a terminal goes to its session's leader alone, which
/// fencelock may be (`ssh -t host fencelock …`), and then the command hears of it only from
/// fencelock. A signal a process sent (`kill`) reached fencelock alone — unless it was sent to
/// fencelock's whole group (`kill -- -PGID`), in which case the command gets it twice.
fn passes_on(caught: Caught, shared_group: bool, leads_session: bool) -> bool {
    let from_the_terminal =
        !caught.sent && matches!(caught.signal, Signal::INT | Signal::QUIT | Signal::HUP);
    !shared_group || !from_the_terminal || (caught.signal == Signal::HUP && leads_session)
}

/// The grant was found lost once the command had exited: the command may have run part of its
/// work without it, so its status cannot stand.
fn lost_meanwhile(grant: &Grant, name: &str, reason: Option<LostReason>) -> u8 {
    let reason = reason
        .map(|r| r.to_string())
        .unwrap_or_else(|| "no heartbeat confirmed in time".to_string());
    say!(
        "the {} {name:?} was lost while the command ran ({reason}): exit {}",
        grant.what(),
        exit::LOST
    );
    exit::LOST
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_is_passed_on() {
        let c = |signal, sent| Caught { signal, sent };
        // Of its own group (no terminal): everything.
        assert!(passes_on(c(Signal::INT, false), false, false));
        assert!(passes_on(c(Signal::USR1, true), false, false));
        // Sharing the terminal's group: not what the terminal sent the command too.
        assert!(!passes_on(c(Signal::INT, false), true, false));
        assert!(!passes_on(c(Signal::QUIT, false), true, false));
        assert!(!passes_on(c(Signal::HUP, false), true, false));
        // ... but a hangup to the session's leader alone, and what a process sent.
        assert!(passes_on(c(Signal::HUP, false), true, true));
        assert!(passes_on(c(Signal::INT, true), true, false));
        assert!(passes_on(c(Signal::TERM, true), true, false));
        assert!(passes_on(c(Signal::USR2, true), true, false));
    }
}
