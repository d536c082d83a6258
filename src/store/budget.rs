//! The bytes of records and activities one answer may read (`limits::REPLY_DATA_BYTES_MAX`).
//!
//! Lists, reports and shows read rows into memory and build their answer from them: a
//! report of 5,000 rows that each carry their record (`itemsdata`), or a record with
//! thousands of long notes, came to gigabytes. Each request's thread holds a budget; the row
//! readers charge the fields they read against it and stop with [`StoreError::TooLarge`]
//! when it is spent, before the rest is read.

use std::cell::Cell;

use super::StoreError;

thread_local! {
    /// Bytes left to the answer being made on this thread; None outside a request.
    static LEFT: Cell<Option<(usize, usize)>> = const { Cell::new(None) };
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
}
