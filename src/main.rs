//! The `jobcenter` binary: parses arguments, sets up logging and the trace
//! export, calls the library.

use std::process::ExitCode;

use clap::Parser;
use jobcenter::cli::{self, Cli, LogFormat};
use jobcenter::fate::Fatal;
use jobcenter::traces::{self, Export};
use tracing_subscriber::EnvFilter;

/// jemalloc returns the pages it frees to the system within seconds, where
/// the C library's allocator keeps a passing peak (a compaction's two
/// databases) in each thread's arena for good. Its options (a background
/// thread that does so about a second after their last use) are built in
/// by `.cargo/config.toml`.
#[cfg(all(not(target_env = "msvc"), feature = "jemalloc"))]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// Output piped into a reader that stops early (`jobcenter jobs | head`) is
/// not an error: the process ends quietly, as the shell expects (128 + SIGPIPE).
fn quiet_on_closed_stdout() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let message = info
            .payload()
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| info.payload().downcast_ref::<&str>().copied())
            .unwrap_or("");
        if message.starts_with("failed printing to stdout") && message.contains("Broken pipe") {
            std::process::exit(141);
        }
        default(info);
    }));
}

fn main() -> ExitCode {
    quiet_on_closed_stdout();
    let cli = Cli::parse();
    let export = match cli.otlp_endpoint().map(|(endpoint, service)| Export::start(endpoint, service)).transpose() {
        Ok(export) => export,
        Err(e) => {
            eprintln!("jobcenter: {e}");
            return ExitCode::from(cli::EXIT_USAGE);
        }
    };
    set_up_logging(cli.log_format, export.as_ref());
    let result = cli::main(cli);
    if let Some(export) = export {
        export.shutdown(FLUSH_SPANS_WITHIN);
    }
    match result {
        Ok(code) => code,
        Err(fatal @ Fatal::Store(_)) => {
            eprintln!("jobcenter: {fatal}");
            ExitCode::from(EXIT_STORE_FAILED)
        }
        Err(fatal @ Fatal::Deactivated) => {
            eprintln!("jobcenter: {fatal}");
            start_over()
        }
        Err(fatal @ Fatal::Engine(_)) => {
            eprintln!("jobcenter: {fatal}");
            ExitCode::from(EXIT_SOFTWARE)
        }
    }
}

/// Log lines to stderr, filtered by `JOBCENTER_LOG`, in colour only on a
/// terminal (a log file gets no escape codes); with an export, the spans at
/// `traces::TARGET` go to it, and never to the log lines.
fn set_up_logging(format: LogFormat, export: Option<&Export>) {
    use tracing_subscriber::prelude::*;
    let filter = EnvFilter::try_from_env("JOBCENTER_LOG").unwrap_or_else(|_| EnvFilter::new("warn"));
    let filter = match format!("{}=off", traces::TARGET).parse() {
        Ok(spans_off) => filter.add_directive(spans_off),
        Err(_) => filter,
    };
    let on_terminal = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let lines = tracing_subscriber::fmt::layer().with_writer(std::io::stderr).with_ansi(on_terminal);
    let lines = match format {
        LogFormat::Json => lines.json().boxed(),
        LogFormat::Text => lines.boxed(),
    };
    tracing_subscriber::registry().with(lines.with_filter(filter)).with(export.map(Export::layer)).init();
}

/// How long the spans still queued at the end may take to leave.
const FLUSH_SPANS_WITHIN: std::time::Duration = std::time::Duration::from_secs(5);

/// The engine's loop panicked (sysexits' EX_SOFTWARE).
const EXIT_SOFTWARE: u8 = 70;
/// A store write failed for good (sysexits' EX_IOERR).
const EXIT_STORE_FAILED: u8 = 74;
/// Deactivated, and told not to start over (sysexits' EX_TEMPFAIL).
const EXIT_DEACTIVATED: u8 = 75;

/// Starts this process over as a new instance after it was deactivated:
/// the same program with the same arguments, replacing this one (its
/// sockets close on exec). Nothing of the deactivated instance survives;
/// `JOBCENTER_NO_RESTART` makes it exit with code 75 instead.
fn start_over() -> ExitCode {
    use std::os::unix::process::CommandExt;
    if std::env::var_os("JOBCENTER_NO_RESTART").is_none() {
        if let Ok(program) = std::env::current_exe() {
            let error = std::process::Command::new(program).args(std::env::args_os().skip(1)).exec();
            eprintln!("jobcenter: cannot start over ({error}); exiting");
        }
    }
    ExitCode::from(EXIT_DEACTIVATED)
}
