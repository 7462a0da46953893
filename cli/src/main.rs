//! `fencelock`: run a command under a distributed lock or as a leader, on etcd or ZooKeeper,
//! with the fencing token in its environment; and look at who holds what. `fencelock --help`.

/// Writes `fencelock: …` on stderr, without waiting for it (see `stderr.rs`), ignoring a
/// closed stderr (`2>&1 | head`, a restarted journal): `eprintln!` would panic there, and a
/// panic would leave the command's tree running and the session open.
macro_rules! say {
    ($($arg:tt)*) => {{
        $crate::stderr::say(format_args!($($arg)*));
    }};
}

mod args;
mod child;
mod cluster;
mod credentials;
mod duration;
mod exit;
mod grant;
mod keeper;
mod message;
mod observe;
mod parse;
mod procfs;
mod show;
mod signals;
mod stderr;
mod stdio;
mod terminal;
mod tree;
mod url;

use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

use clap::CommandFactory;
use fencelock::{Result, Session};

use args::{Cli, Command, Output, WaitArgs};
use grant::Grant;
use signals::{status_of, Signals, Stopped};

fn main() -> ExitCode {
    signals::unblock_all();
    let mut args = std::env::args_os().skip(1);
    if args.next().is_some_and(|a| a == keeper::ARG) {
        let status = keeper::run(&args.collect::<Vec<_>>());
        stderr::drain(stderr::DRAIN);
        return ExitCode::from(status);
    }
    let status = start();
    stderr::drain(stderr::DRAIN);
    status
}

fn start() -> ExitCode {
    // Caught first: a signal that comes while the arguments are read and the runtime starts
    // is then handled as one that comes while connecting (SIGQUIT: exit 131, no core). One
    // that comes before `main` (the process still loading) finds the default action, as for
    // any program.
    let signals = match Signals::catch() {
        Ok(s) => s,
        Err(e) => {
            say!("cannot catch signals: {e}");
            return ExitCode::from(exit::SOFTWARE);
        }
    };
    let cli = Cli::parsed();
    if let Command::Completions { shell } = cli.command {
        // Written here, not by clap_complete, which panics on a closed stdout.
        let mut script = Vec::new();
        clap_complete::generate(shell, &mut Cli::command(), "fencelock", &mut script);
        if stdio::stdout_closed() {
            // (Rust's runtime put /dev/null there: the write would succeed into nothing.)
            say!("cannot write the completion script: the standard output is closed");
            return ExitCode::from(exit::SOFTWARE);
        }
        return match std::io::stdout().write_all(&script) {
            // The reader took what it wanted (`| head`).
            Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
                say!("cannot write the completion script: {e}");
                ExitCode::from(exit::SOFTWARE)
            }
            _ => ExitCode::SUCCESS,
        };
    }
    // Started with SIGCHLD ignored (some daemons and supervisors leave it so), the kernel would
    // reap the command as it exits: its status lost, the wait for it failing (exit 70). Any
    // handler of ours undoes that; the command gets the default back at exec (unlike the
    // signals of `signals.rs`, an ignored SIGCHLD does not stay ignored for it).
    let _ = signal_hook::flag::register(
        signal_hook::consts::SIGCHLD,
        std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false)),
    );
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            say!("cannot start: {e}");
            return ExitCode::from(exit::SOFTWARE);
        }
    };
    let status = runtime.block_on(run(cli, signals));
    // Every task stopped (the session is closed) before ending by a signal. Bounded: a
    // blocking task of a client library still running must not hold up the exit. (A CI run
    // once saw `list` still running 10 s after SIGHUP while connecting to a silent server;
    // an unbounded runtime drop is one way that can happen, not a confirmed cause.)
    runtime.shutdown_timeout(Duration::from_secs(1));
    // Its last lines written before it may end by a signal.
    stderr::drain(stderr::DRAIN);
    ExitCode::from(exit::end(status))
}

