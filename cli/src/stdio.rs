//! The standard streams as fencelock was started with them. Before `main`, Rust's runtime opens
//! `/dev/null` on any of descriptors 0, 1 and 2 that it finds closed: `fencelock list >&-`
//! printed into nothing and exited 0, and the command found a stream where its caller had
//! closed it (`fencelock lock x -- echo hi >&-` exited 0, `echo hi >&-` exits 1). Which were
//! closed is read before that, by a constructor the C runtime runs.

use std::sync::atomic::{AtomicU8, Ordering};

/// Bit N: descriptor N (0, 1, 2) was closed when fencelock started.
static CLOSED_AT_START: AtomicU8 = AtomicU8::new(0);

#[used]
#[link_section = ".init_array"]
static READ_AT_START: extern "C" fn() = read_at_start;

extern "C" fn read_at_start() {
    let closed = (0..3).fold(0u8, |closed, fd| {
        // SAFETY: `F_GETFD` only reads the descriptor's flags.
        match unsafe { libc::fcntl(fd, libc::F_GETFD) } {
            -1 => closed | 1 << fd,
            _ => closed,
        }
    });
    CLOSED_AT_START.store(closed, Ordering::Relaxed);
}

/// Whether fencelock was started with its standard output closed: what it prints cannot be
/// written.
pub(crate) fn stdout_closed() -> bool {
    CLOSED_AT_START.load(Ordering::Relaxed) & 1 << 1 != 0
}

/// Starts `cmd` with the standard streams that fencelock was started with closed closed
/// again, as they would be without fencelock.
pub(crate) fn as_at_start(cmd: &mut tokio::process::Command) {
    let closed = CLOSED_AT_START.load(Ordering::Relaxed);
    if closed == 0 {
        return;
    }
    // SAFETY: `close` is async-signal-safe, and the closure touches nothing else.
    unsafe {
        cmd.pre_exec(move || {
            for fd in (0..3).filter(|fd| closed & 1 << fd != 0) {
                libc::close(fd);
            }
            Ok(())
        });
    }
}
