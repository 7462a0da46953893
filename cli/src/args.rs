//! The command line.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::duration::{connect_timeout, duration, positive_duration};

/// Run a command under a distributed lock, or while leader, on etcd, ZooKeeper or Redis, with
/// the fencing token in its environment.
///
/// The command gets FENCELOCK_TOKEN (the grant's fencing token: pass it with every write to the
/// protected resource, which refuses tokens lower than one it has seen), FENCELOCK_KEY (the
/// lock's etcd key or ZooKeeper node; on Redis its entry's name, whose hash is the key
/// fencelock:e:NAME, on a Redis Cluster fencelock{G}:e:NAME with the queue's group G),
/// FENCELOCK_NAME and FENCELOCK_ENDPOINTS (the cluster the lock is on, --endpoints or the
/// variable); never the credentials (FENCELOCK_PASSWORD and FENCELOCK_SENTINEL_PASSWORD are
/// removed, FENCELOCK_ENDPOINTS loses its user info).
///
/// The command's whole process tree goes with the grant: fencelock adopts its orphans (even a
/// daemon that called setsid). If the grant is lost, the tree is SIGKILLed at once, without
/// SIGTERM (the lock may be another's already; lost by the local deadline, it is freed only
/// once the tree is dead), and fencelock exits 76. When the
/// command exits, whatever it left running gets SIGTERM, then SIGKILL after --grace (at once
/// if the grant is lost meanwhile), before the lock is released. If fencelock itself is
/// killed outright (SIGKILL, the OOM killer), its keeper (the command's parent, $PPID) SIGKILLs
/// the whole tree; so it does soon after the session's local deadline (see --ttl) if fencelock is
/// stopped (SIGSTOP) or stuck meanwhile.
///
/// Signals (SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGALRM, SIGVTALRM, SIGPROF,
/// SIGIO, SIGPWR, SIGSTKFLT, SIGXCPU, SIGXFSZ, the real-time signals): while connecting or
/// waiting, fencelock removes its entry and ends by the same signal (SIGQUIT: exits 131, no
/// core). While the command runs, each is passed on to the command's tree, and fencelock waits
/// for the command; but in a terminal's foreground the command shares fencelock's process
/// group, and what the terminal sends that group (Ctrl-C, Ctrl-\, Ctrl-Z, a hangup) reaches
/// it directly and is not passed on again (what a process sends fencelock alone, kill -INT,
/// is). SIGTSTP or SIGTTIN sent to fencelock stops the command too; stopped past the
/// session's local deadline (see --ttl), the command is killed before it runs again. On a
/// terminal, in an orphaned process group (as under
/// ssh -t), they are ignored: nothing could continue it. A shell's background job (fencelock
/// … &): fg hands the terminal to the command, and a Ctrl-Z there stops the job. While
/// releasing, signals are held back. A signal fencelock was started with ignored (SIGHUP
/// under nohup) stays ignored, by the command too; one it was started with blocked is
/// unblocked, for both.
///
/// Exit status: the command's own (if a signal N ended it, fencelock ends by N too: 128 + N in
/// a shell; a signal that dumps a core, such as SIGQUIT or SIGSEGV, gives 128 + N without
/// ending fencelock by it); 75 the lock or leadership
/// was not acquired (--try, --timeout); 76 it was lost while the command ran (also when found
/// lost as the command exited); 69 the cluster could not be reached or is out of space, or the session (or the waiting entry) was lost
/// before the command started; 78 bad configuration or input (names, TLS files, a server certificate not trusted, a host
/// that does not resolve, credentials,
/// permissions); 70 an internal failure (or output that cannot be written); 126 / 127 the command could not be run / was not found;
/// 2 a usage error. Stopped
/// by signal N before the command ran, fencelock ends by N (128 + N in a shell).
#[derive(Parser, Debug)]
#[command(
    name = "fencelock",
    version,
    propagate_version = true,
    max_term_width = 100
)]
pub(crate) struct Cli {
    #[command(flatten)]
    pub(crate) cluster: ClusterArgs,

    #[command(subcommand)]
    pub(crate) command: Command,
}

