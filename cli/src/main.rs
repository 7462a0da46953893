//! `fencelock`: run a command under a distributed lock or as a leader, on etcd or ZooKeeper,
//! with the fencing token in its environment; and look at who holds what. `fencelock --help`.

mod args;
mod child;
mod cluster;
mod exit;
mod show;

use std::future::Future;
use std::process::ExitCode;

use clap::{CommandFactory, Parser};
use fencelock::{Result, Session};
use futures_util::StreamExt;
use tokio::signal::unix::{signal, SignalKind};

use args::{Cli, Command, Output, WaitArgs};
use child::Grant;

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Command::Completions { shell } = cli.command {
        clap_complete::generate(
            shell,
            &mut Cli::command(),
            "fencelock",
            &mut std::io::stdout(),
        );
        return ExitCode::SUCCESS;
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("fencelock: cannot start: {e}");
            return ExitCode::from(exit::SOFTWARE);
        }
    };
    ExitCode::from(runtime.block_on(run(cli)))
}

async fn run(cli: Cli) -> u8 {
    let session = match until_signal(cluster::session(&cli.cluster)).await {
        Stopped::Signal(code) => return code,
        Stopped::Done(Ok(s)) => s,
        Stopped::Done(Err(e)) => {
            eprintln!("fencelock: {e}");
            return exit::of_error(&e);
        }
    };
    let code = match command(&session, cli.command, cli.cluster.output).await {
        Ok(code) => code,
        Err(e) => {
            eprintln!("fencelock: {e}");
            exit::of_error(&e)
        }
    };
    // Ends the session on the cluster: whatever it still holds goes at once.
    if let Err(e) = session.close().await {
        eprintln!("fencelock: closing the session: {e}");
    }
    code
}

async fn command(session: &Session, command: Command, output: Output) -> Result<u8> {
    match command {
        Command::Lock { name, wait, run } => {
            let m = session.mutex(&name)?;
            let acquired = until_signal(async {
                match wait_args(wait) {
                    Wait::No => m.try_lock().await,
                    Wait::At(t) => m.lock_timeout(t).await.map(Some),
                    Wait::Forever => m.lock().await.map(Some),
                }
            })
            .await;
            Ok(match acquired {
                Stopped::Signal(code) => code,
                Stopped::Done(Ok(Some(g))) => child::run_under(Grant::Lock(g), &name, &run).await,
                Stopped::Done(Ok(None)) => {
                    eprintln!("fencelock: {name:?} is held: not acquired");
                    exit::NOT_ACQUIRED
                }
                Stopped::Done(Err(e)) => return Err(e),
            })
        }
        Command::Elect {
            name,
            value,
            wait,
            run,
        } => {
            let e = session.election(&name)?;
            let acquired = until_signal(async {
                match wait_args(wait) {
                    Wait::No => e.try_campaign(&value).await,
                    Wait::At(t) => e.campaign_timeout(&value, t).await.map(Some),
                    Wait::Forever => e.campaign(&value).await.map(Some),
                }
            })
            .await;
            Ok(match acquired {
                Stopped::Signal(code) => code,
                Stopped::Done(Ok(Some(l))) => child::run_under(Grant::Leader(l), &name, &run).await,
                Stopped::Done(Ok(None)) => {
                    eprintln!("fencelock: {name:?} has a leader: not elected");
                    exit::NOT_ACQUIRED
                }
                Stopped::Done(Err(e)) => return Err(e),
            })
        }
        Command::Leader { name } => {
            let leader = session.election(&name)?.leader().await?;
            println!("{}", show::leader(&name, leader.as_ref(), output));
            Ok(if leader.is_some() {
                0
            } else {
                exit::NOT_ACQUIRED
            })
        }
        Command::Observe { name } => {
            let changes = session.election(&name)?.observe();
            let watched = until_signal(async {
                tokio::pin!(changes);
                while let Some(change) = changes.next().await {
                    match change {
                        Ok(leader) => println!("{}", show::leader(&name, leader.as_ref(), output)),
                        Err(e) if e.is_temporary() => eprintln!("fencelock: {e} (retrying)"),
                        Err(e) => return Err(e),
                    }
                }
                Ok(())
            })
            .await;
            match watched {
                Stopped::Signal(_) => Ok(0),
                Stopped::Done(r) => r.map(|()| exit::UNAVAILABLE),
            }
        }
        Command::List { prefix } => {
            for q in session.queues(&prefix).await? {
                for line in show::queue(&q, output) {
                    println!("{line}");
                }
            }
            Ok(0)
        }
        Command::Completions { .. } => unreachable!("handled before connecting"),
    }
}

enum Wait {
    No,
    At(std::time::Duration),
    Forever,
}

fn wait_args(w: WaitArgs) -> Wait {
    match (w.try_only, w.timeout) {
        (true, _) => Wait::No,
        (false, Some(t)) => Wait::At(t),
        (false, None) => Wait::Forever,
    }
}

/// A future's outcome, or the exit status of the signal that stopped it first.
enum Stopped<T> {
    Done(T),
    Signal(u8),
}

/// Runs `fut` until it completes or SIGINT / SIGTERM arrives (then drops it: every fencelock
/// future is cancel-safe, so nothing is left queued).
async fn until_signal<T>(fut: impl Future<Output = T>) -> Stopped<T> {
    let (Ok(mut int), Ok(mut term)) = (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    ) else {
        return Stopped::Done(fut.await);
    };
    tokio::select! {
        v = fut => Stopped::Done(v),
        _ = int.recv() => Stopped::Signal(128 + 2),
        _ = term.recv() => Stopped::Signal(128 + 15),
    }
}
