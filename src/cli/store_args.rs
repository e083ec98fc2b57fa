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
    /// Room the data directory's disk keeps free (without --database-url):
    /// a write that would leave less waits until there is room, and
    /// nothing is acknowledged meanwhile. 512, 64KiB, 64MiB, 1GiB; 0 never waits.
    #[arg(long, default_value = "64MiB", value_parser = parse_size)]
    pub min_free_space: u64,
}

/// A size in bytes: a number, with KiB, MiB, GiB or TiB (or K, M, G, T) after it.
pub(super) fn parse_size(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let split = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: u64 = number.parse().map_err(|_| format!("{text:?} is not a size such as 512, 64MiB or 1GiB"))?;
    let shift = match unit.trim() {
        "" | "B" => 0,
        "K" | "KiB" => 10,
        "M" | "MiB" => 20,
        "G" | "GiB" => 30,
        "T" | "TiB" => 40,
        other => return Err(format!("{text:?}: unknown unit {other:?}; use KiB, MiB, GiB or TiB")),
    };
    number.checked_mul(1u64 << shift).ok_or_else(|| format!("{text:?} is too large"))
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
        let (location, keep) = (self.location(), self.min_free_space);
        Ok(tokio::task::spawn_blocking(move || location.open_keeping(keep)).await.context("opening the store")??)
    }
}

pub(super) async fn open(location: Location) -> anyhow::Result<Arc<dyn Store>> {
    Ok(tokio::task::spawn_blocking(move || location.open()).await.context("opening the store")??)
}

#[cfg(test)]
mod tests {
    use super::parse_size;

    #[test]
    fn parses_sizes() {
        assert_eq!(parse_size("512"), Ok(512));
        assert_eq!(parse_size("64MiB"), Ok(64 << 20));
        assert_eq!(parse_size("1G"), Ok(1 << 30));
        assert_eq!(parse_size("0"), Ok(0));
        assert!(parse_size("64MB").is_err());
        assert!(parse_size("lots").is_err());
        assert!(parse_size("99999999999TiB").is_err());
    }
}
