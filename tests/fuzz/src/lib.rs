//! The properties the fuzz targets check, one module per target, and what
//! they share: how an input is cut into messages, the placeholder job id,
//! and the runtime the in-process admin runs on. The targets in
//! `fuzz_targets/` only hand libFuzzer's input to these functions, and
//! `examples/seeds.rs` writes the seed corpus with the same framing.

pub mod frame;
pub mod jobfile;
pub mod peer;
pub mod store_codec;
pub mod worker_stream;

/// Runs `future` to its end on the process's one runtime (a current-thread
/// runtime: the engine, the sessions and the checks interleave only at
/// their awaits, so a run of an input is repeatable).
pub fn block_on<F: std::future::Future>(future: F) -> F::Output {
    thread_local! {
        static RUNTIME: tokio::runtime::Runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a tokio runtime");
    }
    RUNTIME.with(|runtime| runtime.block_on(future))
}

/// Waits, at most `limit`, for `job` (canceled) to end, then removes it, so
/// that the next run starts from an empty store.
pub async fn remove_once_ended(
    engine: &jobcenter::engine::EngineHandle,
    job: jobcenter::model::JobId,
    limit: std::time::Duration,
) {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        let summary = engine.summary(job).await.expect("the engine runs").expect("the job is known");
        if summary.record.state.is_terminal() {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "the job did not end once canceled: {summary:?}");
        tokio::task::yield_now().await;
    }
    engine.remove(vec![job]).await.expect("the job is removed");
}
