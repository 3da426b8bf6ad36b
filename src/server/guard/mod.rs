//! Logins under attack, as pure bookkeeping (times and addresses in, decisions out) beside one
//! thin pool of threads for argon2. An attacker holds many addresses, so limits count by
//! address range (`braid_proto::addr::Ranges`); a password check costs the server far more
//! than a guess costs the attacker, so checks are budgeted per account, per range and in total
//! ([`budget`], [`pool`]); failures slow down the (range, account) they came from, never a
//! whole range ([`failures`]); and connections that have not logged in are capped in total,
//! one of the oldest of the range holding most of them making way for newcomers ([`startups`]).

pub mod budget;
pub mod failures;
pub mod pool;
pub mod startups;

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

/// What all sessions share about logins, across reloads.
#[derive(Debug, Default)]
pub struct Guard {
    pub checks: pool::Checks,
    failures: Mutex<failures::Failures>,
    budget: Mutex<budget::Budget>,
    startups: Mutex<Doors>,
}

/// The places of connections not logged in yet, and how to tell each one it was pushed out.
#[derive(Debug, Default)]
struct Doors {
    table: startups::Startups,
    evict: HashMap<u64, tokio::sync::oneshot::Sender<()>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Guard {
    pub fn failures(&self) -> MutexGuard<'_, failures::Failures> {
        lock(&self.failures)
    }

    pub fn budget(&self) -> MutexGuard<'_, budget::Budget> {
        lock(&self.budget)
    }

    /// Takes a place among the connections not logged in yet (`max` in all) for one from
    /// `range`, pushing out another if they are all taken; or says why not.
    pub fn enter(self: &Arc<Self>, range: IpAddr, max: usize) -> Result<Place, String> {
        let now = Instant::now();
        let known = self.budget().is_known(range, now);
        let mut doors = lock(&self.startups);
        let entered = doors.table.enter(range, known, max, now, rand::random())?;
        if let Some(victim) = entered.evict
            && let Some(tell) = doors.evict.remove(&victim)
        {
            let _ = tell.send(());
        }
        let (tx, rx) = tokio::sync::oneshot::channel();
        doors.evict.insert(entered.id, tx);
        Ok(Place {
            guard: self.clone(),
            id: entered.id,
            pushed_out: rx,
        })
    }

    /// Makes room for a connection that would pass the cap on all connections by pushing out
    /// one that has not logged in (as a newcomer does past `--max-startups`); false if every
    /// connection has logged in.
    pub fn push_out_one(&self) -> bool {
        let mut doors = lock(&self.startups);
        let Some(victim) = doors.table.push_out(rand::random()) else {
            return false;
        };
        if let Some(tell) = doors.evict.remove(&victim) {
            let _ = tell.send(());
        }
        true
    }

    /// The login timeout for a connection starting now.
    pub fn login_timeout(
        &self,
        configured: std::time::Duration,
        max: usize,
    ) -> std::time::Duration {
        lock(&self.startups).table.login_timeout(configured, max)
    }
}

/// A connection's place among those not logged in yet, given back when dropped.
#[derive(Debug)]
pub struct Place {
    guard: Arc<Guard>,
    id: u64,
    /// Fires when a newcomer took the place: the connection is to be closed.
    pub pushed_out: tokio::sync::oneshot::Receiver<()>,
}

impl Place {
    /// Marks the connection as waiting for its password check (`familiar`: of an account that
    /// logged in from its range lately), so that it is pushed out last.
    pub fn checking(&self, checking: bool, familiar: bool) {
        lock(&self.guard.startups)
            .table
            .checking(self.id, checking, familiar);
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        let mut doors = lock(&self.guard.startups);
        doors.table.leave(self.id);
        doors.evict.remove(&self.id);
    }
}
