//! The bounded worker pool that runs API handlers (which block on SQLite) off the async
//! runtime. `workers` named threads take jobs from two lanes: requests of one item (a show,
//! a create, a change) and requests whose cost grows with the data (lists, searches, reports,
//! exports, batches: [`api::is_heavy`]). At most `heavy_workers` threads take the heavy lane,
//! and they take it first; the rest take only requests of one item, so those find a worker
//! however many expensive requests are waiting. At most `queue_depth_max` requests wait, in
//! both lanes together; beyond, a request is answered 503 at once.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use crossbeam_channel::{Receiver, Select, Sender, TryRecvError};
use tokio::sync::oneshot;

use crate::api::{self, App};

struct Job {
    req: api::Request,
    reply: oneshot::Sender<api::Response>,
}

struct Lanes {
    quick: Sender<Job>,
    heavy: Sender<Job>,
}

pub struct Pool {
    /// `None` once shut down: no more jobs are taken.
    lanes: Mutex<Option<Lanes>>,
    /// Requests waiting in both lanes.
    waiting: Arc<AtomicUsize>,
    queue_depth_max: usize,
    threads: Mutex<Vec<JoinHandle<()>>>,
    metrics: Arc<crate::metrics::Metrics>,
}

/// The queue is full (or the pool is stopping): the request was not queued, and is given back.
pub struct Refused(pub Box<api::Request>);

/// What a worker found when it looked for work. Returned once per job and moved at once: a
/// box would cost an allocation per request for nothing.
#[allow(clippy::large_enum_variant)]
enum Next {
    Job(Job),
    /// Nothing arrived within the idle time asked for.
    Idle,
    /// The pool is stopping and every lane it takes is empty.
    Closed,
}

/// The next job from `lanes`, tried in their order; waits for one (at most `idle`, if given).
fn next_job(lanes: &[&Receiver<Job>], idle: Option<Duration>) -> Next {
    loop {
        let mut open = 0;
        for rx in lanes {
            match rx.try_recv() {
                Ok(job) => return Next::Job(job),
                Err(TryRecvError::Empty) => open += 1,
                Err(TryRecvError::Disconnected) => {}
            }
        }
        if open == 0 {
            return Next::Closed;
        }
        let mut select = Select::new();
        for rx in lanes {
            select.recv(rx);
        }
        // A lane is ready (or closed); another worker may take its job first, so look again
        // in the lanes' order.
        match idle {
            Some(idle) => {
                if select.ready_timeout(idle).is_err() {
                    return Next::Idle;
                }
            }
            None => {
                select.ready();
            }
        }
    }
}

