//! The `jobcenter` binary: parses arguments, sets up logging, calls the library.

use std::process::ExitCode;

use clap::Parser;
use jobcenter::cli::{self, Cli, LogFormat};
use jobcenter::fate::Fatal;
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
    let filter = EnvFilter::try_from_env("JOBCENTER_LOG").unwrap_or_else(|_| EnvFilter::new("warn"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    match cli.log_format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Text => builder.init(),
    }
    match cli::main(cli) {
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
