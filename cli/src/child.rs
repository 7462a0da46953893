//! Running the command under a grant: its environment, the signals passed on to it, and what
//! happens when the grant is lost.

use std::time::Duration;

use fencelock::{FencingToken, Guard, Leadership, LostReason};
use rustix::process::{kill_process, Pid, Signal};
use tokio::process::{Child, Command};
use tokio::signal::unix::{signal, SignalKind};

use crate::args::RunArgs;
use crate::exit;

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

    /// Releases (resigns), reporting a failure on stderr: the command's status stands.
    async fn release(&self) {
        let res = match self {
            Grant::Lock(g) => g.release().await,
            Grant::Leader(l) => l.resign().await,
        };
        if let Err(e) = res {
            eprintln!("fencelock: releasing the {}: {e}", self.what());
        }
    }
}

/// Sends `sig` to the command (best effort: it may have exited already).
fn pass_on(child: &Child, sig: Signal) {
    if let Some(pid) = child.id().and_then(|p| Pid::from_raw(p as i32)) {
        let _ = kill_process(pid, sig);
    }
}

/// Runs `run.command` holding `grant` (named `name`) and returns the exit status: the
/// command's, or [`exit::LOST`] if the grant was lost while it ran (the command then gets
/// SIGTERM, and SIGKILL after `run.grace`). SIGINT, SIGTERM and SIGHUP are passed on to the
/// command. The grant is released (confirmed) before this returns.
pub(crate) async fn run_under(grant: Grant, name: &str, run: &RunArgs) -> u8 {
    let (program, args) = run.command.split_first().expect("clap requires a command");
    let spawned = Command::new(program)
        .args(args)
        .env("FENCELOCK_TOKEN", grant.token().to_string())
        .env("FENCELOCK_KEY", grant.key())
        .env("FENCELOCK_NAME", name)
        // The command needs the token, not our credentials.
        .env_remove("FENCELOCK_PASSWORD")
        .kill_on_drop(true)
        .spawn();
    let mut child = match spawned {
        Ok(c) => c,
        Err(e) => {
            eprintln!("fencelock: cannot run {program:?}: {e}");
            grant.release().await;
            return match e.kind() {
                std::io::ErrorKind::NotFound => exit::NOT_FOUND,
                _ => exit::CANNOT_RUN,
            };
        }
    };
    let (Ok(mut int), Ok(mut term), Ok(mut hup)) = (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
        signal(SignalKind::hangup()),
    ) else {
        eprintln!("fencelock: cannot install signal handlers");
        let _ = child.start_kill();
        let _ = child.wait().await;
        grant.release().await;
        return exit::SOFTWARE;
    };
    let mut lost = grant.lost();
    loop {
        tokio::select! {
            status = child.wait() => {
                let code = match status {
                    Ok(s) => exit::of_command(s),
                    Err(e) => {
                        eprintln!("fencelock: waiting for the command: {e}");
                        exit::SOFTWARE
                    }
                };
                grant.release().await;
                return code;
            }
            _ = int.recv() => pass_on(&child, Signal::INT),
            _ = term.recv() => pass_on(&child, Signal::TERM),
            _ = hup.recv() => pass_on(&child, Signal::HUP),
            reason = &mut lost => {
                eprintln!(
                    "fencelock: the {} {name:?} was lost ({reason}): stopping the command",
                    grant.what()
                );
                stop(&mut child, run.grace).await;
                return exit::LOST;
            }
        }
    }
}

/// SIGTERM, then SIGKILL after `grace` if it has not exited.
async fn stop(child: &mut Child, grace: Duration) {
    pass_on(child, Signal::TERM);
    if tokio::time::timeout(grace, child.wait()).await.is_err() {
        eprintln!("fencelock: the command did not exit within {grace:?} of SIGTERM: SIGKILL");
        let _ = child.start_kill();
        let _ = child.wait().await;
    }
}
