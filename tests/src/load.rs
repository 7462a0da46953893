//! The lock family's contended workloads, one acquisition and release per call: shared by the
//! herd test (`tests/herd.rs`) and the benchmark's lock-family rows (`bench/`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use fencelock::Session;
use futures::future::BoxFuture;

/// One contender's turn: acquire, then release at once.
pub type Op = Box<dyn FnMut() -> BoxFuture<'static, ()> + Send>;

/// A contended workload of one primitive.
#[derive(Debug, Clone, Copy)]
pub enum Load {
    /// A mutex (the baseline: one waiter woken per release).
    Mutex,
    /// A read-write lock, nine reads for every write.
    ReadHeavy,
    /// A semaphore with this many permits.
    Semaphore(usize),
}

impl Load {
    /// Its name in the benchmark's tables.
    pub fn label(self) -> String {
        match self {
            Load::Mutex => "mutex".into(),
            Load::ReadHeavy => "read-write lock, 9 reads : 1 write".into(),
            Load::Semaphore(n) => format!("semaphore, {n} permits"),
        }
    }

    /// The recipe argument of `tests/java/CuratorBench.java` for the same workload.
    pub fn curator_recipe(self) -> String {
        match self {
            Load::Mutex => "mutex".into(),
            Load::ReadHeavy => "rw".into(),
            Load::Semaphore(n) => format!("semaphore:{n}"),
        }
    }

    /// Apache Curator's recipe for the same primitive.
    pub fn curator_name(self) -> &'static str {
        match self {
            Load::Mutex => "Curator InterProcessMutex",
            Load::ReadHeavy => "Curator InterProcessReadWriteLock",
            Load::Semaphore(_) => "Curator InterProcessSemaphoreV2",
        }
    }
}

/// One contender of `load` on `name`, in `session`: acquire + release, each turn.
pub fn our_op(session: Session, load: Load, name: &str) -> Op {
    let turn = Arc::new(AtomicU64::new(0));
    match load {
        Load::Mutex => {
            let m = Arc::new(session.mutex(name).expect("mutex"));
            Box::new(move || {
                let m = m.clone();
                Box::pin(async move {
                    m.lock()
                        .await
                        .expect("lock")
                        .release()
                        .await
                        .expect("release");
                })
            })
        }
        Load::ReadHeavy => {
            let l = Arc::new(session.rwlock(name).expect("rwlock"));
            Box::new(move || {
                let (l, turn) = (l.clone(), turn.clone());
                Box::pin(async move {
                    if turn.fetch_add(1, Ordering::Relaxed) % 10 == 0 {
                        l.write()
                            .await
                            .expect("write")
                            .release()
                            .await
                            .expect("release");
                    } else {
                        l.read()
                            .await
                            .expect("read")
                            .release()
                            .await
                            .expect("release");
                    }
                })
            })
        }
        Load::Semaphore(n) => {
            let sem = Arc::new(session.semaphore(name, n).expect("semaphore"));
            Box::new(move || {
                let sem = sem.clone();
                Box::pin(async move {
                    sem.acquire()
                        .await
                        .expect("acquire")
                        .release()
                        .await
                        .expect("release");
                })
            })
        }
    }
}
