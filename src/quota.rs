//! The per-user hourly call quota, counted in memory.
//!
//! The window is the clock hour (UTC): counters start from zero at the top of each hour.
//! Counters are written to the store every `QUOTA_FLUSH_INTERVAL_MS` and at shutdown, and read
//! back at start, so a restart does not hand out a fresh quota.

use std::sync::{Mutex, PoisonError};

pub struct Quota {
    allowed: u32,
    state: Mutex<State>,
}

struct State {
    hour: i64,
    /// Calls per user id (foldhash: counted on every request).
    used: foldhash::HashMap<i64, u32>,
}

pub fn hour_of(secs: i64) -> i64 {
    secs.div_euclid(3600)
}

impl Quota {
    pub fn new(allowed: u32, hour: i64, saved: Vec<(i64, u32)>) -> Quota {
        Quota { allowed, state: Mutex::new(State { hour, used: saved.into_iter().collect() }) }
    }

    pub fn allowed(&self) -> u32 {
        self.allowed
    }

    /// Counts one call for the user at `now` (Unix seconds). `Ok(used)` when within the quota,
    /// `Err(used)` when it is used up (the refused call is not counted).
    pub fn take(&self, user: i64, now: i64) -> Result<u32, u32> {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let hour = hour_of(now);
        if hour != state.hour {
            state.hour = hour;
            state.used.clear();
        }
        let used = state.used.entry(user).or_insert(0);
        if *used >= self.allowed {
            return Err(*used);
        }
        *used += 1;
        Ok(*used)
    }

    /// Calls the user made in the hour of `now` (nothing counted).
    pub fn used(&self, user: i64, now: i64) -> u32 {
        let state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if state.hour != hour_of(now) { 0 } else { state.used.get(&user).copied().unwrap_or(0) }
    }

    /// The current hour and its counters, for writing to the store.
    pub fn snapshot(&self) -> (i64, Vec<(i64, u32)>) {
        let state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        (state.hour, state.used.iter().map(|(u, n)| (*u, *n)).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_per_hour() {
        let q = Quota::new(2, hour_of(7200), vec![(1, 1)]);
        assert_eq!(q.take(1, 7200), Ok(2));
        assert_eq!(q.take(1, 7201), Err(2));
        assert_eq!(q.take(2, 7202), Ok(1));
        assert_eq!(q.take(1, 10800), Ok(1), "a new hour starts from zero");
    }
}
