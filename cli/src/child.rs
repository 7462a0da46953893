//! Running the command under a grant: its environment, the signals passed on to it, what
//! happens when the grant is lost, and the exit status.

use std::time::Duration;

use fencelock::{LostReason, SessionEnd};
use futures_util::FutureExt;
use rustix::process::{Pid, Signal};
use tokio::process::Command;
use tokio::time::Instant;

use crate::args::RunArgs;
use crate::exit;
use crate::grant::Grant;
use crate::signals::{self, status_of, Caught, Signals};
use crate::terminal;
use crate::tree::{self, Tree};

/// How long a Ctrl-Z is given to stop the command's processes (each gets it from the terminal)
/// before fencelock sends SIGTSTP to those still running, and that before SIGSTOP.
const TSTP_WAIT: Duration = Duration::from_millis(300);

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
/// - When the grant is lost, the tree is SIGKILLed at once, without SIGTERM: the lock may be
///   another's already (at the local deadline the session is closed on the cluster, and the
///   next waiter granted, within a round trip). The status is [`exit::LOST`].
/// - When the command exits, whatever it left running gets SIGTERM, then SIGKILL after
///   `run.grace` (at once if the grant is lost meanwhile), before the grant is released:
///   nothing of it runs on without the lock. If the grant was lost by then (say, fencelock was
///   paused past its TTL), the status is [`exit::LOST`], not the command's.
/// - SIGTSTP and SIGTTIN (job control) stop the command with fencelock; continued with a grant
///   lost meanwhile, the command is killed without running again (in a terminal's foreground,
///   where the shell continues the command with fencelock, the keeper, which does not stop
///   there, has killed it while it was stopped). On a terminal, in an orphaned process group (`ssh -t host fencelock …`:
///   nobody to continue it), they are ignored, as the kernel discards a Ctrl-Z for the
///   command. For a shell's background job, job control is relayed ([`relay_job_control`]).
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
    // In a terminal's foreground the command shares fencelock's process group; elsewhere it
    // has its own (see `tree.rs`). In a terminal's background (a shell's `fencelock … &`),
    // fencelock relays job control between the shell and the command's group (below).
    let shared_group = terminal::in_terminal_foreground();
    let job = !shared_group && terminal::has_terminal();
    let leads_session = terminal::leads_session();
    let mut cmd = Command::new(program);
    cmd.args(args)
        .env("FENCELOCK_TOKEN", grant.token().to_string())
        .env("FENCELOCK_KEY", grant.key())
        .env("FENCELOCK_NAME", name)
        .kill_on_drop(true);
    crate::signals::as_without_fencelock(&mut cmd);
    let mut keeper = crate::keeper::between(&mut cmd, !shared_group);
    for (var, value) in env {
        match value {
            Some(v) => cmd.env(var, v),
            None => cmd.env_remove(var),
        };
    }
    // Held still: a stop while fencelock waited (SIGTSTP) may have outlasted the TTL.
    if !grant.is_held() {
        say!(
            "the {} {name:?} was lost ({}) before the command could start",
            grant.what(),
            reason_now(&grant)
        );
        return exit::LOST;
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
        .map(|pid| keeper.tree(pid, !shared_group))
    else {
        say!("the command has no process id");
        let _ = grant.release(release_within).await;
        return exit::SOFTWARE;
    };
    keeper.hold_until(grant.deadline());
    // A grant found lost by the clock (a resume from a long stop or suspend) stops the command
    // at once, not at the heartbeat task's next tick (a cheap check); orphans are reaped on the
    // way, once a second.
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut ticks: u64 = 0;
    let mut lost = grant.lost();
    // From here on, fencelock's own messages are written whatever the terminal's `tostop`
    // says: stopped alone by a SIGTTOU, fencelock would send no heartbeat while the command ran
    // on. (Ignored only now: the command, already started, keeps the default.)
    // SAFETY: SIG_IGN installs no handler.
    unsafe { libc::signal(libc::SIGTTOU, libc::SIG_IGN) };
    let end = loop {
        let lost_now = tokio::select! {
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
                if !grant.is_held() {
                    // Lost meanwhile (while fencelock was stopped, say): nothing is passed on,
                    // least of all a SIGCONT.
                    Some(reason_now(&grant))
                } else if signals::is_job_stop(sig) {
                    if !signals.may_stop() {
                        continue;
                    }
                    // Job control (Ctrl-Z, `kill -TSTP`, SIGTTIN): the command stops with
                    // fencelock. In a terminal's foreground it got the signal already (a
                    // Ctrl-Z), and the shell continues both (one group); what a `kill -TSTP`
                    // aimed at fencelock alone left running is stopped here. Elsewhere it is
                    // stopped here. Either way it is continued once fencelock is, if the grant
                    // was not lost meanwhile (then it is killed without running again).
                    // In a group of its own the command heard of nothing: told at once. Then,
                    // either way, what does not stop by itself (a process that handles or
                    // ignores SIGTSTP; one in an orphaned group, a `setsid` daemon, for which
                    // the kernel discards it) is stopped by SIGSTOP.
                    if !shared_group {
                        tree.signal(Signal::TSTP);
                    }
                    let stopped_here = tree.stopped_with_us(TSTP_WAIT).await;
                    signals::stop_self(caught.continues);
                    if !grant.is_held() {
                        Some(reason_now(&grant))
                    } else {
                        if !shared_group {
                            tree.signal(Signal::CONT);
                        } else {
                            for pid in stopped_here {
                                let _ = rustix::process::kill_process(pid, Signal::CONT);
                            }
                        }
                        continue;
                    }
                } else {
                    if passes_on(caught, shared_group, leads_session) {
                        tree.signal(sig);
                        tree.signal(Signal::CONT);
                    }
                    None
                }
            }
            () = tokio::time::sleep_until(near(grant.deadline())) => {
                // Close to the deadline (the heartbeats failing), a deadline that a late
                // heartbeat moved goes to the keeper within milliseconds, not at the next tick:
                // else the keeper kills the tree of a session that lives on.
                if grant.is_held() {
                    keeper.hold_until(grant.deadline());
                    None
                } else {
                    Some(reason_now(&grant))
                }
            }
            _ = tick.tick() => {
                // Reaping reads /proc: once a second is enough for zombies.
                ticks += 1;
                tree.tend(ticks.is_multiple_of(10));
                if job && grant.is_held() {
                    relay_job_control(&tree, &grant).await;
                }
                if grant.is_held() {
                    // The deadline a heartbeat moved (no write if it did not).
                    keeper.hold_until(grant.deadline());
                }
                (!grant.is_held()).then(|| reason_now(&grant))
            }
        };
        if let Some(reason) = lost_now {
            // The lock may be another's already (the cluster expired the session, someone
            // deleted the entry; lost by its local deadline, the session is closed only after
            // this, by `main::run`, and the next waiter granted then): not one more
            // instruction of the tree, and no SIGTERM handler running beside the next holder.
            tree.signal(Signal::KILL);
            say!(
                "the {} {name:?} was lost ({reason}): the command is killed",
                grant.what()
            );
            // The command reaped as it exits (not once the tree is gone): without a `/proc`
            // of our own, its zombie would keep its process group counted as alive.
            let _ = tokio::join!(
                tree.stop(Duration::ZERO),
                tokio::time::timeout(tree::KILL_WAIT, child.wait())
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
    if code == exit::LOST && keeper.deadline_passed() && grant.is_held() {
        // A heartbeat confirmed the session just before the deadline the keeper knew, too
        // late to tell it (black-box round 10: a link back at the deadline; 76 and nothing
        // said).
        say!(
            "the command was killed at the session's local deadline by its keeper: the heartbeat that extended the session came too late to tell it"
        );
    }
    // The command is gone; what it started must not run on once the grant is released, nor
    // once it is lost meanwhile (then it is killed at once).
    if !tree.is_empty() {
        say!("the command exited, leaving processes behind: stopping them");
        tokio::select! {
            biased;
            () = until_lost(&grant) => tree.stop(Duration::ZERO).await,
            () = tree.stop(run.grace) => {}
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

/// When to look at the deadline again for the keeper: 200 ms before it, then every 5 ms.
fn near(deadline: Instant) -> Instant {
    let now = Instant::now();
    let early = deadline.checked_sub(NEAR).unwrap_or(now);
    early.max(now + Duration::from_millis(5))
}

/// How long before the deadline [`near`] looks at it often.
const NEAR: Duration = Duration::from_millis(200);

/// Why the grant is lost, once `is_held` says it is: the heartbeat task's verdict, or, before
/// it has given one (the clock passed the local deadline while fencelock was stopped), that.
fn reason_now(grant: &Grant) -> LostReason {
    grant
        .lost()
        .now_or_never()
        .unwrap_or(LostReason::Session(SessionEnd::LocalDeadline))
}

/// Resolves once the grant is lost: its verdict, or the clock past the local deadline (checked
/// every 100 ms: the heartbeat task says so later).
async fn until_lost(grant: &Grant) {
    let mut lost = grant.lost();
    loop {
        if !grant.is_held() {
            return;
        }
        if tokio::time::timeout(Duration::from_millis(100), &mut lost)
            .await
            .is_ok()
        {
            return;
        }
    }
}

/// Job control for a shell's background job (`fencelock … &`), whose command has a process
/// group of its own while the shell knows fencelock alone:
/// - Brought to the foreground (`fg`: fencelock's group has the terminal) and alone in its
///   group (not one side of a pipeline, whose other side would then read from the
///   background), the job's terminal goes to the command's group, which then reads it and
///   gets its Ctrl-C; a command stopped by a read of the terminal (SIGTTIN, SIGTTOU) is
///   continued.
/// - A Ctrl-Z at the terminal then stops the command's group alone (SIGTSTP): fencelock stops
///   too, so that the shell sees the job stopped and takes the terminal back; continued, it
///   continues the command (`fg` hands the terminal over again on the next tick) — unless the
///   grant was lost meanwhile (the caller then kills it without letting it run).
/// - Where fencelock's group is orphaned (the shell is gone), a command stopped by a read of
///   the terminal is sent SIGHUP and SIGCONT, as the kernel does to an orphaned group's
///   stopped processes: nothing could continue it.
///
/// Any other stop of the command (SIGSTOP by a debugger, a `kill -TSTP` of it while it does
/// not have the terminal) is left alone: fencelock keeps heartbeating.
async fn relay_job_control(tree: &Tree, grant: &Grant) {
    let Some(group) = tree.group() else {
        return;
    };
    let stopped_by = tree.command_stopped_by();
    let has_terminal = terminal::terminal_foreground() == Some(group);
    let read_terminal = matches!(stopped_by, Some(Signal::TTIN | Signal::TTOU));
    if stopped_by == Some(Signal::TSTP) && has_terminal {
        if terminal::group_is_orphaned() {
            // Nothing could continue it: as the kernel does to an orphaned group.
            tree.signal(Signal::HUP);
            tree.signal(Signal::CONT);
            return;
        }
        // The rest of the tree (a `setsid` daemon, what handles SIGTSTP) stops too.
        let since = signals::continues();
        tree.stopped_with_us(TSTP_WAIT).await;
        signals::stop_self(since);
        if grant.is_held() {
            terminal::hand_to(group);
            tree.signal(Signal::CONT);
        }
        return;
    }
    if terminal::in_terminal_foreground() && terminal::alone_in_group() {
        terminal::hand_to(group);
        // Also a command stopped whose keeper has not stood for the stop yet: handed the
        // terminal, fencelock's group is no longer in the foreground, and no later tick would
        // come here to continue it (a CI run under load: the job stayed stopped after `fg`).
        if read_terminal || tree.command_is_stopped() {
            tree.signal(Signal::CONT);
        }
    } else if read_terminal && terminal::group_is_orphaned() {
        tree.signal(Signal::HUP);
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
        let c = |signal, sent| Caught {
            signal,
            sent,
            continues: 0,
        };
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
