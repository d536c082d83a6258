//! The queue from the live sources (the BLE scan, remote receivers) to the location thread.
//!
//! Bounded (`LOCATION_ADVERT_QUEUE_MAX`): when the location thread cannot keep up (its batch
//! write waits for a slow disk or for another process's write lock), adverts are dropped and
//! counted. An advert that carries a raised alarm flag of one of the site map's tag types is
//! not: it goes to a second, smaller lane (`LOCATION_URGENT_QUEUE_MAX`) that the location
//! thread reads first. A panic press during a long database stall is raised late, not lost.
//! While the main lane has room both go through it, in their order.

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender, TryRecvError, TrySendError};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use super::beacon::Advert;
use super::service::SiteHandle;
use crate::limits;

/// The sources' side: cheap to clone, one per source.
#[derive(Clone)]
pub struct AdvertSender {
    normal: Sender<Advert>,
    urgent: Sender<Advert>,
    /// Where the tag types' alarm flags are (the site map in force).
    site: SiteHandle,
    /// Adverts that took the urgent lane (the main one was full).
    urgent_taken: Arc<AtomicU64>,
}

/// The location thread's side.
pub struct AdvertReceiver {
    normal: Receiver<Advert>,
    urgent: Receiver<Advert>,
    urgent_taken: Arc<AtomicU64>,
}

pub fn bounded(site: SiteHandle) -> (AdvertSender, AdvertReceiver) {
    let (normal_tx, normal) = crossbeam_channel::bounded(limits::LOCATION_ADVERT_QUEUE_MAX);
    let (urgent_tx, urgent) = crossbeam_channel::bounded(limits::LOCATION_URGENT_QUEUE_MAX);
    let urgent_taken = Arc::new(AtomicU64::new(0));
    (
        AdvertSender { normal: normal_tx, urgent: urgent_tx, site, urgent_taken: Arc::clone(&urgent_taken) },
        AdvertReceiver { normal, urgent, urgent_taken },
    )
}

impl AdvertSender {
    /// Queues an advert; false when it was dropped (the queue full, or the location thread
    /// gone).
    pub fn send(&self, advert: Advert) -> bool {
        match self.normal.try_send(advert) {
            Ok(()) => true,
            Err(TrySendError::Full(advert)) if self.alarm_raised(&advert) => {
                let sent = self.urgent.try_send(advert).is_ok();
                if sent {
                    self.urgent_taken.fetch_add(1, Ordering::Relaxed);
                }
                sent
            }
            Err(_) => false,
        }
    }

    /// Whether the advert carries the raised alarm flag of any tag type (looked at only when
    /// the main lane is full).
    fn alarm_raised(&self, advert: &Advert) -> bool {
        let state = self.site.read().unwrap_or_else(std::sync::PoisonError::into_inner);
        state.site.tag_types.iter().filter_map(|t| t.alarm).any(|flag| flag.raised(advert) == Some(true))
    }
}

impl super::ble::Sink for AdvertSender {
    fn put(&mut self, advert: Advert) -> bool {
        self.send(advert)
    }
}

impl AdvertReceiver {
    /// The next advert, the urgent lane's first; waits up to `timeout` for one. Disconnected
    /// (the sources gone) only once both lanes are empty.
    pub fn recv_timeout(&self, timeout: Duration) -> Result<Advert, RecvTimeoutError> {
        match self.urgent.try_recv() {
            Ok(advert) => return Ok(advert),
            // The lanes share their senders: the other one gets nothing new either.
            Err(TryRecvError::Disconnected) => return self.normal.recv_timeout(timeout),
            Err(TryRecvError::Empty) => {}
        }
        crossbeam_channel::select! {
            recv(self.urgent) -> a => a.or_else(|_| self.normal.recv_timeout(timeout)),
            recv(self.normal) -> a => a.or_else(|_| self.urgent.try_recv().map_err(|_| RecvTimeoutError::Disconnected)),
            default(timeout) => Err(RecvTimeoutError::Timeout),
        }
    }

