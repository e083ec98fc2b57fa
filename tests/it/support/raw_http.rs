//! One HTTP/1.1 request over a plain TCP stream, with any method, headers
//! and body, and its answer whole: what the tests of the HTTP API send when
//! they need what a client library would tidy away (a method no route
//! serves, a body without a content type, bytes that are not UTF-8).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

/// An answer: its status, its headers (names in lowercase) and its body.
pub struct Answer {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Answer {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }

    /// The body as JSON; panics, showing it, when it is not.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body)
            .unwrap_or_else(|e| panic!("a {} answer that is not JSON ({e}): {}", self.status, self.body))
    }
}

pub fn request(address: &str, method: &str, path: &str, headers: &[(&str, &str)], body: Option<&str>) -> Answer {
    let mut stream = TcpStream::connect(address).expect("connect to the server");
    stream.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut head = format!("{method} {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n");
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    let body = body.unwrap_or("");
    head.push_str(&format!("Content-Length: {}\r\n\r\n{body}", body.len()));
    stream.write_all(head.as_bytes()).unwrap();
    let mut response = Vec::new();
    stream.read_to_end(&mut response).unwrap();
    let response = String::from_utf8(response).expect("a UTF-8 answer");
    let (head, body) = response.split_once("\r\n\r\n").expect("a head and a body");
    let mut lines = head.lines();
    let status = lines.next().and_then(|l| l.split_whitespace().nth(1)).and_then(|s| s.parse().ok()).expect("a status");
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(name, value)| (name.trim().to_ascii_lowercase(), value.trim().to_string()))
        .collect();
    let chunked = headers.iter().any(|(n, v)| n == "transfer-encoding" && v == "chunked");
    let body = if chunked { dechunk(body) } else { body.to_string() };
    Answer { status, headers, body }
}

fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let size = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if size == 0 {
            break;
        }
        out.push_str(&rest[..size]);
        body = &rest[size + 2..];
    }
    out
}