impl Pool {
    /// `heavy_workers` of the `workers` take the heavy lane (all of them if it is not less).
    pub fn start(app: Arc<App>, workers: usize, heavy_workers: usize, queue_depth_max: usize) -> std::io::Result<Pool> {
        // Each lane could take them all; `waiting` keeps the two together within the bound.
        let (quick_tx, quick_rx) = crossbeam_channel::bounded::<Job>(queue_depth_max);
        let (heavy_tx, heavy_rx) = crossbeam_channel::bounded::<Job>(queue_depth_max);
        let waiting = Arc::new(AtomicUsize::new(0));
        let mut threads = Vec::with_capacity(workers);
        // With a worker kept for requests of one item, the others take the heavy lane first:
        // only they take it. With none kept (`heavy_workers` = `workers`, small sites), each
        // takes the lanes in turn, so that a stream of expensive requests cannot hold the
        // others back for good.
        let keeps_one = heavy_workers < workers;
        for i in 0..workers {
            let takes_heavy = i < heavy_workers;
            let (quick_rx, heavy_rx) = (quick_rx.clone(), heavy_rx.clone());
            let app = Arc::clone(&app);
            let waiting = Arc::clone(&waiting);
            let handle = std::thread::Builder::new().name(format!("http-worker-{i}")).spawn(move || {
                let mut lanes: Vec<&Receiver<Job>> =
                    if takes_heavy { vec![&heavy_rx, &quick_rx] } else { vec![&quick_rx] };
                // Whether this worker made a large answer since it last gave memory back.
                let mut release_pending = false;
                loop {
                    // Idle for a while after a large answer: its memory goes back to the
                    // system (busy, the worker reuses it; giving back costs milliseconds).
                    let idle = release_pending.then(|| Duration::from_millis(crate::limits::WORKER_RELEASE_IDLE_MS));
                    let job = match next_job(&lanes, idle) {
                        Next::Job(job) => {
                            if takes_heavy && !keeps_one {
                                lanes.rotate_left(1);
                            }
                            job
                        }
                        Next::Idle => {
                            release_pending = false;
                            crate::release_freed_memory();
                            continue;
                        }
                        Next::Closed => break,
                    };
                    let left = waiting.fetch_sub(1, Ordering::Relaxed).saturating_sub(1);
                    app.metrics.queue_depth.set(left as i64);
                    // A read whose client went away while it waited is not run (a client that
                    // gave up and asks again would otherwise cost the work twice).
                    if job.req.method == http::Method::GET && job.reply.is_closed() {
                        log::debug!("{} {}: the client has gone; not run", job.req.method, job.req.path);
                        continue;
                    }
                    app.metrics.workers_busy.inc();
                    let response = app.handle_isolated(&job.req);
                    app.metrics.workers_busy.dec();
                    release_pending |= crate::store::take_charged().saturating_add(response.body.len())
                        > crate::limits::WORKER_RELEASE_AFTER_BYTES;
                    if job.reply.is_closed() {
                        log::debug!(
                            "{} {}: its client had gone before the answer ({})",
                            job.req.method,
                            job.req.path,
                            response.status
                        );
                    }
                    // The client may have gone; nothing to do then.
                    let _ = job.reply.send(response);
                }
            })?;
            threads.push(handle);
        }
        Ok(Pool {
            lanes: Mutex::new(Some(Lanes { quick: quick_tx, heavy: heavy_tx })),
            waiting,
            queue_depth_max,
            threads: Mutex::new(threads),
            metrics: Arc::clone(&app.metrics),
        })
    }

    /// Queues a request in its lane; the receiver yields its response.
    pub fn submit(&self, req: api::Request) -> Result<oneshot::Receiver<api::Response>, Refused> {
        let (reply, rx) = oneshot::channel();
        let heavy = api::is_heavy(&req.method, &req.path);
        let tx = {
            let lanes = self.lanes.lock().unwrap_or_else(PoisonError::into_inner);
            match lanes.as_ref() {
                Some(lanes) => {
                    if heavy {
                        lanes.heavy.clone()
                    } else {
                        lanes.quick.clone()
                    }
                }
                None => return Err(Refused(Box::new(req))),
            }
        };
        let admitted = self
            .waiting
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| (n < self.queue_depth_max).then_some(n + 1));
        let refused = match admitted {
            Ok(n) => match tx.try_send(Job { req, reply }) {
                Ok(()) => {
                    self.metrics.queue_depth.set(n as i64 + 1);
                    return Ok(rx);
                }
                Err(e) => {
                    self.waiting.fetch_sub(1, Ordering::Relaxed);
                    e.into_inner().req
                }
            },
            Err(_) => req,
        };
        self.metrics.rejected_busy.inc();
        Err(Refused(Box::new(refused)))
    }

    /// Stops taking jobs, lets the queued ones finish, and joins the workers.
    pub fn shutdown(&self) {
        drop(self.lanes.lock().unwrap_or_else(PoisonError::into_inner).take());
        let threads = std::mem::take(&mut *self.threads.lock().unwrap_or_else(PoisonError::into_inner));
        for t in threads {
            let _ = t.join();
        }
    }
}
