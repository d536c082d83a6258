//! What one request's reads may take: bytes of records (`limits::REPLY_DATA_BYTES_MAX`) and
//! time (`[http] read_time_max_ms`), and no more once its client has gone.
//!
//! Lists, reports and shows read rows into memory and build their answer from them: a
//! report of 5,000 rows that each carry their record (`itemsdata`), or a record with
//! thousands of long notes, came to gigabytes. Each request's thread holds a budget; the row
//! readers charge the fields they read against it and stop with [`StoreError::TooLarge`]
//! when it is spent, before the rest is read.

use std::cell::{Cell, RefCell};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use super::StoreError;

thread_local! {
    /// Bytes left to the answer being made on this thread; None outside a request.
    static LEFT: Cell<Option<(usize, usize)>> = const { Cell::new(None) };
    /// Bytes charged on this thread since [`take_charged`] last looked.
    static CHARGED: Cell<usize> = const { Cell::new(0) };
}

/// The bytes of records read for answers on this thread since the last call (a worker asks
/// after each request whether it made a large one).
pub fn take_charged() -> usize {
    CHARGED.with(|c| c.replace(0))
}

/// The budget of the answer made on this thread while it lives; the one before it after.
pub struct ReplyBudget {
    before: Option<(usize, usize)>,
}

impl ReplyBudget {
    /// `bytes` for what follows on this thread, or what is left of the enclosing budget if
    /// that is less (a nested request of a batch gets no more than the batch has room for).
    pub fn start(bytes: usize) -> ReplyBudget {
        let before = LEFT.with(Cell::get);
        let left = before.map_or(bytes, |(left, _)| left.min(bytes));
        LEFT.with(|l| l.set(Some((left, left))));
        ReplyBudget { before }
    }

    /// No budget while it lives: for writes, whose reads (a webhook's notification, which has
    /// a limit of its own) are not the answer.
    pub fn suspend() -> ReplyBudget {
        ReplyBudget { before: LEFT.with(|l| l.replace(None)) }
    }
}

impl Drop for ReplyBudget {
    fn drop(&mut self) {
        LEFT.with(|l| l.set(self.before));
    }
}

/// Takes `bytes` from this thread's budget; too large once it is spent. Without a budget
/// (background work: webhooks, the location engine) nothing is counted.
pub fn charge(bytes: usize) -> Result<(), StoreError> {
    LEFT.with(|l| match l.get() {
        None => Ok(()),
        Some((left, of)) if bytes <= left => {
            l.set(Some((left - bytes, of)));
            CHARGED.with(|c| c.set(c.get().saturating_add(bytes)));
            Ok(())
        }
        Some((_, of)) => Err(StoreError::TooLarge(of)),
    })
}

/// [`charge`] inside a row reader: the error travels through rusqlite to
/// `StoreError::from`, which gives it back.
pub(super) fn charge_row(bytes: usize) -> rusqlite::Result<()> {
    charge(bytes).map_err(|e| rusqlite::Error::UserFunctionError(Box::new(e)))
}

/// When the reads of the request on this thread stop: at its deadline, or once its client
/// has gone (the HTTP layer sets the flag when it drops the request).
#[derive(Clone)]
struct Stop {
    deadline: Instant,
    /// What the deadline was set for, for the error.
    time_max: Duration,
    gone: Option<Arc<AtomicBool>>,
}

thread_local! {
    static STOP: RefCell<Option<Stop>> = const { RefCell::new(None) };
}

/// The reads of the request on this thread stop once it has run `time_max` (no later than an
/// enclosing request's deadline) or its client has gone; the stop before it after.
pub struct ReadStop {
    before: Option<Stop>,
}

impl ReadStop {
    pub fn start(time_max: Duration, gone: Option<Arc<AtomicBool>>) -> ReadStop {
        let before = STOP.with(|s| s.borrow().clone());
        let mut stop = Stop { deadline: Instant::now() + time_max, time_max, gone };
        if let Some(outer) = &before
            && outer.deadline < stop.deadline
        {
            stop.deadline = outer.deadline;
            stop.time_max = outer.time_max;
        }
        if let Some(outer) = &before {
            stop.gone = stop.gone.or_else(|| outer.gone.clone());
        }
        STOP.with(|s| *s.borrow_mut() = Some(stop));
        ReadStop { before }
    }
}

impl Drop for ReadStop {
    fn drop(&mut self) {
        STOP.with(|s| *s.borrow_mut() = self.before.take());
    }
}

/// Whether the request's reads on this thread should stop (the read connections' progress
/// handler asks, every `STORE_PROGRESS_OPS` steps of a statement).
pub(super) fn read_should_stop() -> bool {
    STOP.with(|s| {
        s.borrow()
            .as_ref()
            .is_some_and(|s| s.gone.as_ref().is_some_and(|g| g.load(Ordering::Relaxed)) || Instant::now() >= s.deadline)
    })
}

/// Why the reads stopped, for the caller's error.
pub(super) fn stopped() -> StoreError {
    STOP.with(|s| match s.borrow().as_ref() {
        Some(s) if s.gone.as_ref().is_some_and(|g| g.load(Ordering::Relaxed)) => {
            StoreError::Stopped("its client has gone".into())
        }
        Some(s) => StoreError::Stopped(format!("its reads ran longer than {} ms", s.time_max.as_millis())),
        None => StoreError::Stopped("it was interrupted".into()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_budget_is_spent_and_nested_ones_get_no_more_than_is_left() {
        assert!(charge(usize::MAX).is_ok(), "no budget outside a request");
        let outer = ReplyBudget::start(100);
        charge(60).unwrap();
        {
            let _inner = ReplyBudget::start(1000);
            charge(40).unwrap();
            assert!(matches!(charge(1), Err(StoreError::TooLarge(40))));
        }
        // The enclosing budget is back as it was before the nested one.
        charge(40).unwrap();
        assert!(matches!(charge(1), Err(StoreError::TooLarge(100))));
        {
            let _write = ReplyBudget::suspend();
            assert!(charge(usize::MAX).is_ok(), "a write is not charged");
        }
        assert!(matches!(charge(1), Err(StoreError::TooLarge(100))));
        drop(outer);
        assert!(charge(usize::MAX).is_ok());
    }

    #[test]
    fn reads_stop_at_the_deadline_or_when_the_client_has_gone() {
        assert!(!read_should_stop(), "no stop outside a request");
        let gone = Arc::new(AtomicBool::new(false));
        let outer = ReadStop::start(Duration::from_secs(60), Some(Arc::clone(&gone)));
        assert!(!read_should_stop());
        {
            // A nested request keeps the enclosing client, and its earlier deadline.
            let _nested = ReadStop::start(Duration::from_secs(3600), None);
            gone.store(true, Ordering::Relaxed);
            assert!(read_should_stop());
            assert!(matches!(stopped(), StoreError::Stopped(why) if why.contains("client")));
            gone.store(false, Ordering::Relaxed);
        }
        {
            let _short = ReadStop::start(Duration::ZERO, None);
            assert!(read_should_stop());
            assert!(matches!(stopped(), StoreError::Stopped(why) if why.contains("longer than")));
        }
        assert!(!read_should_stop());
        drop(outer);
        assert!(!read_should_stop());
    }
}
