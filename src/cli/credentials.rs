//! `jobcenter credentials`: named tokens for a server's `--credentials`
//! file, each with its role; a new token is shown once, and only its hash
//! is kept.
#![allow(clippy::print_stdout)]

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Subcommand};

use super::EXIT_USAGE;
use crate::server::surface::access::{credentials, Role};

#[derive(Args, Debug)]
pub struct CredentialsArgs {
    #[command(subcommand)]
    pub action: Action,
}

#[derive(Subcommand, Debug)]
pub enum Action {
    /// Make a token named NAME with a role, add its hash to the file and
    /// print the token (once: the file keeps only its hash). A running
    /// server reads the file again by itself.
    Add {
        /// The credential's name: letters, digits, '-' and '_', up to 64.
        name: String,
        /// viewer, operator, worker, instance or admin.
        #[arg(long, value_parser = |text: &str| text.parse::<Role>())]
        role: Role,
        /// The credentials file (TOML, or YAML by its name), made when missing.
        #[arg(long, env = "JOBCENTER_CREDENTIALS")]
        file: PathBuf,
    },
}

pub(super) fn run(args: CredentialsArgs) -> ExitCode {
    match args.action {
        Action::Add { name, role, file } => match credentials::add(&file, &name, role) {
            Ok(token) => {
                println!("{token}");
                eprintln!("jobcenter: added {name} ({role}) to {}; the token above is not shown again", file.display());
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("jobcenter credentials: {e}");
                ExitCode::from(EXIT_USAGE)
            }
        },
    }
}
