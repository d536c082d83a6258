//! The HTTP ceiling for bench/peers.py: a minimal tiny_http server answering every request
//! with a fixed body, the same way sitegate's show is loaded.
//!
//!   cargo run --release --example hello_tiny_http -- 127.0.0.1:0 [THREADS]
//!
//! Prints `ready http=ADDR` once it listens; THREADS (default 4, as sitegate's workers) take
//! requests from tiny_http's queue and answer them.

use std::sync::Arc;

fn main() {
    let mut args = std::env::args().skip(1);
    let addr = args.next().unwrap_or_else(|| "127.0.0.1:0".into());
    let threads: usize = args.next().and_then(|t| t.parse().ok()).unwrap_or(4);
    let server = Arc::new(tiny_http::Server::http(&addr).expect("bind"));
    let bound = server.server_addr().to_ip().map(|a| a.to_string()).unwrap_or_default();
    println!("ready http={bound}");
    let body = "<?xml version=\"1.0\" encoding=\"utf-8\"?><hello>world</hello>";
    let header = tiny_http::Header::from_bytes("Content-Type", "application/xml").expect("header");
    let handles: Vec<_> = (0..threads)
        .map(|i| {
            let server = Arc::clone(&server);
            let header = header.clone();
            std::thread::Builder::new()
                .name(format!("hello-{i}"))
                .spawn(move || {
                    for request in server.incoming_requests() {
                        let _ = request.respond(tiny_http::Response::from_string(body).with_header(header.clone()));
                    }
                })
                .expect("thread")
        })
        .collect();
    for h in handles {
        let _ = h.join();
    }
}