/// Where the cluster is and how to reach it.
#[derive(Args, Clone)]
pub(crate) struct ClusterArgs {
    /// The cluster's URL (its syntax is in the help text).
    #[arg(
        short,
        long,
        env = "FENCELOCK_ENDPOINTS",
        // A value starting with `-` is the value, never an option echoed in a usage error.
        allow_hyphen_values = true,
        // The URL may carry a password: `--help` must not print it.
        hide_env_values = true,
        global = true,
        help = "The cluster: etcd://[USER:PASSWORD@]HOST:PORT[,HOST:PORT...][/NAMESPACE], zk://[USER:PASSWORD@]HOST:PORT[,HOST:PORT...][/CHROOT], redis[s]://[[USER]:PASSWORD@]HOST:PORT[/DB], redis[s]+sentinel://[[USER]:PASSWORD@]HOST:PORT[,HOST:PORT...]/MASTER[/DB] or redis[s]+cluster://[[USER]:PASSWORD@]HOST:PORT[,HOST:PORT...] (rediss: TLS; user info, NAMESPACE and CHROOT percent-encoded; prefer FENCELOCK_PASSWORD)"
    )]
    pub(crate) endpoints: Option<String>,

    /// The namespace the locks live in (etcd: a key prefix, also given as the URL's path;
    /// ZooKeeper: a node under the chroot).
    #[arg(short, long, env = "FENCELOCK_NAMESPACE", global = true)]
    pub(crate) namespace: Option<String>,

    /// The session's TTL: a holder that stops heartbeating (killed, paused, cut off) loses its
    /// locks after it. fencelock gives them up sooner, at its session's local deadline: the TTL
    /// less a safety margin of max(TTL/5, 1s) (at most half the TTL) after the last heartbeat,
    /// which goes every TTL/3 or sooner. A stop (Ctrl-Z, SIGSTOP) well short of the TTL can
    /// lose the lock (from about 5s at 10s).
    // Hyphen values allowed: `--ttl -1s` is a negative duration, refused by the parser as one
    // (clap said "unexpected argument '-1'": black-box round 14).
    #[arg(long, env = "FENCELOCK_TTL", default_value = "10s", value_parser = positive_duration, allow_hyphen_values = true, global = true)]
    pub(crate) ttl: Duration,

    /// How long connecting may take (10ms to 1h).
    #[arg(long, env = "FENCELOCK_CONNECT_TIMEOUT", default_value = "5s", value_parser = connect_timeout, allow_hyphen_values = true, global = true)]
    pub(crate) connect_timeout: Duration,

    /// Output format of leader, observe and list.
    #[arg(short, long, env = "FENCELOCK_OUTPUT", value_enum, default_value_t = Output::Text, global = true)]
    pub(crate) output: Output,

    /// CA certificate (PEM) to verify the servers with; enables TLS.
    #[arg(long, env = "FENCELOCK_TLS_CA", global = true)]
    pub(crate) cacert: Option<PathBuf>,

    /// Client certificate (PEM), for servers that require one (with --key).
    #[arg(long, env = "FENCELOCK_TLS_CERT", global = true)]
    pub(crate) cert: Option<PathBuf>,

    /// Client private key (PEM), with --cert.
    #[arg(long, env = "FENCELOCK_TLS_KEY", global = true)]
    pub(crate) key: Option<PathBuf>,

    /// The name to verify in the servers' certificates, if not the host name of the endpoints
    /// (etcd, with --cacert; ZooKeeper and Redis check the host they connect to).
    #[arg(long, env = "FENCELOCK_TLS_SERVER_NAME", global = true)]
    pub(crate) server_name: Option<String>,

    /// User: etcd authentication, ZooKeeper SASL (DIGEST-MD5), or a Redis ACL user.
    #[arg(long, env = "FENCELOCK_USER", global = true)]
    pub(crate) user: Option<String>,

    /// Password of --user (prefer the environment variable: command lines are visible to other
    /// users of the machine).
    #[arg(
        long,
        env = "FENCELOCK_PASSWORD",
        // A value starting with `-` is the value, never an option echoed in a usage error.
        allow_hyphen_values = true,
        hide_env_values = true,
        global = true
    )]
    pub(crate) password: Option<String>,

    /// Password of the sentinels (a `redis+sentinel://` URL whose sentinels ask for one of
    /// their own, `requirepass`; the URL's credentials are the servers'). Prefer the
    /// environment variable.
    #[arg(
        long,
        env = "FENCELOCK_SENTINEL_PASSWORD",
        // A value starting with `-` is the value, never an option echoed in a usage error.
        allow_hyphen_values = true,
        hide_env_values = true,
        global = true
    )]
    pub(crate) sentinel_password: Option<String>,

    /// Redis: every grant and heartbeat waits until this many replicas acknowledged it
    /// (`WAIT`), so that a failover to one of them keeps every grant and fencing token (no lock
    /// is granted while fewer answer). Give the number of replicas Sentinel may promote: with
    /// fewer, a `SENTINEL FAILOVER` can promote one that did not acknowledge, while the old
    /// primary goes on granting with the others' acknowledgement. Without it, a failover, or a
    /// restart without persistence, can grant a lock twice and hand out a token again, or a
    /// lower one. (For lock and elect: list, leader and observe take no lock and do not wait
    /// for replicas, though on Redis they open a session too, and need the same ACL rights.)
    #[arg(
        long,
        env = "FENCELOCK_WAIT_FOR_REPLICAS",
        value_parser = clap::value_parser!(u16).range(1..=1000),
        global = true
    )]
    pub(crate) wait_for_replicas: Option<u16>,

    /// Whether the subcommand only reads (`list`, `leader`, `observe`): it creates nothing, so
    /// `--wait-for-replicas` does not apply, and it must work while replicas are short, when
    /// someone wants to look. (Set from the subcommand, not an option.)
    #[arg(skip)]
    pub(crate) reads_only: bool,

    /// The lock or election name the subcommand asks for, and the value it campaigns with:
    /// checked with the namespace before anything connects. (Set from the subcommand.)
    #[arg(skip)]
    pub(crate) asked: Asked,
}

