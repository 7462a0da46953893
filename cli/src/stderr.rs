//! fencelock's own messages on stderr, written by a thread of their own: a stderr that blocks
//! (a full pipe nobody reads) must not stop fencelock midway, as it stops what the command
//! left running or releases the lock. Written directly, a message there held the lock (and
//! the command's leftovers) until the pipe drained.

use std::io::Write as _;
use std::sync::mpsc::{sync_channel, SyncSender};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// How many lines may wait for a stderr that blocks; later ones are dropped.
const QUEUED: usize = 256;

/// How long fencelock waits, as it ends, for its last lines to be written.
pub(crate) const DRAIN: Duration = Duration::from_secs(1);

/// The writer thread's queue, and how many lines it has not written yet.
struct Writer {
    queue: SyncSender<String>,
    unwritten: Arc<(Mutex<usize>, Condvar)>,
}

static WRITER: OnceLock<Option<Writer>> = OnceLock::new();

/// The writer, started at the first message (`None` if no thread could be started).
fn writer() -> Option<&'static Writer> {
    WRITER
        .get_or_init(|| {
            let (queue, lines) = sync_channel::<String>(QUEUED);
            let unwritten = Arc::new((Mutex::new(0usize), Condvar::new()));
            let count = unwritten.clone();
            std::thread::Builder::new()
                .name("fencelock-stderr".into())
                .spawn(move || {
                    for line in lines {
                        // A closed stderr (`2>&1 | head`, a restarted journal) is ignored.
                        let _ = std::io::stderr().write_all(line.as_bytes());
                        let (n, written) = &*count;
                        *n.lock().unwrap_or_else(|e| e.into_inner()) -= 1;
                        written.notify_all();
                    }
                })
                .ok()
                .map(|_| Writer { queue, unwritten })
        })
        .as_ref()
}

/// Queues `fencelock: {text}` for stderr, never waiting for it to be written (dropped if
/// [`QUEUED`] lines already wait).
pub(crate) fn say(text: std::fmt::Arguments<'_>) {
    let line = format!("fencelock: {text}\n");
    let Some(w) = writer() else {
        let _ = std::io::stderr().write_all(line.as_bytes());
        return;
    };
    let (n, _) = &*w.unwritten;
    let mut n = n.lock().unwrap_or_else(|e| e.into_inner());
    if w.queue.try_send(line).is_ok() {
        *n += 1;
    }
}

/// Waits until every queued line is written, for `within` at most (as fencelock ends).
pub(crate) fn drain(within: Duration) {
    let Some(w) = WRITER.get().and_then(Option::as_ref) else {
        return;
    };
    let end = Instant::now() + within;
    let (n, written) = &*w.unwritten;
    let mut n = n.lock().unwrap_or_else(|e| e.into_inner());
    while *n > 0 {
        let left = end.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return;
        }
        n = written
            .wait_timeout(n, left)
            .unwrap_or_else(|e| e.into_inner())
            .0;
    }
}
