//! MQTT load for bench/mqtt.py: one publisher to N subscribers at a fixed rate, 200-byte
//! payloads carrying their send time; prints one JSON line with the throughput received and
//! the one-way latencies as measured (no correction), or holds idle connections open.
//!
//!   cargo run --release --example mqtt_bench -- pubsub HOST PORT USER PASSWORD TOPIC SUBS RATE SECONDS QOS [nagle]
//!   cargo run --release --example mqtt_bench -- idle HOST PORT USER PASSWORD TOPIC CONNECTIONS SECONDS
//!
//! Runs on one tokio runtime (rumqttc); bounded in count and time.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rumqttc::{AsyncClient, Event, MqttOptions, NetworkOptions, Packet, QoS};

fn now_ns() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0)
}

fn options(id: &str, host: &str, port: u16, user: &str, password: &str) -> MqttOptions {
    let mut o = MqttOptions::new(id, host, port);
    o.set_keep_alive(Duration::from_secs(60)).set_inflight(1000).set_max_packet_size(1 << 20, 1 << 20);
    if !user.is_empty() {
        o.set_credentials(user, password);
    }
    o
}

/// TCP_NODELAY on the client's sockets unless `nagle` was asked for (rumqttc's default leaves
/// Nagle's algorithm on): with it on, a QoS 0 publisher, which the broker never answers, holds
/// its small writes back until the broker's delayed ACK, and the latencies measure that wait
/// (about 12 ms at the median at 10,000/s) rather than the broker; a QoS 1 subscriber's
/// PUBACKs leave in batches.
fn network(nodelay: bool) -> NetworkOptions {
    let mut n = NetworkOptions::new();
    n.set_tcp_nodelay(nodelay);
    n
}

/// Where and as whom to connect, and what to subscribe to.
#[derive(Clone)]
struct Target {
    host: String,
    port: u16,
    user: String,
    password: String,
    topic: String,
}

/// Connects and subscribes; returns once the SUBACK is in, with the event loop running.
async fn subscriber(
    id: String,
    t: Target,
    nodelay: bool,
    qos: QoS,
    latencies: Option<tokio::sync::mpsc::UnboundedSender<u64>>,
    received: Arc<AtomicU64>,
) -> (AsyncClient, tokio::task::JoinHandle<()>) {
    let (client, mut eventloop) = AsyncClient::new(options(&id, &t.host, t.port, &t.user, &t.password), 1000);
    eventloop.set_network_options(network(nodelay));
    let topic = t.topic;
    client.subscribe(&topic, qos).await.expect("subscribe");
    let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
    let task = tokio::spawn(async move {
        let mut ready = Some(ready_tx);
        loop {
            match eventloop.poll().await {
                Ok(Event::Incoming(Packet::SubAck(_))) => {
                    if let Some(r) = ready.take() {
                        let _ = r.send(());
                    }
                }
                Ok(Event::Incoming(Packet::Publish(p))) => {
                    received.fetch_add(1, Ordering::Relaxed);
                    if let Some(l) = &latencies
                        && p.payload.len() >= 8
                    {
                        let sent = u64::from_be_bytes(p.payload[..8].try_into().unwrap_or([0; 8]));
                        let _ = l.send(now_ns().saturating_sub(sent));
                    }
                }
                Ok(_) => {}
                Err(e) => {
                    eprintln!("{id}: {e}");
                    return;
                }
            }
        }
    });
    let _ = tokio::time::timeout(Duration::from_secs(30), ready_rx).await;
    (client, task)
}

fn percentile(sorted: &[u64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i] as f64 / 1000.0
}

