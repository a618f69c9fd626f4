//! kvfast's own rayon thread pool, safe across `fork()`.
//!
//! rayon's global pool cannot be re-created: a process forked after it started (Python's
//! `multiprocessing` with the fork start method, say) inherits a pool whose threads are gone, and
//! its first parallel pass waits for them forever. Every parallel pass of kvfast runs in the pool
//! [`install`] gives instead, which records the process that built it: a process of another id (a
//! forked child) builds its own on its first pass. The parent's pool is leaked in the child, never
//! dropped (dropping it would wake threads that do not exist there, through locks a thread of the
//! parent may have held at the fork). The pool's size is rayon's default (`RAYON_NUM_THREADS`,
//! else the CPUs available).

use std::cell::Cell;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, TryLockError};

use rayon::ThreadPool;

/// The pool and the id of the process that built it.
static POOL: Mutex<Option<(u32, Arc<ThreadPool>)>> = Mutex::new(None);
/// The process whose pool `POOL` holds (0: none yet), readable without the lock.
static OWNER: AtomicU32 = AtomicU32::new(0);

thread_local! {
    /// Whether this thread is one of a kvfast pool's (a pass inside a pass runs where it is,
    /// without the lock).
    static WORKER: Cell<bool> = const { Cell::new(false) };
}

fn build() -> Option<ThreadPool> {
    rayon::ThreadPoolBuilder::new()
        .thread_name(|i| format!("kvfast-{i}"))
        .start_handler(|_| WORKER.with(|w| w.set(true)))
        .build()
        .ok()
}

/// This process's pool: built on first use, and again in a forked child.
fn pool() -> Option<Arc<ThreadPool>> {
    let pid = std::process::id();
    let mut slot = match POOL.try_lock() {
        Ok(g) => g,
        Err(TryLockError::Poisoned(p)) => p.into_inner(),
        // Held: by another thread of this process (wait for it), or, in a child forked while a
        // thread of the parent held it, by no thread at all: a pool for this pass alone then.
        Err(TryLockError::WouldBlock) if OWNER.load(Ordering::Acquire) == pid => {
            POOL.lock().unwrap_or_else(|p| p.into_inner())
        }
        Err(TryLockError::WouldBlock) => return build().map(Arc::new),
    };
    match slot.as_ref() {
        Some((owner, p)) if *owner == pid => return Some(p.clone()),
        _ => {}
    }
    let fresh = Arc::new(build()?);
    if let Some((_, old)) = slot.replace((pid, fresh.clone())) {
        // the parent's, inherited by a fork: its threads are not in this process
        std::mem::forget(old);
    }
    OWNER.store(pid, Ordering::Release);
    Some(fresh)
}

/// Run `f` (and every parallel iterator inside it) in kvfast's pool; on one of its threads
/// already (a pass inside a pass), `f` runs there. Where no thread can be started, `f` runs on the
/// calling thread.
pub fn install<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    if WORKER.with(|w| w.get()) {
        return f();
    }
    match pool() {
        Some(p) => p.install(f),
        None => f(),
    }
}

#[cfg(test)]
mod tests {
    use rayon::prelude::*;

    use super::*;

    #[test]
    fn passes_run_in_kvfasts_pool_and_nest() {
        let names: Vec<String> = install(|| {
            (0..64)
                .into_par_iter()
                .map(|_| {
                    // a pass inside a pass runs on the same pool
                    install(|| std::thread::current().name().unwrap_or("").to_string())
                })
                .collect()
        });
        assert!(names.iter().all(|n| n.starts_with("kvfast-")), "{names:?}");
        assert_eq!(OWNER.load(Ordering::Acquire), std::process::id());
    }

    #[test]
    fn a_forked_child_builds_its_own_pool() {
        // the parent's pool, started
        let sum: u64 = install(|| (0..1000u64).into_par_iter().sum());
        assert_eq!(sum, 499_500);
        // SAFETY: the child runs this pass only and leaves by _exit (no destructor, no harness).
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            let ok = install(|| (0..1000u64).into_par_iter().sum::<u64>()) == 499_500;
            // SAFETY: ends the child.
            unsafe { libc::_exit(if ok { 0 } else { 1 }) };
        }
        // a child that hangs is killed after 60 s and fails the test (a watchdog, not a timing)
        let mut status = 0;
        let mut exited = false;
        for _ in 0..600 {
            // SAFETY: waitpid on our own child.
            if unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) } == pid {
                exited = true;
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        if !exited {
            // SAFETY: our own child.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
                libc::waitpid(pid, &mut status, 0);
            }
            panic!("the forked child's parallel pass never returned");
        }
        assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0);
    }
}
