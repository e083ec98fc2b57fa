//! Where a command keeps or reads its data: a sled data directory (the
//! embedded default), or a PostgreSQL database with `--database-url`.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;

use crate::store::{Location, PasswordSources, Store};

#[derive(clap::Args, Clone, Debug)]
pub struct StoreArgs {
    /// Where the embedded store keeps its data (without --database-url).
    #[arg(long, default_value = "jobcenter-data")]
    pub data_dir: PathBuf,
    /// Keep the data in PostgreSQL instead: postgres://USER[:PASSWORD]@HOST:PORT/DATABASE,
    /// with sslmode=disable|prefer|require|verify-ca|verify-full and sslrootcert=FILE.
    #[arg(long, env = "JOBCENTER_DATABASE_URL", hide_env_values = true)]
    pub database_url: Option<String>,
    /// A file holding the database password, when the URL gives none (else
    /// PGPASSWORD, then PGPASSFILE or ~/.pgpass).
    #[arg(long)]
    pub database_password_file: Option<PathBuf>,
}

impl StoreArgs {
    pub fn location(&self) -> Location {
        match &self.database_url {
            Some(url) => Location::Database {
                url: url.clone(),
                passwords: PasswordSources { file: self.database_password_file.clone() },
            },
            None => Location::DataDir(self.data_dir.clone()),
        }
    }

    /// Opens the store off the async threads; a refusal is one line naming the place.
    pub async fn open(&self) -> anyhow::Result<Arc<dyn Store>> {
        open(self.location()).await
    }
}

pub async fn open(location: Location) -> anyhow::Result<Arc<dyn Store>> {
    Ok(tokio::task::spawn_blocking(move || location.open()).await.context("opening the store")??)
}