#[tokio::main(flavor = "multi_thread", worker_threads = 1)]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mode = args.first().map(String::as_str).unwrap_or("");
    let host = args.get(1).cloned().unwrap_or_else(|| "127.0.0.1".into());
    let port: u16 = args.get(2).and_then(|p| p.parse().ok()).unwrap_or(1883);
    let target = Target {
        host: host.clone(),
        port,
        user: args.get(3).cloned().unwrap_or_default(),
        password: args.get(4).cloned().unwrap_or_default(),
        topic: args.get(5).cloned().unwrap_or_else(|| "acme/bench".into()),
    };
    let topic = target.topic.clone();
    match mode {
        "pubsub" => {
            let subs: usize = args.get(6).and_then(|v| v.parse().ok()).unwrap_or(1).clamp(1, 1000);
            let rate: u64 = args.get(7).and_then(|v| v.parse().ok()).unwrap_or(1000).clamp(1, 1_000_000);
            let seconds: u64 = args.get(8).and_then(|v| v.parse().ok()).unwrap_or(10).clamp(1, 300);
            let qos = if args.get(9).map(String::as_str) == Some("1") { QoS::AtLeastOnce } else { QoS::AtMostOnce };
            let nodelay = args.get(10).map(String::as_str) != Some("nagle");
            let received = Arc::new(AtomicU64::new(0));
            let (lat_tx, mut lat_rx) = tokio::sync::mpsc::unbounded_channel();
            let mut clients = Vec::new();
            for i in 0..subs {
                // Latencies from the first subscriber (all subscribers get every message).
                let l = (i == 0).then(|| lat_tx.clone());
                clients.push(
                    subscriber(format!("bench-sub-{i}"), target.clone(), nodelay, qos, l, Arc::clone(&received)).await,
                );
            }
            drop(lat_tx);
            let (publisher, mut eventloop) =
                AsyncClient::new(options("bench-pub", &host, port, &target.user, &target.password), 10_000);
            eventloop.set_network_options(network(nodelay));
            let pub_loop = tokio::spawn(async move { while eventloop.poll().await.is_ok() {} });
            let started = Instant::now();
            let total = rate * seconds;
            let mut payload = vec![b'x'; 200];
            let mut sent = 0u64;
            let mut tick = tokio::time::interval(Duration::from_millis(1));
            while sent < total && started.elapsed() < Duration::from_secs(seconds + 30) {
                tick.tick().await;
                let due = (started.elapsed().as_secs_f64() * rate as f64) as u64;
                while sent < due.min(total) {
                    payload[..8].copy_from_slice(&now_ns().to_be_bytes());
                    if publisher.publish(&topic, qos, false, payload.clone()).await.is_err() {
                        break;
                    }
                    sent += 1;
                }
            }
            let send_s = started.elapsed().as_secs_f64();
            // Wait for the tail (at most 10 s).
            let expected = sent * subs as u64;
            let deadline = Instant::now() + Duration::from_secs(10);
            while received.load(Ordering::Relaxed) < expected && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            let elapsed = started.elapsed().as_secs_f64();
            for (c, t) in clients {
                let _ = c.disconnect().await;
                t.abort();
            }
            let _ = publisher.disconnect().await;
            pub_loop.abort();
            let mut lat = Vec::new();
            while let Ok(v) = lat_rx.try_recv() {
                lat.push(v);
            }
            lat.sort_unstable();
            let got = received.load(Ordering::Relaxed);
            println!(
                "{{\"sent\":{sent},\"subs\":{subs},\"received\":{got},\"expected\":{expected},\"send_s\":{send_s:.3},\"elapsed_s\":{elapsed:.3},\"delivered_per_s\":{:.0},\"p50_us\":{:.0},\"p99_us\":{:.0},\"max_us\":{:.0}}}",
                got as f64 / elapsed.max(send_s),
                percentile(&lat, 0.50),
                percentile(&lat, 0.99),
                percentile(&lat, 1.0)
            );
        }
        "idle" => {
            let n: usize = args.get(6).and_then(|v| v.parse().ok()).unwrap_or(1000).clamp(1, 20_000);
            let seconds: u64 = args.get(7).and_then(|v| v.parse().ok()).unwrap_or(10).clamp(1, 600);
            let received = Arc::new(AtomicU64::new(0));
            let mut clients = Vec::new();
            for i in 0..n {
                clients.push(
                    subscriber(
                        format!("bench-idle-{i}"),
                        target.clone(),
                        true,
                        QoS::AtMostOnce,
                        None,
                        Arc::clone(&received),
                    )
                    .await,
                );
            }
            println!("{{\"connected\":{n}}}");
            tokio::time::sleep(Duration::from_secs(seconds)).await;
            for (c, t) in clients {
                let _ = c.disconnect().await;
                tokio::time::sleep(Duration::from_micros(100)).await;
                t.abort();
            }
            println!("{{\"disconnected\":{n}}}");
        }
        _ => {
            eprintln!("usage: mqtt_bench pubsub|idle HOST PORT USER PASSWORD TOPIC ...");
            std::process::exit(64);
        }
    }
}
