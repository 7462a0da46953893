//! A PostgreSQL server for the worked examples' tests: Debian's `postgresql` binaries, a
//! temporary data dir, a free loopback port, `trust` authentication for the `postgres` user.
//! PostgreSQL refuses to run as root: when the tests run as root, the server runs as the
//! `postgres` system user the package creates (its uid and gid set on the process itself, so the
//! PID the harness kills is the server's).

use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::process::ManagedChild;

/// The directory of Debian's PostgreSQL binaries (`/usr/lib/postgresql/{version}/bin`), the
/// newest installed.
fn bin_dir() -> Option<PathBuf> {
    let mut versions: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path().join("bin")))
        .filter(|p| p.join("initdb").is_file() && p.join("postgres").is_file())
        .collect();
    versions.sort();
    versions.pop()
}

/// The uid and gid of the `postgres` system user, from `/etc/passwd`.
fn postgres_user() -> Option<(u32, u32)> {
    let passwd = std::fs::read_to_string("/etc/passwd").ok()?;
    passwd.lines().find_map(|l| {
        let f: Vec<&str> = l.split(':').collect();
        (f.first() == Some(&"postgres"))
            .then(|| Some((f.get(2)?.parse().ok()?, f.get(3)?.parse().ok()?)))?
    })
}

fn running_as_root() -> bool {
    rustix::process::geteuid().is_root()
}

/// What is missing to run PostgreSQL, if anything.
pub fn missing() -> Option<String> {
    if bin_dir().is_none() {
        return Some("PostgreSQL is not installed (Debian package `postgresql`)".into());
    }
    if running_as_root() && postgres_user().is_none() {
        return Some(
            "running as root, and there is no `postgres` user to run PostgreSQL as".into(),
        );
    }
    None
}

/// Whether PostgreSQL can run: panics in CI if not, else prints a skip message.
pub fn available() -> bool {
    super::present(missing())
}

/// A running PostgreSQL server; stopped (by PID) when dropped.
#[derive(Debug)]
pub struct PgServer {
    _child: ManagedChild,
    port: u16,
    _dir: tempfile::TempDir,
}

impl PgServer {
    /// Initializes a data dir and starts the server; waits (bounded) until it accepts
    /// connections. Blocking. Panics if it cannot (call [`available`] first).
    pub fn start() -> PgServer {
        let bin = bin_dir().expect("PostgreSQL binaries");
        let dir = tempfile::Builder::new()
            .prefix("fencelock-pg-")
            .tempdir()
            .expect("temp dir");
        let data = dir.path().join("data");
        let sockets = dir.path().join("sockets");
        std::fs::create_dir_all(&sockets).expect("socket dir");
        let user = running_as_root().then(|| postgres_user().expect("postgres user"));
        if let Some((uid, gid)) = user {
            for p in [dir.path(), sockets.as_path()] {
                rustix::fs::chown(
                    p,
                    Some(rustix::fs::Uid::from_raw(uid)),
                    Some(rustix::fs::Gid::from_raw(gid)),
                )
                .expect("chown the data dir to postgres");
            }
        }
        let as_user = |cmd: &mut Command| {
            if let Some((uid, gid)) = user {
                cmd.uid(uid).gid(gid).env("HOME", "/tmp");
            }
        };
        let mut initdb = Command::new(bin.join("initdb"));
        initdb
            .args(["-D"])
            .arg(&data)
            .args(["-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync"])
            .current_dir(dir.path());
        as_user(&mut initdb);
        let out = initdb.output().expect("run initdb");
        assert!(
            out.status.success(),
            "initdb failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let port = crate::free_port();
        let mut server = Command::new(bin.join("postgres"));
        server
            .arg("-D")
            .arg(&data)
            .args([
                "-p",
                &port.to_string(),
                "-c",
                "listen_addresses=127.0.0.1",
                "-c",
                "fsync=off",
                // Shared memory segments in the data dir, removed with it: POSIX ones
                // (/dev/shm/PostgreSQL.*) outlive a server stopped by a signal.
                "-c",
                "dynamic_shared_memory_type=mmap",
            ])
            .arg("-k")
            .arg(&sockets)
            .current_dir(dir.path());
        as_user(&mut server);
        let child = ManagedChild::spawn("postgres", server, &dir.path().join("postgres.log"))
            .expect("start postgres");
        // Listening is not ready: while it starts up, the server refuses connections ("the
        // database system is starting up"). `pg_isready` succeeds once it accepts them.
        let start = Instant::now();
        let ready = || {
            Command::new(bin.join("pg_isready"))
                .args([
                    "-q",
                    "-h",
                    "127.0.0.1",
                    "-p",
                    &port.to_string(),
                    "-U",
                    "postgres",
                ])
                .status()
                .is_ok_and(|s| s.success())
        };
        while !ready() {
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "postgres did not accept connections within 60 s: {}",
                std::fs::read_to_string(dir.path().join("postgres.log")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        PgServer {
            _child: child,
            port,
            _dir: dir,
        }
    }

    /// The connection string (`tokio-postgres` / libpq key-value form).
    pub fn connection_string(&self) -> String {
        format!(
            "host=127.0.0.1 port={} user=postgres dbname=postgres",
            self.port
        )
    }
}
