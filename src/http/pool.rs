//! The bounded worker pool that runs API handlers (which block on SQLite) off the async
//! runtime. `workers` named threads take jobs from one queue of `queue_depth_max` places;
//! when the queue is full the request is answered 503 at once.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::thread::JoinHandle;

use tokio::sync::oneshot;

use crate::api::error::ApiError;
use crate::api::{self, App};

struct Job {
    req: api::Request,
    reply: oneshot::Sender<api::Response>,
}

pub struct Pool {
    tx: crossbeam_channel::Sender<Job>,
    threads: Vec<JoinHandle<()>>,
}

/// The queue is full (or the pool is stopping): the request was not queued.
pub struct Refused;

impl Pool {
    pub fn start(app: Arc<App>, workers: usize, queue_depth_max: usize) -> std::io::Result<Pool> {
        let (tx, rx) = crossbeam_channel::bounded::<Job>(queue_depth_max);
        let mut threads = Vec::with_capacity(workers);
        for i in 0..workers {
            let rx = rx.clone();
            let app = Arc::clone(&app);
            let handle = std::thread::Builder::new().name(format!("http-worker-{i}")).spawn(move || {
                for job in rx.iter() {
                    let response = run(&app, &job.req);
                    // The client may have gone; nothing to do then.
                    let _ = job.reply.send(response);
                }
            })?;
            threads.push(handle);
        }
        Ok(Pool { tx, threads })
    }

    /// Queues a request; the receiver yields its response.
    pub fn submit(&self, req: api::Request) -> Result<oneshot::Receiver<api::Response>, Refused> {
        let (reply, rx) = oneshot::channel();
        match self.tx.try_send(Job { req, reply }) {
            Ok(()) => Ok(rx),
            Err(_) => Err(Refused),
        }
    }

    /// Lets the queued jobs finish, then joins the workers.
    pub fn shutdown(self) {
        drop(self.tx);
        for t in self.threads {
            let _ = t.join();
        }
    }
}

/// Runs one request; a panic in the handler becomes a 500 for this request only.
fn run(app: &App, req: &api::Request) -> api::Response {
    match catch_unwind(AssertUnwindSafe(|| app.handle(req))) {
        Ok(response) => response,
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            let err = ApiError::internal(&format!("handler panicked on {} {}: {what}", req.method, req.path));
            api::early_error(&req.headers, &req.query, err, app.quota.allowed())
        }
    }
}