/// What a subcommand asks for, checked before connecting (a refused name exits 78 at once,
/// not after a connect timeout against a cluster away).
#[derive(Debug, Clone, Default)]
pub(crate) struct Asked {
    pub(crate) name: Option<String>,
    pub(crate) value: Option<String>,
}

/// Without the secrets: the URL's user info and the passwords (a failed assertion or a
/// debug print must not show them).
impl std::fmt::Debug for ClusterArgs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let hidden = |p: &Option<String>| p.as_ref().map(|_| "***");
        f.debug_struct("ClusterArgs")
            .field(
                "endpoints",
                &self.endpoints.as_deref().map(fencelock_net::redact),
            )
            .field("namespace", &self.namespace)
            .field("ttl", &self.ttl)
            .field("connect_timeout", &self.connect_timeout)
            .field("output", &self.output)
            .field("cacert", &self.cacert)
            .field("cert", &self.cert)
            .field("key", &self.key)
            .field("server_name", &self.server_name)
            .field("user", &self.user)
            .field("password", &hidden(&self.password))
            .field("sentinel_password", &hidden(&self.sentinel_password))
            .field("wait_for_replicas", &self.wait_for_replicas)
            .finish()
    }
}

/// How leader, observe and list print.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Output {
    /// For people.
    Text,
    /// One JSON object per line.
    Json,
}

#[derive(Subcommand, Debug)]
pub(crate) enum Command {
    /// Wait for the lock NAME, run CMD holding it, release it when CMD exits.
    ///
    /// Signals sent to fencelock reach CMD's whole process tree (see `fencelock --help`); once
    /// CMD exits (and what it left running is stopped) the lock is released at once
    /// (the next holder gets it in milliseconds, not after a TTL).
    Lock {
        /// The lock's name (`/`-separated segments, as in `jobs/reindex`; at most 512 bytes; a
        /// name refused exits 78).
        name: String,
        #[command(flatten)]
        wait: WaitArgs,
        #[command(flatten)]
        run: RunArgs,
    },
    /// Campaign in the election NAME, run CMD while leader, resign when CMD exits.
    ///
    /// FENCELOCK_TOKEN is the leader's epoch.
    Elect {
        /// The election's name (as a lock's: at most 512 bytes).
        name: String,
        /// The value this candidate publishes while it leads (its address, say).
        // Any text, `-1` or `--x` too (clap took `-1s` for an option).
        #[arg(long, default_value = "", allow_hyphen_values = true)]
        value: String,
        #[command(flatten)]
        wait: WaitArgs,
        #[command(flatten)]
        run: RunArgs,
    },
    /// Print the current leader of the election NAME (exit 75 if there is none).
    Leader {
        /// The election's name.
        name: String,
    },
    /// Print the leader of the election NAME, then every change (no leader included), until
    /// interrupted. A session lost meanwhile (the cluster silent past the TTL) is replaced by a
    /// new one; only a cluster that cannot be reached again within --connect-timeout ends it
    /// (exit 69).
    Observe {
        /// The election's name.
        name: String,
    },
    /// List the locks and elections of the namespace whose names start with PREFIX: holders and
    /// waiters in queue order, with tokens, session ids and values.
    List {
        /// Only names starting with it.
        #[arg(default_value = "")]
        prefix: String,
    },
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell).
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
}

