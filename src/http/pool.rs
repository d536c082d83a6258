//! The bounded worker pool that runs API handlers (which block on SQLite) off the async
//! runtime. `workers` named threads take jobs from one queue of `queue_depth_max` places;
//! when the queue is full the request is answered 503 at once.

use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;

use tokio::sync::oneshot;

use crate::api::{self, App};

struct Job {
    req: api::Request,
    reply: oneshot::Sender<api::Response>,
}

pub struct Pool {
    /// `None` once shut down: no more jobs are taken.
    tx: Mutex<Option<crossbeam_channel::Sender<Job>>>,
    threads: Mutex<Vec<JoinHandle<()>>>,
    metrics: Arc<crate::metrics::Metrics>,
}

/// The queue is full (or the pool is stopping): the request was not queued, and is given back.
pub struct Refused(pub Box<api::Request>);

impl Pool {
    pub fn start(app: Arc<App>, workers: usize, queue_depth_max: usize) -> std::io::Result<Pool> {
        let (tx, rx) = crossbeam_channel::bounded::<Job>(queue_depth_max);
        let mut threads = Vec::with_capacity(workers);
        for i in 0..workers {
            let rx = rx.clone();
            let app = Arc::clone(&app);
            let handle = std::thread::Builder::new().name(format!("http-worker-{i}")).spawn(move || {
                // Whether this worker made a large answer since it last gave memory back.
                let mut release_pending = false;
                loop {
                    let job = match rx.try_recv() {
                        Ok(job) => job,
                        Err(crossbeam_channel::TryRecvError::Disconnected) => break,
                        // Idle for a while after a large answer: its memory goes back to the
                        // system (busy, the worker reuses it; giving back costs milliseconds).
                        Err(crossbeam_channel::TryRecvError::Empty) if release_pending => {
                            let idle = std::time::Duration::from_millis(crate::limits::WORKER_RELEASE_IDLE_MS);
                            match rx.recv_timeout(idle) {
                                Ok(job) => job,
                                Err(crossbeam_channel::RecvTimeoutError::Timeout) => {
                                    release_pending = false;
                                    crate::release_freed_memory();
                                    continue;
                                }
                                Err(crossbeam_channel::RecvTimeoutError::Disconnected) => break,
                            }
                        }
                        Err(crossbeam_channel::TryRecvError::Empty) => match rx.recv() {
                            Ok(job) => job,
                            Err(_) => break,
                        },
                    };
                    app.metrics.queue_depth.set(rx.len() as i64);
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
        Ok(Pool { tx: Mutex::new(Some(tx)), threads: Mutex::new(threads), metrics: Arc::clone(&app.metrics) })
    }

    /// Queues a request; the receiver yields its response.
    pub fn submit(&self, req: api::Request) -> Result<oneshot::Receiver<api::Response>, Refused> {
        let (reply, rx) = oneshot::channel();
        let Some(tx) = self.tx.lock().unwrap_or_else(PoisonError::into_inner).clone() else {
            return Err(Refused(Box::new(req)));
        };
        match tx.try_send(Job { req, reply }) {
            Ok(()) => {
                self.metrics.queue_depth.set(tx.len() as i64);
                Ok(rx)
            }
            Err(e) => {
                self.metrics.rejected_busy.inc();
                Err(Refused(Box::new(e.into_inner().req)))
            }
        }
    }

    /// Stops taking jobs, lets the queued ones finish, and joins the workers.
    pub fn shutdown(&self) {
        drop(self.tx.lock().unwrap_or_else(PoisonError::into_inner).take());
        let threads = std::mem::take(&mut *self.threads.lock().unwrap_or_else(PoisonError::into_inner));
        for t in threads {
            let _ = t.join();
        }
    }
}
