//! The gRPC port's guard: a layer before every service that judges each
//! call by its method's row in the table, answers a refusal as
//! `UNAUTHENTICATED` or `PERMISSION_DENIED` (recording a credential it
//! refused in the audit trail), and hands the caller on in the request's
//! extensions.

use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;
use std::task::{Context, Poll};

use tonic::body::Body;
use tonic::transport::server::{TcpConnectInfo, TlsConnectInfo};

use super::{table, Access, Need};
use crate::server::surface::audit::{Trail, Who};

/// The layer, for `tonic::transport::Server::layer`.
#[derive(Clone)]
pub(crate) struct Guard {
    pub(crate) access: Access,
    pub(crate) trail: Trail,
}

impl<S> tower::Layer<S> for Guard {
    type Service = Guarded<S>;

    fn layer(&self, inner: S) -> Guarded<S> {
        Guarded { inner, access: self.access.clone(), trail: self.trail.clone() }
    }
}

#[derive(Clone)]
pub(crate) struct Guarded<S> {
    inner: S,
    access: Access,
    trail: Trail,
}

/// The address a call comes from, as the connection says.
fn remote(request: &http::Request<Body>) -> Option<IpAddr> {
    let extensions = request.extensions();
    let tcp = extensions
        .get::<TcpConnectInfo>()
        .or_else(|| extensions.get::<TlsConnectInfo<TcpConnectInfo>>().map(TlsConnectInfo::get_ref));
    tcp.and_then(TcpConnectInfo::remote_addr).map(|a| a.ip())
}

/// The client certificate of a mutual TLS connection (DER), if it has one.
fn certificate(request: &http::Request<Body>) -> Option<Vec<u8>> {
    let tls = request.extensions().get::<TlsConnectInfo<TcpConnectInfo>>()?;
    tls.peer_certs()?.first().map(|c| c.to_vec())
}

impl<S> tower::Service<http::Request<Body>> for Guarded<S>
where
    S: tower::Service<http::Request<Body>, Response = http::Response<Body>> + Clone + Send + 'static,
    S::Future: Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<http::Response<Body>, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: http::Request<Body>) -> Self::Future {
        // The service made ready is the one that takes the call.
        let ready = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, ready);
        let (access, trail) = (self.access.clone(), self.trail.clone());
        Box::pin(async move {
            let Need::Any(needed) = table::grpc(request.uri().path()) else {
                return inner.call(request).await;
            };
            let authorization =
                request.headers().get("authorization").and_then(|v| v.to_str().ok()).map(str::to_string);
            let certificate = certificate(&request);
            let from = remote(&request);
            match access.judge_call(needed, authorization.as_deref(), certificate.as_deref(), from).await {
                Ok(caller) => {
                    request.extensions_mut().insert(Who::of(&caller, from));
                    inner.call(request).await
                }
                Err(refusal) => {
                    if authorization.is_some() || certificate.is_some() {
                        let record = trail.begin(&Who::refused(&refusal, from), "access.refused", request.uri().path());
                        trail.write(record.ended(refusal.to_string())).await;
                    }
                    Ok(refusal.status().into_http())
                }
            }
        })
    }
}
