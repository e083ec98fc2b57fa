//! Proxies in the test process that play a network path: `Proxy`, which a
//! test can freeze (while frozen it moves no byte either way but keeps every
//! connection open, as a stalled path does: no reset, no close), and
//! `SlowLink`, slow and unreliable.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

pub struct Proxy {
    pub address: String,
    frozen: Arc<AtomicBool>,
}

impl Proxy {
    /// Forwards every connection made to `address` to `upstream`.
    pub fn start(upstream: &str) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the proxy");
        let address = listener.local_addr().unwrap().to_string();
        let frozen = Arc::new(AtomicBool::new(false));
        let upstream = upstream.to_string();
        let accept_frozen = frozen.clone();
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { continue };
                let Ok(server) = TcpStream::connect(&upstream) else { continue };
                for (from, to) in [(&client, &server), (&server, &client)] {
                    let (from, to) = (from.try_clone().unwrap(), to.try_clone().unwrap());
                    let frozen = accept_frozen.clone();
                    std::thread::spawn(move || pump(from, to, &frozen));
                }
            }
        });
        Proxy { address, frozen }
    }

    pub fn freeze(&self) {
        self.frozen.store(true, Ordering::SeqCst);
    }

    pub fn thaw(&self) {
        self.frozen.store(false, Ordering::SeqCst);
    }
}

fn pump(mut from: TcpStream, mut to: TcpStream, frozen: &AtomicBool) {
    let _ = from.set_read_timeout(Some(Duration::from_millis(20)));
    let mut buffer = [0u8; 16 * 1024];
    loop {
        if frozen.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(10));
            continue;
        }
        match from.read(&mut buffer) {
            Ok(0) => break,
            Ok(n) => {
                if to.write_all(&buffer[..n]).is_err() {
                    break;
                }
            }
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
            Err(_) => break,
        }
    }
    let _ = to.shutdown(std::net::Shutdown::Write);
}

/// A link that is slow and unreliable, as a long or congested network path
/// is: it forwards every connection made to `address` to its upstream,
/// delaying each piece of data by `delay` ± `jitter` (the order of the bytes
/// kept, as TCP keeps it), and, when `drop_every` is set, dropping one of
/// its connections (both ways, at once) that often. The delay and the
/// drops can be changed while it runs.
pub struct SlowLink {
    pub address: String,
    state: Arc<SlowState>,
}

struct SlowState {
    upstream: String,
    /// Delay and jitter in microseconds, and the drop interval in ms (0: none).
    delay_us: std::sync::atomic::AtomicU64,
    jitter_us: std::sync::atomic::AtomicU64,
    drop_every_ms: std::sync::atomic::AtomicU64,
    /// How long a new connection waits before it is made upstream, in ms.
    connect_delay_ms: std::sync::atomic::AtomicU64,
    /// The connections open now, to drop one.
    open: std::sync::Mutex<Vec<(TcpStream, TcpStream)>>,
    /// Connections dropped so far.
    dropped: std::sync::atomic::AtomicU64,
    stopped: AtomicBool,
}

impl SlowLink {
    /// Listens on `listen` (`ADDRESS:0` for any port) and forwards to `upstream`.
    pub fn start(listen: &str, upstream: &str) -> SlowLink {
        let listener = TcpListener::bind(listen).expect("bind the slow link");
        let address = listener.local_addr().unwrap().to_string();
        let state = Arc::new(SlowState {
            upstream: upstream.to_string(),
            delay_us: 0.into(),
            jitter_us: 0.into(),
            drop_every_ms: 0.into(),
            connect_delay_ms: 0.into(),
            open: std::sync::Mutex::new(Vec::new()),
            dropped: 0.into(),
            stopped: AtomicBool::new(false),
        });
        let accepting = state.clone();
        std::thread::spawn(move || {
            for client in listener.incoming() {
                if accepting.stopped.load(Ordering::SeqCst) {
                    return;
                }
                let Ok(client) = client else { continue };
                let state = accepting.clone();
                std::thread::spawn(move || {
                    let wait = state.connect_delay_ms.load(Ordering::SeqCst);
                    if wait > 0 {
                        std::thread::sleep(Duration::from_millis(wait));
                    }
                    let Ok(server) = TcpStream::connect(&state.upstream) else { return };
                    let _ = client.set_nodelay(true);
                    let _ = server.set_nodelay(true);
                    state.open.lock().unwrap().push((client.try_clone().unwrap(), server.try_clone().unwrap()));
                    for (from, to) in [(&client, &server), (&server, &client)] {
                        let (from, to) = (from.try_clone().unwrap(), to.try_clone().unwrap());
                        let state = state.clone();
                        std::thread::spawn(move || delayed_pump(from, to, &state));
                    }
                });
            }
        });
        let dropping = state.clone();
        std::thread::spawn(move || {
            let mut rng = 0x9e37_79b9_7f4a_7c15u64;
            while !dropping.stopped.load(Ordering::SeqCst) {
                let every = dropping.drop_every_ms.load(Ordering::SeqCst);
                std::thread::sleep(Duration::from_millis(if every == 0 { 100 } else { every }));
                if every == 0 {
                    continue;
                }
                let mut open = dropping.open.lock().unwrap();
                open.retain(|(client, _)| client.peer_addr().is_ok());
                if open.is_empty() {
                    continue;
                }
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                let victim = (rng % open.len() as u64) as usize;
                let (client, server) = open.swap_remove(victim);
                let _ = client.shutdown(std::net::Shutdown::Both);
                let _ = server.shutdown(std::net::Shutdown::Both);
                dropping.dropped.fetch_add(1, Ordering::SeqCst);
            }
        });
        SlowLink { address, state }
    }

