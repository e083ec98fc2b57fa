//! One delivery: an event's JSON POSTed to an endpoint over HTTP/1.1 (hyper,
//! with rustls and the system's roots for https), within bounded timeouts,
//! with its idempotency key, its kind and, with a secret, its HMAC-SHA256
//! signature.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;

use super::file::Endpoint;
use crate::model::notify::Event;

/// The headers of a delivery.
pub(crate) const IDEMPOTENCY_KEY: &str = "Idempotency-Key";
pub(crate) const EVENT_KIND: &str = "X-Jobcenter-Event";
pub(crate) const SIGNATURE: &str = "X-Jobcenter-Signature";

/// How long a connection (TCP and TLS) may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a whole delivery may take, its answer read.
const DELIVERY_TIMEOUT: Duration = Duration::from_secs(10);
/// At most this much of an answer is read.
const MOST_ANSWER_BYTES: usize = 64 * 1024;

/// `sha256=HEX`: the HMAC-SHA256 of `body` under `secret`.
pub(crate) fn signature(secret: &[u8], body: &[u8]) -> String {
    use hmac::{Hmac, Mac};
    let mut mac = Hmac::<sha2::Sha256>::new_from_slice(secret).expect("HMAC takes a key of any length");
    mac.update(body);
    format!("sha256={}", crate::model::hex(&mac.finalize().into_bytes()))
}

/// The request of one delivery of `event`.
pub(crate) fn request(endpoint: &Endpoint, event: &Event) -> http::Request<Full<Bytes>> {
    let body = event.body();
    let mut request = http::Request::post(endpoint.target.path.as_str())
        .header(http::header::HOST, endpoint.target.authority())
        .header(http::header::CONTENT_TYPE, "application/json")
        .header(http::header::USER_AGENT, concat!("jobcenter/", env!("CARGO_PKG_VERSION")))
        .header(IDEMPOTENCY_KEY, event.id.to_string())
        .header(EVENT_KIND, event.kind.as_str());
    if let Some(secret) = &endpoint.secret {
        request = request.header(SIGNATURE, signature(secret.bytes(), &body));
    }
    request.body(Full::new(Bytes::from(body))).expect("a delivery's request is well formed")
}

/// Delivers `event` to `endpoint`: `Ok` on a 2xx answer, else why not (no
/// secret in it).
pub(crate) async fn deliver(endpoint: &Endpoint, event: &Event) -> Result<(), String> {
    let request = request(endpoint, event);
    match tokio::time::timeout(DELIVERY_TIMEOUT, send(endpoint, request)).await {
        Ok(Ok(status)) if status.is_success() => Ok(()),
        Ok(Ok(status)) => Err(format!("answered {status}")),
        Ok(Err(e)) => Err(e),
        Err(_) => Err(format!("no answer within {} s", DELIVERY_TIMEOUT.as_secs())),
    }
}

async fn send(endpoint: &Endpoint, request: http::Request<Full<Bytes>>) -> Result<http::StatusCode, String> {
    let target = &endpoint.target;
    let connect = tokio::net::TcpStream::connect((target.host.as_str(), target.port));
    let stream = tokio::time::timeout(CONNECT_TIMEOUT, connect)
        .await
        .map_err(|_| format!("no connection within {} s", CONNECT_TIMEOUT.as_secs()))?
        .map_err(|e| format!("connecting: {e}"))?;
    let _ = stream.set_nodelay(true);
    if !target.https {
        return exchange(TokioIo::new(stream), request).await;
    }
    let name = rustls::pki_types::ServerName::try_from(target.host.clone()).map_err(|e| format!("tls: {e}"))?;
    let connector = tokio_rustls::TlsConnector::from(tls_config()?);
    let stream = tokio::time::timeout(CONNECT_TIMEOUT, connector.connect(name, stream))
        .await
        .map_err(|_| format!("no TLS handshake within {} s", CONNECT_TIMEOUT.as_secs()))?
        .map_err(|e| format!("tls: {e}"))?;
    exchange(TokioIo::new(stream), request).await
}

async fn exchange<S>(io: TokioIo<S>, request: http::Request<Full<Bytes>>) -> Result<http::StatusCode, String>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static,
{
    let (mut sender, connection) = hyper::client::conn::http1::handshake(io).await.map_err(|e| format!("http: {e}"))?;
    // The connection runs beside the exchange, and ends with it however it
    // ends: answered, failed, or dropped at the delivery's timeout.
    let _connection = tokio_util::task::AbortOnDropHandle::new(tokio::spawn(connection));
    let answer = async {
        let response = sender.send_request(request).await.map_err(|e| format!("http: {e}"))?;
        let status = response.status();
        // Read (a bounded part of) the answer, so that the endpoint sees it taken.
        let mut body = response.into_body();
        let mut read = 0;
        while let Some(frame) = body.frame().await {
            let Ok(frame) = frame else { break };
            read += frame.data_ref().map_or(0, |d| d.len());
            if read > MOST_ANSWER_BYTES {
                break;
            }
        }
        Ok(status)
    }
    .await;
    answer
}

/// The TLS settings of https endpoints: the system's roots, loaded once.
fn tls_config() -> Result<Arc<rustls::ClientConfig>, String> {
    static CONFIG: OnceLock<Result<Arc<rustls::ClientConfig>, String>> = OnceLock::new();
    CONFIG
        .get_or_init(|| {
            let mut roots = rustls::RootCertStore::empty();
            let found = rustls_native_certs::load_native_certs();
            for cert in found.certs {
                let _ = roots.add(cert);
            }
            if roots.is_empty() {
                return Err("tls: the system holds no root certificate".into());
            }
            let provider = Arc::new(rustls::crypto::ring::default_provider());
            let config = rustls::ClientConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()
                .map_err(|e| format!("tls: {e}"))?
                .with_root_certificates(roots)
                .with_no_client_auth();
            Ok(Arc::new(config))
        })
        .clone()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::notify::{Kind, Routes};
    use crate::server::notify::file;

    #[test]
    fn the_signature_is_the_hmac_sha256_of_the_body() {
        // RFC 4231, test case 2.
        assert_eq!(
            signature(b"Jefe", b"what do ya want for nothing?"),
            "sha256=5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }

    #[test]
    fn a_request_carries_its_key_kind_and_signature_and_the_same_bytes_every_time() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("k"), "key").unwrap();
        let text = "[[endpoint]]\nname = \"ops\"\nurl = \"http://127.0.0.1:9/hook\"\nevents = [\"worker.lost\"]\nsecret_file = \"k\"\n";
        let config = file::parse(&dir.path().join("n.toml"), text).unwrap();
        let endpoint = &config.endpoints[0];
        let routes = Routes::new([("ops", &[Kind::WorkerLost][..])]);
        let event = Event::new(uuid::Uuid::now_v7(), Kind::WorkerLost, 1, serde_json::json!({"worker": "w1"}), &routes)
            .unwrap();
        let one = request(endpoint, &event);
        assert_eq!(one.uri().path(), "/hook");
        assert_eq!(one.headers()[IDEMPOTENCY_KEY], event.id.to_string());
        assert_eq!(one.headers()[EVENT_KIND], "worker.lost");
        assert_eq!(one.headers()[http::header::HOST], "127.0.0.1:9");
        assert_eq!(one.headers()[SIGNATURE], signature(b"key", &event.body()).as_str());
        assert_eq!(request(endpoint, &event).headers()[SIGNATURE], one.headers()[SIGNATURE]);
    }
}