    /// Nothing waiting in either lane.
    pub fn is_empty(&self) -> bool {
        self.normal.is_empty() && self.urgent.is_empty()
    }

    /// Adverts that took the urgent lane since the last call.
    pub fn take_urgent_taken(&self) -> u64 {
        self.urgent_taken.swap(0, Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::location::site::{AlarmFlag, Site, TagType};

    fn advert(flag: Option<u8>) -> Advert {
        let mut mfg = vec![(0x004c, vec![0x02, 0x15])];
        if let Some(f) = flag {
            mfg.push((0x0059, vec![f]));
        }
        Advert {
            t_ms: 1,
            receiver: Arc::from("hci0"),
            mac: super::super::beacon::Mac([1; 6]),
            rssi: -60,
            mfg,
            svc: Vec::new(),
        }
    }

    fn site_with_alarm_flag() -> SiteHandle {
        let mut site = Site::default();
        site.tag_types.push(TagType { id: 1, title: "Staff".into(), alarm: AlarmFlag::parse("mfg:0059:0:01") });
        super::super::service::site_handle(Arc::new(site), Default::default(), Arc::new(Vec::new()))
    }

    #[test]
    fn a_full_queue_still_takes_raised_alarm_flags_and_gives_them_first() {
        let (tx, rx) = bounded(site_with_alarm_flag());
        for _ in 0..limits::LOCATION_ADVERT_QUEUE_MAX {
            assert!(tx.send(advert(None)));
        }
        assert!(!tx.send(advert(None)), "a plain advert beyond the bound is dropped");
        assert!(!tx.send(advert(Some(0))), "a lowered flag is dropped too");
        assert!(tx.send(advert(Some(1))), "a raised flag is taken");
        assert_eq!(rx.take_urgent_taken(), 1);
        let first = rx.recv_timeout(Duration::from_millis(10)).unwrap();
        assert_eq!(first.mfg.last(), Some(&(0x0059, vec![1])), "the urgent lane is read first");
        let mut urgent_room = 0;
        while tx.send(advert(Some(1))) {
            urgent_room += 1;
        }
        assert_eq!(urgent_room, limits::LOCATION_URGENT_QUEUE_MAX, "the urgent lane is bounded too");
        assert!(!rx.is_empty());
    }

    #[test]
    fn with_room_a_raised_flag_keeps_its_place() {
        let (tx, rx) = bounded(site_with_alarm_flag());
        assert!(tx.send(advert(None)));
        assert!(tx.send(advert(Some(1))));
        assert_eq!(rx.recv_timeout(Duration::from_millis(10)).unwrap().mfg.len(), 1);
        assert_eq!(rx.recv_timeout(Duration::from_millis(10)).unwrap().mfg.len(), 2);
        assert_eq!(rx.take_urgent_taken(), 0);
        assert!(rx.is_empty());
        assert!(matches!(rx.recv_timeout(Duration::from_millis(10)), Err(RecvTimeoutError::Timeout)));
    }

    /// The sources gone (stopping), what the lanes hold still comes out, all of it, before
    /// the receiver says so.
    #[test]
    fn what_waits_comes_out_after_the_sources_are_gone() {
        let (tx, rx) = bounded(site_with_alarm_flag());
        for _ in 0..limits::LOCATION_ADVERT_QUEUE_MAX {
            assert!(tx.send(advert(None)));
        }
        assert!(tx.send(advert(Some(1))));
        drop(tx);
        let mut got = 0;
        while let Ok(a) = rx.recv_timeout(Duration::from_secs(5)) {
            got += 1;
            if got == 1 {
                assert_eq!(a.mfg.len(), 2, "the urgent lane first");
            }
        }
        assert_eq!(got, limits::LOCATION_ADVERT_QUEUE_MAX + 1);
        assert!(rx.is_empty());
        assert!(matches!(rx.recv_timeout(Duration::from_millis(10)), Err(RecvTimeoutError::Disconnected)));
    }
}
