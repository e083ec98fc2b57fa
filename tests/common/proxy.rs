//! A TCP proxy on loopback that a test can freeze: while frozen it moves no
//! byte either way but keeps every connection open, as a stalled network
//! path does (no reset, no close).

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
