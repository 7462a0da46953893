//! How fencelock's scripts run: as the functions of one library where the server has them
//! (Redis 7), else each by `EVALSHA` (see the module's docs in `scripts.rs`).

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::OnceLock;

use redis::aio::ConnectionLike;
use redis::{Cmd, RedisError, RedisResult, Script, ServerErrorKind, Value};

use super::LIBRARY;
use crate::reply::Args;

/// Helpers every script starts with (a Lua file of its own: the key helpers, the guard of a
/// migrating slot, `drop`, `ahead`, `create` and the session's version).
pub(super) const PRELUDE: &str = include_str!("prelude.lua");

/// One of fencelock's scripts: a function of the library, or a script of its own.
pub(crate) struct Op {
    /// Its name in the library (after the library's).
    name: &'static str,
    body: &'static str,
    /// Prelude, `begin(KEYS)` and body, for `EVALSHA`.
    script: Script,
    /// `{library}_{name}`, made at first use.
    function: OnceLock<String>,
}

impl Op {
    pub(super) fn new(name: &'static str, body: &'static str) -> Op {
        Op {
            name,
            body,
            script: Script::new(&format!("{PRELUDE}begin(KEYS)\n{body}")),
            function: OnceLock::new(),
        }
    }

    fn function(&self) -> &str {
        self.function
            .get_or_init(|| format!("{}_{}", LIBRARY.name, self.name))
    }
}

/// The scripts that add data (see the library's flags).
const ADDING: [&str; 4] = ["open", "enqueue", "enqueue_all", "set_value"];

const FUNCTIONS: u8 = 1;
const SCRIPTS: u8 = 2;

/// How a backend's server runs the scripts: as functions, or (a server without them, a user
/// who may not load them) by `EVALSHA`; found out at the first call (0 until then).
#[derive(Debug, Default)]
pub(crate) struct Runner(AtomicU8);

impl Runner {
    /// Runs `op` with key `key` and `args` on `con`: by `FCALL`, loading the library first if
    /// the server does not have it (it started afresh, an operator flushed it, a failover
    /// promoted a replica that never had it), or by `EVALSHA`.
    pub(crate) async fn run<C: ConnectionLike>(
        &self,
        con: &mut C,
        op: &Op,
        key: &str,
        args: &Args,
    ) -> RedisResult<Value> {
        if self.0.load(Ordering::Relaxed) != SCRIPTS {
            let function = op.function();
            // Sized at once: grown argument by argument, it would be copied again and again.
            let mut fcall = Cmd::with_capacity(
                args.len() + 4,
                args.bytes() + function.len() + key.len() + 6,
            );
            fcall.arg("FCALL").arg(function).arg(1).arg(key);
            for a in args.iter() {
                fcall.arg(a);
            }
            match self.fcall(con, &fcall).await? {
                Fcall::Done(v) => return Ok(v),
                Fcall::Unsupported => self.0.store(SCRIPTS, Ordering::Relaxed),
                // Loaded, and missing again (on a cluster, the call went to a node the load
                // did not reach yet): this call runs as a script, the next tries again.
                Fcall::Missing => {}
            }
        }
        let mut inv = op.script.key(key);
        for a in args.iter() {
            inv.arg(a);
        }
        inv.invoke_async(con).await
    }

    async fn fcall<C: ConnectionLike>(&self, con: &mut C, fcall: &Cmd) -> RedisResult<Fcall> {
        match fcall.query_async::<Value>(con).await {
            Ok(v) => {
                self.0.store(FUNCTIONS, Ordering::Relaxed);
                return Ok(Fcall::Done(v));
            }
            Err(e) if unsupported(&e) => return Ok(Fcall::Unsupported),
            Err(e) if !missing(&e) => return Err(e),
            Err(_) => {}
        }
        let load = redis::cmd("FUNCTION")
            .arg("LOAD")
            .arg("REPLACE")
            .arg(&LIBRARY.code)
            .query_async::<Value>(con)
            .await;
        match load {
            Ok(_) => {}
            Err(e) if unsupported(&e) => return Ok(Fcall::Unsupported),
            // On a cluster the load goes to every primary, and fails while one is down or hung:
            // this call runs as a script (sent to its key's node alone), the next tries again.
            Err(_) => return Ok(Fcall::Missing),
        }
        match fcall.query_async::<Value>(con).await {
            Ok(v) => {
                self.0.store(FUNCTIONS, Ordering::Relaxed);
                Ok(Fcall::Done(v))
            }
            Err(e) if missing(&e) => Ok(Fcall::Missing),
            Err(e) => Err(e),
        }
    }
}

/// What an `FCALL` came to.
enum Fcall {
    Done(Value),
    /// The server cannot run the library: no functions, or not for this user.
    Unsupported,
    /// Still missing after a load.
    Missing,
}

/// `FCALL` of a function the server does not have.
fn missing(e: &RedisError) -> bool {
    e.detail().is_some_and(|d| d.contains("Function not found"))
}

/// A server without functions (before Redis 7: `FCALL` and `FUNCTION` unknown), or a user
/// whose ACL refuses the command (not the keys: that is the call's own error, as by
/// `EVALSHA`). Neither has a code of its own: told by the message.
fn unsupported(e: &RedisError) -> bool {
    let detail = e.detail().unwrap_or_default();
    detail.starts_with("unknown command")
        || (matches!(e.kind(), redis::ErrorKind::Server(ServerErrorKind::NoPerm))
            && detail.contains("to run the"))
}

/// fencelock's function library: its name and its text.
pub(super) struct Library {
    name: String,
    code: String,
}

impl Library {
    /// The library of `all`, named by the hash of its text.
    pub(super) fn new(all: &[&Op]) -> Library {
        let mut functions = String::new();
        for op in all {
            // A function without flags is refused as a whole when the server is at `maxmemory`; a
            // script ran until its first command that adds data. The scripts that add data keep
            // that (refused, nothing written: their first such command preceded every write);
            // every other one (heartbeats, releases, reads that drop dead entries) may run, as a
            // script could, so that a server at its memory limit keeps its sessions.
            let flags = if ADDING.contains(&op.name) {
                ""
            } else {
                "'allow-oom'"
            };
            functions.push_str(&format!(
                "redis.register_function{{function_name = '@_{}', flags = {{{flags}}}, \
                 callback = function(KEYS, ARGV)\nbegin(KEYS)\n{}\nend}}\n",
                op.name, op.body
            ));
        }
        // Named by the hash of what it runs (12 hex digits of its SHA-1).
        let text = format!("{PRELUDE}{functions}");
        let name = format!("fencelock_{}", &Script::new(&text).get_hash()[..12]);
        Library {
            code: format!(
                "#!lua name={name}\n{PRELUDE}{}",
                functions.replace("'@_", &format!("'{name}_"))
            ),
            name,
        }
    }
}
