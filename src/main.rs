//! The `jobcenter` binary: parses arguments, sets up logging, calls the library.

use std::process::ExitCode;

use clap::Parser;
use jobcenter::cli::{self, Cli, LogFormat};
use tracing_subscriber::EnvFilter;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let filter = EnvFilter::try_from_env("JOBCENTER_LOG").unwrap_or_else(|_| EnvFilter::new("warn"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    match cli.log_format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Text => builder.init(),
    }
    cli::main(cli)
}
