//! Traces over OTLP (`--otlp-endpoint`): spans go to a collector over gRPC,
//! in batches, from a bounded queue that drops what does not fit, on a
//! thread and a small runtime of their own, so that a collector that does
//! not answer slows neither the engine nor a worker. An attempt's span
//! reaches the worker that runs it as a W3C `traceparent` (the label
//! `wire::TRACEPARENT_LABEL` of the work order), and the worker's execution
//! span joins it as its child.
//!
//! Every span of the project is made at [`TARGET`]. Only the layer of
//! [`Export::layer`] takes that target (`main` keeps it from the log
//! lines): without an endpoint those callsites are disabled, and a span
//! there costs a check and allocates nothing.

use std::collections::HashMap;
use std::time::Duration;

use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{BatchConfigBuilder, BatchSpanProcessor, SdkTracerProvider};
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::filter::Targets;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::Layer;

/// The target of every span the project makes for the export: no module's
/// path, so that filtering it touches no log line.
pub const TARGET: &str = "jobcenter_traces";

/// Spans waiting for the export at most; past them new ones are dropped.
const QUEUE: usize = 8192;
/// Spans in one export request at most.
const BATCH: usize = 512;
/// How often the queue is sent when it does not fill a batch sooner.
const EVERY: Duration = Duration::from_secs(2);
/// One export request gives up after this long.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot start the trace export's runtime: {0}")]
    Runtime(std::io::Error),
    #[error("--otlp-endpoint {endpoint:?}: {message}")]
    Endpoint { endpoint: String, message: String },
}

/// The export of this process's spans to one OTLP endpoint.
pub struct Export {
    provider: SdkTracerProvider,
    /// Where the gRPC channel to the endpoint runs: never the runtime of
    /// the server or the worker.
    runtime: tokio::runtime::Runtime,
}

impl Export {
    /// Starts the export to `endpoint` (`http://HOST:PORT`, OTLP over gRPC)
    /// as `service` (the resource's `service.name`). It connects lazily: an
    /// endpoint that does not answer is no error here, and its spans are
    /// dropped.
    pub fn start(endpoint: &str, service: &'static str) -> Result<Export, Error> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("jobcenter-otlp")
            .enable_all()
            .build()
            .map_err(Error::Runtime)?;
        // The channel's background task is spawned on that runtime.
        let exporter = {
            let _inside = runtime.enter();
            opentelemetry_otlp::SpanExporter::builder()
                .with_tonic()
                .with_endpoint(endpoint)
                .with_timeout(EXPORT_TIMEOUT)
                .build()
                .map_err(|e| Error::Endpoint { endpoint: endpoint.to_string(), message: e.to_string() })?
        };
        let batches = BatchConfigBuilder::default()
            .with_max_queue_size(QUEUE)
            .with_max_export_batch_size(BATCH)
            .with_scheduled_delay(EVERY)
            .build();
        let provider = SdkTracerProvider::builder()
            .with_span_processor(BatchSpanProcessor::builder(exporter).with_batch_config(batches).build())
            .with_resource(opentelemetry_sdk::Resource::builder().with_service_name(service).build())
            .build();
        Ok(Export { provider, runtime })
    }

    /// The layer that hands the spans at [`TARGET`] to the export.
    pub fn layer<S>(&self) -> impl Layer<S> + Send + Sync + 'static
    where
        S: tracing::Subscriber + for<'span> LookupSpan<'span> + Send + Sync,
    {
        tracing_opentelemetry::layer()
            .with_tracer(self.provider.tracer("jobcenter"))
            .with_tracked_inactivity(false)
            .with_threads(false)
            .with_location(false)
            .with_target(false)
            .with_filter(Targets::new().with_target(TARGET, tracing::Level::INFO))
    }

    /// Sends what is pending, waiting `within` at most, and stops the export.
    pub fn shutdown(self, within: Duration) {
        if let Err(e) = self.provider.shutdown_with_timeout(within) {
            tracing::warn!(error = %e, "the last spans may not have reached the trace endpoint");
        }
        self.runtime.shutdown_background();
    }
}

/// The W3C `traceparent` of `span`, when its trace is exported.
pub(crate) fn traceparent(span: &tracing::Span) -> Option<String> {
    if span.is_disabled() {
        return None;
    }
    let mut carrier: HashMap<String, String> = HashMap::with_capacity(1);
    TraceContextPropagator::new().inject_context(&span.context(), &mut carrier);
    carrier.remove("traceparent")
}

/// Makes `span` a child of the span a `traceparent` names, before it starts.
/// A malformed one leaves `span` a root.
pub(crate) fn join(span: &tracing::Span, traceparent: &str) {
    if span.is_disabled() {
        return;
    }
    let carrier = HashMap::from([("traceparent".to_string(), traceparent.to_string())]);
    let parent = TraceContextPropagator::new().extract(&carrier);
    let _ = span.set_parent(parent);
}