/// Signal handling, by phase: while connecting, waiting for the grant, reading (`leader`,
/// `list`) or observing, every caught signal (see `signals.rs`; SIGTSTP and SIGTTIN stop it instead)
/// ends fencelock: whatever it queued is removed and it exits 128 + N (`observe`: 0). While the command runs they are passed on to
/// it (see `child::run_under`). While releasing and closing they are held back: both are
/// bounded, and they are what hands the lock to the next holder at once.
async fn run(mut cli: Cli, mut signals: Signals) -> u8 {
    message::remember_secrets(&cli.cluster);
    // Releasing and closing wait at most this long for the cluster (past it, the TTL removes
    // what is left).
    let bound = cli.cluster.connect_timeout.max(Duration::from_secs(1));
    cli.cluster.reads_only = !matches!(cli.command, Command::Lock { .. } | Command::Elect { .. });
    cli.cluster.asked = match &cli.command {
        Command::Lock { name, .. } | Command::Leader { name } | Command::Observe { name } => {
            args::Asked {
                name: Some(name.clone()),
                value: None,
            }
        }
        Command::Elect { name, value, .. } => args::Asked {
            name: Some(name.clone()),
            value: Some(value.clone()),
        },
        Command::List { .. } | Command::Completions { .. } => args::Asked::default(),
    };
    let session = match signals.until(cluster::session(&cli.cluster)).await {
        Stopped::Signal(sig) => return status_of(sig),
        Stopped::Done(Ok(s)) => s,
        Stopped::Done(Err(e)) => {
            say!("{}", message::describe(&e));
            return exit::of_session_start(&e);
        }
    };
    let env = credentials::command_env(cli.cluster.endpoints.as_deref());
    let ctx = Ctx {
        session: &session,
        cluster: &cli.cluster,
        output: cli.cluster.output,
        env: &env,
        bound,
    };
    let code = match command(ctx, cli.command, &mut signals).await {
        Ok(code) => code,
        Err(e) => {
            say!("{}", message::describe(&e));
            exit::of_error(&e)
        }
    };
    // Ends the session on the cluster: whatever it still holds goes at once (a session lost
    // by its local deadline included: it was left for this close, after the command's tree).
    // A cluster just found silent (or a session lost) gets a second, not another connect
    // timeout: the bounds of --try and --timeout count it.
    let bound = match code {
        exit::UNAVAILABLE | exit::LOST => bound.min(Duration::from_secs(1)),
        _ => bound,
    };
    match tokio::time::timeout(bound, session.close()).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => say!("closing the session: {}", message::describe(&e)),
        Err(_) => say!("closing the session: no answer within {bound:?}"),
    }
    code
}

/// What every command needs.
#[derive(Clone, Copy)]
struct Ctx<'a> {
    session: &'a Session,
    /// The cluster's options (a new session for `observe`).
    cluster: &'a args::ClusterArgs,
    output: Output,
    /// Changes to the command's environment (`None`: removed).
    env: &'a [(String, Option<String>)],
    /// How long a release or a close may wait for the cluster.
    bound: Duration,
}

/// Prints a line on stdout. Breaks with the exit status once nothing more can be printed: 0
/// when nobody reads any more (`fencelock list | head -1`), 70 when the write failed (a full
/// disk: said, where it went unnoticed and a script found an empty file and status 0).
fn print(line: &str) -> std::ops::ControlFlow<u8> {
    if stdio::stdout_closed() {
        say!("cannot write the output: the standard output is closed");
        return std::ops::ControlFlow::Break(exit::SOFTWARE);
    }
    let mut out = std::io::stdout().lock();
    match writeln!(out, "{line}").and_then(|()| out.flush()) {
        Ok(()) => std::ops::ControlFlow::Continue(()),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => std::ops::ControlFlow::Break(0),
        Err(e) => {
            say!("cannot write the output: {e}");
            std::ops::ControlFlow::Break(exit::SOFTWARE)
        }
    }
}

