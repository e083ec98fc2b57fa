//! `jobcenter backup` on a running server: a consistent copy in the format
//! of `jobcenter export`, streamed to the client in chunks, for `jobcenter
//! restore` to bring back into an empty data directory or database.
//!
//! Consistent means: the jobs this instance leads are copied from the
//! engine as of one step, answered once that step is durable, so each is
//! whole and all are of the same moment; an ended job cannot change, so it
//! is read from the store as it is; a job created after that moment is
//! left out; a job led elsewhere (another instance) or retried since is
//! copied whole as its leader holds it. Settings come last.

use std::collections::BTreeMap;
use std::io::Write;

use tonic::Status;

use crate::engine::EngineHandle;
use crate::model::JobId;
use crate::proto::api;
use crate::store::transfer::ExportWriter;
use crate::store::JobFilter;

/// How much of the copy one message carries.
const CHUNK_BYTES: usize = 1024 * 1024;

type Chunks = tokio::sync::mpsc::Sender<Result<api::BackupChunk, Status>>;

/// Sends what is written as chunks of the stream.
struct ChunkWriter {
    buffer: Vec<u8>,
    chunks: Chunks,
}

impl Write for ChunkWriter {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.buffer.extend_from_slice(bytes);
        if self.buffer.len() >= CHUNK_BYTES {
            let data = std::mem::replace(&mut self.buffer, Vec::with_capacity(CHUNK_BYTES + 64 * 1024));
            self.chunks
                .blocking_send(Ok(api::BackupChunk { data, summary: None }))
                .map_err(|_| std::io::Error::new(std::io::ErrorKind::BrokenPipe, "the client went away"))?;
        }
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Starts the copy; its chunks come through the returned stream.
pub(super) fn stream(engine: EngineHandle) -> tokio_stream::wrappers::ReceiverStream<Result<api::BackupChunk, Status>> {
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    let runtime = tokio::runtime::Handle::current();
    tokio::task::spawn_blocking(move || {
        let mut out = ChunkWriter { buffer: Vec::with_capacity(CHUNK_BYTES + 64 * 1024), chunks: tx.clone() };
        match copy(&engine, &runtime, &mut out) {
            Ok(summary) => {
                let last = api::BackupChunk { data: std::mem::take(&mut out.buffer), summary: Some(summary) };
                let _ = tx.blocking_send(Ok(last));
            }
            Err(e) => {
                tracing::warn!(error = %e, "backup failed");
                let _ = tx.blocking_send(Err(Status::unavailable(format!("the backup failed: {e}"))));
            }
        }
    });
    tokio_stream::wrappers::ReceiverStream::new(rx)
}

/// Why a copy stopped.
#[derive(Debug, thiserror::Error)]
enum CopyError {
    #[error(transparent)]
    Engine(#[from] crate::engine::Error),
    #[error(transparent)]
    Store(#[from] crate::store::Error),
    #[error(transparent)]
    Transfer(#[from] crate::store::transfer::TransferError),
}

fn copy(
    engine: &EngineHandle,
    runtime: &tokio::runtime::Handle,
    out: &mut dyn Write,
) -> Result<api::BackupSummary, CopyError> {
    let (taken_at, led) = runtime.block_on(engine.snapshot())?;
    let mut led: BTreeMap<JobId, _> = led.into_iter().map(|job| (job.record.id, job)).collect();
    let store = engine.store().clone();
    let mut records = store.list_jobs(&JobFilter::default())?;
    records.reverse();
    let mut writer = ExportWriter::start(out)?;
    for record in records {
        if let Some(job) = led.remove(&record.id) {
            writer.job(&job)?;
        } else if record.created_at > taken_at {
            // Created after the moment of the copy.
        } else if record.state.is_terminal() {
            match store.get_job(record.id)? {
                Some(job) if job.record.state.is_terminal() => writer.job(&job)?,
                // Retried since it was listed: as its leader holds it now.
                Some(_) => {
                    if let Some(job) = runtime.block_on(engine.job(record.id))? {
                        writer.job(&job)?;
                    }
                }
                // Removed since (retention).
                None => {}
            }
        } else if let Some(job) = runtime.block_on(engine.job(record.id))? {
            writer.job(&job)?;
        }
    }
    // Led here and not listed yet (none expected: a job is stored before it runs).
    for job in led.into_values() {
        writer.job(&job)?;
    }
    let summary = writer.finish(store.settings("")?)?;
    Ok(api::BackupSummary {
        jobs: summary.jobs as u64,
        tasks: summary.tasks as u64,
        settings: summary.settings as u64,
        taken_at_ms: taken_at.as_millis(),
    })
}