    /// From now on, data waits `delay` ± `jitter` on its way, and a
    /// connection is dropped every `drop_every`.
    pub fn set(&self, delay: Duration, jitter: Duration, drop_every: Option<Duration>) {
        self.state.delay_us.store(delay.as_micros() as u64, Ordering::SeqCst);
        self.state.jitter_us.store(jitter.as_micros() as u64, Ordering::SeqCst);
        self.state.drop_every_ms.store(drop_every.map_or(0, |d| d.as_millis() as u64), Ordering::SeqCst);
    }

    /// From now on, a new connection waits `delay` before it is made upstream.
    pub fn delay_connects(&self, delay: Duration) {
        self.state.connect_delay_ms.store(delay.as_millis() as u64, Ordering::SeqCst);
    }

    /// Drops every connection open now, both ways.
    pub fn drop_all(&self) {
        for (client, server) in self.state.open.lock().unwrap().drain(..) {
            let _ = client.shutdown(std::net::Shutdown::Both);
            let _ = server.shutdown(std::net::Shutdown::Both);
            self.state.dropped.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// How many connections it dropped.
    pub fn dropped(&self) -> u64 {
        self.state.dropped.load(Ordering::SeqCst)
    }
}

impl Drop for SlowLink {
    fn drop(&mut self) {
        self.state.stopped.store(true, Ordering::SeqCst);
        for (client, server) in self.state.open.lock().unwrap().drain(..) {
            let _ = client.shutdown(std::net::Shutdown::Both);
            let _ = server.shutdown(std::net::Shutdown::Both);
        }
        // Wakes the accepting thread so that it sees the stop.
        let _ = TcpStream::connect(&self.address);
    }
}

/// Reads what comes from `from` and writes it to `to` once its delay has
/// passed: a reader stamps each piece with when it may go (never before the
/// piece ahead of it), a writer sends each at its time.
fn delayed_pump(mut from: TcpStream, to: TcpStream, state: &Arc<SlowState>) {
    let (tx, rx) = std::sync::mpsc::channel::<(std::time::Instant, Vec<u8>)>();
    let writer = std::thread::spawn(move || {
        let mut to = to;
        for (at, piece) in rx {
            let now = std::time::Instant::now();
            if at > now {
                std::thread::sleep(at - now);
            }
            if to.write_all(&piece).is_err() {
                break;
            }
        }
        let _ = to.shutdown(std::net::Shutdown::Write);
    });
    let mut rng = (from.local_addr().map(|a| a.port()).unwrap_or(1) as u64) << 32 | 0x2545_f491;
    let mut last = std::time::Instant::now();
    let mut buffer = [0u8; 64 * 1024];
    loop {
        match from.read(&mut buffer) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                let delay = state.delay_us.load(Ordering::SeqCst) as i64;
                let jitter = state.jitter_us.load(Ordering::SeqCst) as i64;
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                let wobble = if jitter > 0 { (rng % (2 * jitter as u64 + 1)) as i64 - jitter } else { 0 };
                let wait = Duration::from_micros((delay + wobble).max(0) as u64);
                let at = (std::time::Instant::now() + wait).max(last);
                last = at;
                if tx.send((at, buffer[..n].to_vec())).is_err() {
                    break;
                }
            }
        }
    }
    drop(tx);
    let _ = writer.join();
}