async fn command(ctx: Ctx<'_>, command: Command, signals: &mut Signals) -> Result<u8> {
    let Ctx {
        session, output, ..
    } = ctx;
    match command {
        Command::Lock { name, wait, run } => {
            let m = session.mutex(&name)?;
            let wait = wait_args(wait);
            let acquired = signals
                .until(answered(ctx, wait.patience(), "lock", async {
                    match wait {
                        Wait::No => m.try_lock().await,
                        Wait::At(t) => m.lock_timeout(t).await.map(Some),
                        Wait::Forever => m.lock().await.map(Some),
                    }
                }))
                .await;
            Ok(match acquired {
                Stopped::Signal(sig) => status_of(sig),
                Stopped::Done(Ok(Some(g))) => {
                    child::run_under(Grant::Lock(g), &name, &run, ctx.env, signals, ctx.bound).await
                }
                Stopped::Done(Ok(None)) => {
                    say!("{name:?} is held: not acquired");
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
            let wait = wait_args(wait);
            let acquired = signals
                .until(answered(ctx, wait.patience(), "campaign", async {
                    match wait {
                        Wait::No => e.try_campaign(&value).await,
                        Wait::At(t) => e.campaign_timeout(&value, t).await.map(Some),
                        Wait::Forever => e.campaign(&value).await.map(Some),
                    }
                }))
                .await;
            Ok(match acquired {
                Stopped::Signal(sig) => status_of(sig),
                Stopped::Done(Ok(Some(l))) => {
                    child::run_under(Grant::Leader(l), &name, &run, ctx.env, signals, ctx.bound)
                        .await
                }
                Stopped::Done(Ok(None)) => {
                    say!("{name:?} has a leader: not elected");
                    exit::NOT_ACQUIRED
                }
                Stopped::Done(Err(e)) => return Err(e),
            })
        }
        Command::Leader { name } => {
            let election = session.election(&name)?;
            let read = answered(ctx, Some(read_patience(ctx)), "leader", election.leader());
            let leader = match signals.until(read).await {
                Stopped::Signal(sig) => return Ok(status_of(sig)),
                Stopped::Done(leader) => leader?,
            };
            if let std::ops::ControlFlow::Break(failed @ 1..) =
                print(&show::leader(&name, leader.as_ref(), output))
            {
                return Ok(failed);
            }
            Ok(if leader.is_some() {
                0
            } else {
                exit::NOT_ACQUIRED
            })
        }
        Command::Observe { name } => {
            observe::observe(session, ctx.cluster, &name, output, signals).await
        }
        Command::List { prefix } => {
            let read = answered(
                ctx,
                Some(read_patience(ctx)),
                "list",
                session.queue_listing(&prefix),
            );
            let listing = match signals.until(read).await {
                Stopped::Signal(sig) => return Ok(status_of(sig)),
                Stopped::Done(q) => q?,
            };
            if listing.skipped > 0 {
                say!(
                    "skipped {} key(s) that no fencelock name maps to (another tool's)",
                    listing.skipped
                );
            }
            // ZooKeeper alone keeps an election apart from a lock (its own node names).
            let one_kind = session.backend_name() != "zookeeper";
            for q in listing.queues {
                for line in show::queue(&q, output, one_kind) {
                    if let std::ops::ControlFlow::Break(code) = print(&line) {
                        return Ok(code);
                    }
                }
            }
            Ok(0)
        }
        Command::Completions { .. } => unreachable!("handled before connecting"),
    }
}

#[derive(Clone, Copy)]
enum Wait {
    No,
    At(std::time::Duration),
    Forever,
}

impl Wait {
    /// How long the acquisition may wait for others (`None`: for ever).
    fn patience(self) -> Option<Duration> {
        match self {
            Wait::No => Some(Duration::ZERO),
            Wait::At(t) => Some(t),
            Wait::Forever => None,
        }
    }
}

/// How long a `list` or `leader` read may take besides the connect timeout: a third of the TTL
/// (a request of the session's may take that long), at most the connect timeout itself (a
/// hung cluster held a read for a third of a long TTL: 22 s with `--connect-timeout 2s` and
/// `--ttl 60s`, black-box round 25; for hours at a TTL of hours before that).
fn read_patience(ctx: Ctx<'_>) -> Duration {
    (ctx.cluster.ttl / 3).min(ctx.cluster.connect_timeout)
}

/// `request`, given up once it has run `patience` and the cluster still has not answered for
/// the connect timeout (`ctx.bound`): a server that hangs after the session began held a
/// `--try`, a `--timeout` or a read until the session's local deadline (0.8 × the TTL, hours
/// with a long one). Given up, it is a cluster out of reach (exit 69); dropped, the request
/// leaves nothing behind (the session's close takes what it may have created).
async fn answered<T>(
    ctx: Ctx<'_>,
    patience: Option<Duration>,
    op: &'static str,
    request: impl std::future::Future<Output = Result<T>>,
) -> Result<T> {
    let Some(within) = patience.and_then(|p| p.checked_add(ctx.bound)) else {
        return request.await;
    };
    match tokio::time::timeout(within, request).await {
        Ok(r) => r,
        Err(_) => Err(fencelock::Error::backend(
            ctx.session.backend_name(),
            op,
            true,
            format!("the cluster did not answer within {:?}", whole_ms(within)),
        )),
    }
}

/// `d` in whole milliseconds, for a message ("8.333s", not "8.333333333s": black-box round 25).
fn whole_ms(d: Duration) -> Duration {
    Duration::from_millis(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

fn wait_args(w: WaitArgs) -> Wait {
    match (w.try_only, w.timeout) {
        // `--timeout 0s` is a try, and said as one: "timed out after 0ns" puzzled (black-box
        // round 16).
        (true, _) => Wait::No,
        (false, Some(t)) if t.is_zero() => Wait::No,
        (false, Some(t)) => Wait::At(t),
        (false, None) => Wait::Forever,
    }
}
