//! The threads that check passwords: a fixed few (argon2 takes 19 MiB and tens of
//! milliseconds a check; a flood of guesses once ran one per blocking thread at once, 6 GB),
//! with two bounded queues. Checks of familiar (range, account) pairs go first, so a flood of
//! strangers' guesses cannot keep an account's owner out; a check whose client hung up while it
//! waited is skipped; a full queue refuses at once, and the caller answers "try later" without
//! counting a failure.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, OnceLock};

/// Checks waiting at most in each queue, beyond those running.
pub const QUEUE: usize = 64;

type Job = Box<dyn FnOnce() + Send>;

#[derive(Default)]
struct Queues {
    familiar: VecDeque<Job>,
    strangers: VecDeque<Job>,
}

#[derive(Default)]
struct Shared {
    queues: Mutex<Queues>,
    ready: Condvar,
}

#[derive(Default)]
pub struct Checks {
    shared: OnceLock<Arc<Shared>>,
}

impl std::fmt::Debug for Checks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Checks")
    }
}

impl Checks {
    /// Runs `check` on the pool, ahead of strangers' checks if `familiar`; None if its queue
    /// is full. Dropping the future before the check starts cancels it.
    pub async fn run<T: Send + 'static>(
        &self,
        familiar: bool,
        check: impl FnOnce() -> T + Send + 'static,
    ) -> Option<T> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let job: Job = Box::new(move || {
            // The client hung up while this waited: nobody reads the answer.
            if !tx.is_closed() {
                let _ = tx.send(check());
            }
        });
        let shared = self.shared.get_or_init(start);
        {
            let mut q = shared.queues.lock().unwrap_or_else(|p| p.into_inner());
            let queue = if familiar {
                &mut q.familiar
            } else {
                &mut q.strangers
            };
            if queue.len() >= QUEUE {
                return None;
            }
            queue.push_back(job);
        }
        shared.ready.notify_one();
        rx.await.ok()
    }
}

fn start() -> Arc<Shared> {
    let shared = Arc::new(Shared::default());
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get().min(4));
    for i in 0..threads {
        let shared = shared.clone();
        let spawned = std::thread::Builder::new()
            .name(format!("braid-login-{i}"))
            .spawn(move || work(&shared));
        if let Err(e) = spawned {
            tracing::error!("cannot start a password-check thread: {e}");
        }
    }
    shared
}

fn work(shared: &Shared) {
    loop {
        let job = {
            let mut q = shared.queues.lock().unwrap_or_else(|p| p.into_inner());
            loop {
                if let Some(job) = q.familiar.pop_front().or_else(|| q.strangers.pop_front()) {
                    break job;
                }
                q = shared.ready.wait(q).unwrap_or_else(|p| p.into_inner());
            }
        };
        job();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn familiar_checks_jump_the_queue_and_a_full_queue_refuses() {
        let checks = Arc::new(Checks::default());
        let threads = std::thread::available_parallelism().map_or(2, |n| n.get().min(4));
        // Hold every thread until told.
        let (go, gate) = std::sync::mpsc::channel::<()>();
        let gate = Arc::new(Mutex::new(gate));
        let running = Arc::new(AtomicUsize::new(0));
        for _ in 0..threads {
            let (c, gate, running) = (checks.clone(), gate.clone(), running.clone());
            tokio::spawn(async move {
                c.run(false, move || {
                    running.fetch_add(1, Ordering::SeqCst);
                    let _ = gate.lock().unwrap().recv();
                })
                .await
            });
        }
        while running.load(Ordering::SeqCst) < threads {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let order = Arc::new(Mutex::new(Vec::new()));
        let started = Arc::new(AtomicUsize::new(0));
        let mut waiting = Vec::new();
        for i in 0..QUEUE {
            let (c, order, started) = (checks.clone(), order.clone(), started.clone());
            waiting.push(tokio::spawn(async move {
                started.fetch_add(1, Ordering::SeqCst);
                c.run(false, move || order.lock().unwrap().push(i)).await
            }));
        }
        // Wait until every stranger's check is queued.
        while started.load(Ordering::SeqCst) < QUEUE
            || checks
                .shared
                .get()
                .unwrap()
                .queues
                .lock()
                .unwrap()
                .strangers
                .len()
                < QUEUE
        {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert!(checks.run(false, || ()).await.is_none(), "queue full");
        let (c, o) = (checks.clone(), order.clone());
        let owner = tokio::spawn(async move {
            c.run(true, move || o.lock().unwrap().push(usize::MAX))
                .await
        });
        while checks
            .shared
            .get()
            .unwrap()
            .queues
            .lock()
            .unwrap()
            .familiar
            .is_empty()
        {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        for _ in 0..threads {
            go.send(()).unwrap();
        }
        assert!(owner.await.unwrap().is_some());
        for w in waiting {
            assert!(w.await.unwrap().is_some());
        }
        assert_eq!(order.lock().unwrap()[0], usize::MAX, "the owner went first");
    }
}