/// How long to wait for the grant.
#[derive(Args, Debug, Clone, Copy)]
pub(crate) struct WaitArgs {
    /// Do not wait: exit 75 at once if it is taken (69 if the cluster does not answer within
    /// --connect-timeout, or half the TTL (1-20 s) if less, and a second more to close the
    /// session).
    #[arg(long = "try", conflicts_with = "timeout")]
    pub(crate) try_only: bool,
    /// Wait at most this long (e.g. 30s, 5m), then exit 75 (69 if the cluster then does not
    /// answer within --connect-timeout more, or half the TTL (1-20 s) if less, and a second
    /// more to close the session).
    #[arg(long, value_parser = duration, allow_hyphen_values = true)]
    pub(crate) timeout: Option<Duration>,
}

/// The command to run under the grant.
#[derive(Args, Debug, Clone)]
pub(crate) struct RunArgs {
    /// How long what CMD left running when it exited has to exit after SIGTERM before
    /// SIGKILL (a lost grant kills the whole tree at once).
    #[arg(long, default_value = "10s", value_parser = duration, allow_hyphen_values = true)]
    pub(crate) grace: Duration,
    /// The command and its arguments (after `--`).
    // Not `String`: a file name need not be UTF-8, and the command is passed on as given.
    #[arg(
        required = true,
        trailing_var_arg = true,
        value_name = "CMD",
        value_parser = clap::value_parser!(std::ffi::OsString)
    )]
    pub(crate) command: Vec<std::ffi::OsString>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn debug_output_hides_the_secrets() {
        let cli = Cli::parse_from([
            "fencelock",
            "--endpoints",
            "redis://u:hunter2@h:1/0",
            "--password",
            "s3cret",
            "--sentinel-password",
            "t0ps3cret",
            "list",
        ]);
        let shown = format!("{cli:?}");
        for secret in ["hunter2", "s3cret", "t0ps3cret"] {
            assert!(!shown.contains(secret), "{shown}");
        }
        assert!(shown.contains("redis://***@h:1/0"), "{shown}");
    }

    #[test]
    fn the_command_follows_the_double_dash() {
        let cli = Cli::parse_from([
            "fencelock",
            "lock",
            "x",
            "--try",
            "--",
            "sh",
            "-c",
            "exit 3",
        ]);
        let Command::Lock { name, wait, run } = cli.command else {
            panic!("lock")
        };
        assert_eq!(name, "x");
        assert!(wait.try_only);
        assert_eq!(run.command, ["sh", "-c", "exit 3"]);
    }

    #[test]
    fn a_mistyped_option_is_a_usage_error_not_the_command() {
        for args in [
            &["fencelock", "lock", "job", "--tyr", "--", "true"][..],
            &[
                "fencelock",
                "lock",
                "db",
                "--timout",
                "10m",
                "--",
                "./migrate.sh",
            ],
            &["fencelock", "elect", "e", "-X", "true"],
        ] {
            let e = Cli::try_parse_from(args)
                .err()
                .unwrap_or_else(|| panic!("{args:?}"));
            assert_eq!(
                e.kind(),
                clap::error::ErrorKind::UnknownArgument,
                "{args:?}"
            );
        }
    }

    #[test]
    fn the_command_need_not_be_utf8() {
        use std::os::unix::ffi::OsStrExt;
        let name = std::ffi::OsStr::from_bytes(b"caf\xe9");
        let cli = Cli::try_parse_from([
            "fencelock".as_ref(),
            "lock".as_ref(),
            "x".as_ref(),
            "--".as_ref(),
            "cat".as_ref(),
            name,
        ])
        .unwrap();
        let Command::Lock { run, .. } = cli.command else {
            panic!("lock")
        };
        assert_eq!(run.command, ["cat".as_ref(), name]);
    }

    #[test]
    fn the_command_keeps_its_own_options_without_a_double_dash() {
        let cli = Cli::parse_from(["fencelock", "lock", "x", "ls", "-la", "--", "--x"]);
        let Command::Lock { run, .. } = cli.command else {
            panic!("lock")
        };
        assert_eq!(run.command, ["ls", "-la", "--", "--x"]);
    }
}
