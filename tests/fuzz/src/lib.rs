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
