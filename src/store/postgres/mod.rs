//! The PostgreSQL store: the same promises as the embedded one, on a
//! database that several admin instances can share.
//!
//! A flush is one transaction holding every batch written since the last
//! one (group commit); nothing is acknowledged before its `COMMIT` returns,
//! with `synchronous_commit` on. Every write is an upsert of whole records,
//! so a flush that failed because the connection broke is simply run again
//! once the database is back: whether its commit had landed or not, the
//! result is the same. Readers use `REPEATABLE READ` transactions, so a read
//! never sees half of a flush.
//!
//! The schema lives in the `jobcenter` schema and is created and upgraded by
//! versioned migrations (`migrations/`) at start, in one transaction, under
//! an advisory lock (several admins may start at once). Only this module
//! names the database driver.

mod cluster;
mod connect;
mod news;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use deadpool_postgres::{HookError, ManagerConfig, RecyclingMethod};
use tokio_postgres::error::SqlState;
use tokio_postgres::types::ToSql;
use tokio_postgres::IsolationLevel;
use uuid::Uuid;

pub(super) use self::connect::Target;
pub use self::connect::{PasswordSources, TlsMode};
use super::codec::{self, decode_job, decode_spec, encode, encode_spec};
use super::{Batch, Error, JobFilter, Store, StoredJob};
use crate::model::{JobId, JobRecord, TaskRecord};

refinery::embed_migrations!("src/store/postgres/migrations");

/// The table refinery keeps its history in.
const HISTORY_TABLE: &str = "jobcenter.schema_history";
/// Serializes migrations between admins that start at once.
const MIGRATION_LOCK: i64 = 0x6a6f_6263_656e_7472;
/// Rows per statement when a flush writes many (a million-task failure).
const ROWS_PER_STATEMENT: usize = 20_000;
/// Reader connections. The one returned last is taken first, so that light
/// traffic keeps to few sessions (their caches warm, their statistics
/// reported as they go) instead of passing through all of them in turn.
const POOL_SIZE: usize = 8;
/// The SQLSTATE `jobcenter.fence` raises for a deactivated instance.
const FENCED: &str = "JCF01";

pub struct PgStore {
    target: Target,
    /// The store's own runtime: its connections live here, whatever runtime
    /// (or none) the callers of the blocking `Store` methods run on.
    runtime: Option<tokio::runtime::Runtime>,
    pool: deadpool_postgres::Pool,
    /// The committer's connection, opened again after it broke.
    writer: tokio::sync::Mutex<Option<Writer>>,
    /// Batches written and not yet flushed, kept until their commit lands.
    pending: Mutex<Vec<Batch>>,
    /// This process as a registered instance; its writes are fenced by it.
    me: std::sync::OnceLock<Uuid>,
    /// What the instance's permit settlements left in the database, per key.
    permit_memory: Mutex<std::collections::HashMap<String, cluster::Remembered>>,
    /// What the instance hears of the others' permits, once registered.
    permit_news: std::sync::OnceLock<crate::store::cluster::PermitNews>,
}

impl Drop for PgStore {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

impl PgStore {
    /// Connects, creates or upgrades the schema, and checks that it is
    /// jobcenter's and not newer than this build. Every refusal is one line
    /// naming the database (never its password) and what to do.
    pub fn open(url: &str, passwords: &PasswordSources) -> Result<PgStore, Error> {
        let target = Target::parse(url, passwords).map_err(Error::BadUrl)?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("jobcenter-db")
            .enable_all()
            .build()
            .map_err(|e| Error::Io(format!("cannot start the database runtime: {e}")))?;
        let (pool, writer) = block_on(&runtime, async {
            let mut client = target.connect().await.map_err(|e| connect_error(&target, &e))?;
            migrate(&target, &mut client).await?;
            let manager = deadpool_postgres::Manager::from_config(
                target.config.clone(),
                target.tls.clone(),
                ManagerConfig { recycling_method: RecyclingMethod::Fast },
            );
            let pool = deadpool_postgres::Pool::builder(manager)
                .max_size(POOL_SIZE)
                .queue_mode(deadpool_postgres::QueueMode::Lifo)
                .post_create(deadpool_postgres::Hook::async_fn(|client, _| {
                    Box::pin(
                        async move { client.batch_execute(connect::SESSION_SETUP).await.map_err(HookError::Backend) },
                    )
                }))
                .build()
                .map_err(|e| Error::Io(format!("cannot set up the connection pool: {e}")))?;
            drop(client);
            let writer = Writer::connect(&target).await.map_err(|e| connect_error(&target, &e))?;
            Ok::<_, Error>((pool, writer))
        })?;
        tracing::info!(database = %target.display, tls = ?target.mode, "database store open");
        Ok(PgStore {
            target,
            runtime: Some(runtime),
            pool,
            writer: tokio::sync::Mutex::new(Some(writer)),
            pending: Mutex::new(Vec::new()),
            me: std::sync::OnceLock::new(),
            permit_memory: Mutex::default(),
            permit_news: std::sync::OnceLock::new(),
        })
    }

    /// The database, as messages name it: no password.
    pub fn display(&self) -> &str {
        &self.target.display
    }

    fn block_on<T: Send>(&self, future: impl std::future::Future<Output = T> + Send) -> T {
        block_on(self.runtime.as_ref().expect("the runtime lives as long as the store"), future)
    }

    fn error(&self, e: &tokio_postgres::Error) -> Error {
        classify(&self.target, e)
    }

    async fn reader(&self) -> Result<Reader, Error> {
        self.pool.get().await.map(Reader).map_err(|e| match e {
            deadpool_postgres::PoolError::Backend(e) => self.error(&e),
            other => Error::Unavailable { database: self.target.display.clone(), detail: other.to_string() },
        })
    }

    async fn read_jobs(
        &self,
        client: &deadpool_postgres::Transaction<'_>,
        records: Vec<JobRecord>,
    ) -> Result<Vec<StoredJob>, Error> {
        if records.is_empty() {
            return Ok(Vec::new());
        }
        let ids: Vec<Uuid> = records.iter().map(|r| r.id.0).collect();
        let mut chunks: HashMap<Uuid, Vec<Vec<u8>>> = HashMap::new();
        let rows = client
            .query(
                "SELECT job_id, data FROM jobcenter.job_specs WHERE job_id = ANY($1) ORDER BY job_id, chunk",
                &[&ids],
            )
            .await
            .map_err(|e| self.error(&e))?;
        for row in rows {
            chunks.entry(row.get(0)).or_default().push(row.get(1));
        }
        let mut tasks: HashMap<Uuid, Vec<(u32, TaskRecord)>> = HashMap::new();
        let rows = client
            .query("SELECT job_id, idx, record FROM jobcenter.tasks WHERE job_id = ANY($1)", &[&ids])
            .await
            .map_err(|e| self.error(&e))?;
        for row in rows {
            let idx: i32 = row.get(1);
            let bytes: &[u8] = row.get(2);
            let record: TaskRecord = codec::decode(bytes, "task record").map_err(|d| self.corrupt(d))?;
            tasks.entry(row.get(0)).or_default().push((idx as u32, record));
        }
        let mut out = Vec::with_capacity(records.len());
        for record in records {
            let spec_chunks = chunks.remove(&record.id.0).unwrap_or_default();
            let spec = decode_spec(&spec_chunks).map_err(|d| self.corrupt(format!("job {}: {d}", record.id)))?;
            let stored = tasks.remove(&record.id.0).unwrap_or_default();
            out.push(StoredJob::assemble(record, Arc::new(spec), stored));
        }
        Ok(out)
    }

    fn corrupt(&self, detail: impl Into<String>) -> Error {
        Error::Database { database: self.target.display.clone(), detail: detail.into() }
    }

    async fn commit(&self, batch: &Merged) -> Result<(), Error> {
        let mut writer = self.writer.lock().await;
        if writer.is_none() {
            *writer = Some(Writer::connect(&self.target).await.map_err(|e| self.error(&e))?);
        }
        let connection = writer.as_mut().expect("connected");
        let result = write_transaction(connection, batch, self.me.get().copied()).await;
        if result.is_err() {
            // Whatever state the pipeline left the session in, start afresh.
            *writer = None;
        }
        result.map_err(|e| self.error(&e))
    }
}

/// Runs `future` on the store's runtime and waits for it. Callers are
/// blocking code (the committer thread, `spawn_blocking`); one called from
/// inside a runtime is served from a thread of its own.
fn block_on<T: Send>(runtime: &tokio::runtime::Runtime, future: impl std::future::Future<Output = T> + Send) -> T {
    if tokio::runtime::Handle::try_current().is_ok() {
        std::thread::scope(|scope| scope.spawn(|| runtime.block_on(future)).join().expect("database call"))
    } else {
        runtime.block_on(future)
    }
}

/// Where a database server listens.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ServerAddress {
    Tcp(String, u16),
    /// The socket file itself (`DIR/.s.PGSQL.PORT`).
    Unix(std::path::PathBuf),
}

/// `url` with `127.0.0.1:port` as its server: its user, password (`user`
/// and `password` when it names none), database and settings kept, its
/// hosts and ports dropped.
fn url_via(url: &str, user: &str, password: Option<&[u8]>, port: u16) -> String {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let (base, query) = rest.split_once('?').unwrap_or((rest, ""));
    let (authority, database) = base.split_once('/').unwrap_or((base, ""));
    let mut userinfo = authority.rsplit_once('@').map(|(userinfo, _)| userinfo.to_string());
    if userinfo.as_deref().is_none_or(|u| !u.contains(':')) {
        if let Some(password) = password {
            let user = userinfo.unwrap_or_else(|| percent_encode(user.as_bytes()));
            userinfo = Some(format!("{user}:{}", percent_encode(password)));
        }
    }
    let kept: Vec<&str> = query
        .split('&')
        .filter(|pair| {
            !pair.is_empty() && !["host", "hostaddr", "port"].contains(&pair.split('=').next().unwrap_or(""))
        })
        .collect();
    let userinfo = userinfo.map(|u| format!("{u}@")).unwrap_or_default();
    let mut url = format!("postgres://{userinfo}127.0.0.1:{port}/{database}");
    if !kept.is_empty() {
        url = format!("{url}?{}", kept.join("&"));
    }
    url
}

fn percent_encode(bytes: &[u8]) -> String {
    bytes
        .iter()
        .map(|&b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => char::from(b).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// A fresh database beside the one `url` names, dropped again by `drop`:
/// for benchmarks, which must not write into a database that holds data.
pub struct ScratchDatabase {
    admin: Target,
    runtime: tokio::runtime::Runtime,
    name: String,
    url: String,
}

impl ScratchDatabase {
    pub fn create(url: &str, passwords: &PasswordSources) -> Result<ScratchDatabase, Error> {
        let admin = Target::parse(url, passwords).map_err(Error::BadUrl)?;
        let runtime =
            tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| Error::Io(e.to_string()))?;
        let name = format!("jobcenter_bench_{}", Uuid::new_v4().simple());
        block_on(&runtime, async {
            let client = admin.connect().await.map_err(|e| connect_error(&admin, &e))?;
            client.batch_execute(&format!("CREATE DATABASE {name}")).await.map_err(|e| setup_error(&admin, &e))
        })?;
        let (base, query) = url.split_once('?').map(|(b, q)| (b, Some(q))).unwrap_or((url, None));
        let base = match base.rfind('/').filter(|&i| i > base.find("://").map_or(0, |s| s + 2)) {
            Some(slash) => &base[..slash],
            None => base,
        };
        let url = match query {
            Some(query) => format!("{base}/{name}?{query}"),
            None => format!("{base}/{name}"),
        };
        Ok(ScratchDatabase { admin, runtime, name, url })
    }

    /// The scratch database's URL (with the password the original URL had).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Where the database server listens, as the URL names it: each host
    /// with its port, a Unix socket as the file the server listens on.
    pub fn server_addresses(&self) -> Vec<ServerAddress> {
        let config = &self.admin.config;
        let ports = config.get_ports();
        config
            .get_hosts()
            .iter()
            .enumerate()
            .map(|(i, host)| {
                let port = ports.get(i).or(ports.first()).copied().unwrap_or(5432);
                match host {
                    tokio_postgres::config::Host::Tcp(name) => ServerAddress::Tcp(name.clone(), port),
                    tokio_postgres::config::Host::Unix(dir) => {
                        ServerAddress::Unix(dir.join(format!(".s.PGSQL.{port}")))
                    }
                }
            })
            .collect()
    }

    /// The scratch database's URL with `127.0.0.1:port` as its server (a
    /// relay in front of it), its password and other settings kept.
    pub fn url_via(&self, port: u16) -> String {
        url_via(&self.url, &self.admin.user, self.admin.config.get_password(), port)
    }

    /// Its size on disk, in bytes.
    pub fn size(&self) -> Result<i64, Error> {
        block_on(&self.runtime, async {
            let client = self.admin.connect().await.map_err(|e| connect_error(&self.admin, &e))?;
            let row = client
                .query_one("SELECT pg_database_size($1)", &[&self.name])
                .await
                .map_err(|e| classify(&self.admin, &e))?;
            Ok(row.get(0))
        })
    }

    /// Transactions committed or rolled back in it so far, as the server's
    /// statistics say (they lag by up to a second).
    pub fn transactions(&self) -> Result<i64, Error> {
        block_on(&self.runtime, async {
            let client = self.admin.connect().await.map_err(|e| connect_error(&self.admin, &e))?;
            let row = client
                .query_one(
                    "SELECT (xact_commit + xact_rollback)::bigint FROM pg_stat_database WHERE datname = $1",
                    &[&self.name],
                )
                .await
                .map_err(|e| classify(&self.admin, &e))?;
            Ok(row.get(0))
        })
    }
}

impl Drop for ScratchDatabase {
    fn drop(&mut self) {
        let _ = block_on(&self.runtime, async {
            let client = self.admin.connect().await?;
            client.batch_execute(&format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name)).await
        });
    }
}

/// One task row: job, index, state, attempts, handler, encoded record.
type TaskRow = (Uuid, i32, &'static str, i32, Option<Uuid>, Vec<u8>);

/// One pipelined statement of a write transaction, returning rows changed.
type Pending<'c> = std::pin::Pin<Box<dyn std::future::Future<Output = Result<u64, tokio_postgres::Error>> + Send + 'c>>;

/// A flush's batches as rows, each record once (the last written wins).
#[derive(Default)]
struct Merged {
    spec_jobs: Vec<Uuid>,
    spec_chunks: Vec<i64>,
    spec_data: Vec<Vec<u8>>,
    jobs: Vec<JobRecord>,
    tasks: Vec<TaskRow>,
    settings: Vec<(String, Option<Vec<u8>>)>,
    released: Vec<Uuid>,
    removed: Vec<Uuid>,
}

fn merge(batches: &[Batch]) -> Merged {
    let mut merged = Merged::default();
    let mut jobs: HashMap<JobId, usize> = HashMap::new();
    let mut tasks: HashMap<(JobId, u32), usize> = HashMap::new();
    let mut settings: HashMap<&str, usize> = HashMap::new();
    let mut put_job = |merged: &mut Merged, record: &JobRecord| match jobs.get(&record.id) {
        Some(&at) => merged.jobs[at] = record.clone(),
        None => {
            jobs.insert(record.id, merged.jobs.len());
            merged.jobs.push(record.clone());
        }
    };
    for batch in batches {
        for (record, spec) in &batch.new_jobs {
            for (number, bytes) in encode_spec(spec) {
                merged.spec_jobs.push(record.id.0);
                merged.spec_chunks.push(i64::from(number));
                merged.spec_data.push(bytes);
            }
            put_job(&mut merged, record);
        }
        for record in &batch.jobs {
            put_job(&mut merged, record);
        }
        for (job, idx, task) in &batch.tasks {
            let row = (job.0, idx.0 as i32, task.state().as_str(), task.attempt as i32, task.handler().map(|h| h.0), {
                let mut bytes = Vec::with_capacity(48);
                task.encode_stored(&mut bytes);
                bytes
            });
            match tasks.get(&(*job, idx.0)) {
                Some(&at) => merged.tasks[at] = row,
                None => {
                    tasks.insert((*job, idx.0), merged.tasks.len());
                    merged.tasks.push(row);
                }
            }
        }
        merged.released.extend(batch.released.iter().map(|job| job.0));
        merged.removed.extend(batch.removed.iter().map(|job| job.0));
        for (key, value) in &batch.settings {
            match settings.get(key.as_str()) {
                Some(&at) => merged.settings[at] = (key.clone(), value.clone()),
                None => {
                    settings.insert(key, merged.settings.len());
                    merged.settings.push((key.clone(), value.clone()));
                }
            }
        }
    }
    merged
}

const INSERT_SPECS: &str = "INSERT INTO jobcenter.job_specs (job_id, chunk, data) \
     SELECT * FROM UNNEST($1::uuid[], $2::int8[], $3::bytea[]) ON CONFLICT (job_id, chunk) DO NOTHING";
const UPSERT_JOBS: &str = "INSERT INTO jobcenter.jobs (id, name, state, active, fingerprint, created_at, updated_at, record, owner) \
     SELECT *, $9::uuid FROM UNNEST($1::uuid[], $2::text[], $3::text[], $4::bool[], $5::bytea[], $6::int8[], $7::int8[], $8::bytea[]) \
     ON CONFLICT (id) DO UPDATE SET name = excluded.name, state = excluded.state, active = excluded.active, \
     updated_at = excluded.updated_at, record = excluded.record, \
     owner = CASE WHEN jobs.id = ANY($10::uuid[]) THEN NULL \
     WHEN excluded.active AND NOT jobs.active THEN $9::uuid ELSE jobs.owner END";
/// Stops leading jobs that this flush wrote no record of.
const RELEASE_JOBS: &str =
    "UPDATE jobcenter.jobs SET owner = NULL WHERE id = ANY($1::uuid[]) AND owner = $2 AND NOT (id = ANY($3::uuid[]))";
/// Removes ended jobs with their spec and task rows; a job active again is left alone.
const REMOVE_JOBS: &str =
    "WITH gone AS (DELETE FROM jobcenter.jobs WHERE id = ANY($1::uuid[]) AND NOT active RETURNING id), \
     specs AS (DELETE FROM jobcenter.job_specs WHERE job_id IN (SELECT id FROM gone)) \
     DELETE FROM jobcenter.tasks WHERE job_id IN (SELECT id FROM gone)";
/// Refuses the transaction once this instance is deactivated.
const FENCE: &str = "SELECT jobcenter.fence($1)";
const UPSERT_TASKS: &str = "INSERT INTO jobcenter.tasks (job_id, idx, state, attempt, handler, record) \
     SELECT * FROM UNNEST($1::uuid[], $2::int4[], $3::text[], $4::int4[], $5::uuid[], $6::bytea[]) \
     ON CONFLICT (job_id, idx) DO UPDATE SET state = excluded.state, attempt = excluded.attempt, \
     handler = excluded.handler, record = excluded.record";
const UPSERT_SETTINGS: &str =
    "INSERT INTO jobcenter.settings (key, value) SELECT * FROM UNNEST($1::text[], $2::bytea[]) \
     ON CONFLICT (key) DO UPDATE SET value = excluded.value";
const DELETE_SETTINGS: &str = "DELETE FROM jobcenter.settings WHERE key = ANY($1)";
/// A whole flush in one statement (so one implicit transaction and one round
/// trip), for flushes whose rows fit one statement each: the common case.
const WRITE_ALL: &str = "WITH specs AS (INSERT INTO jobcenter.job_specs (job_id, chunk, data) \
     SELECT * FROM UNNEST($1::uuid[], $2::int8[], $3::bytea[]) ON CONFLICT (job_id, chunk) DO NOTHING), \
     jobs AS (INSERT INTO jobcenter.jobs (id, name, state, active, fingerprint, created_at, updated_at, record, owner) \
     SELECT *, $22::uuid FROM UNNEST($4::uuid[], $5::text[], $6::text[], $7::bool[], $8::bytea[], $9::int8[], $10::int8[], $11::bytea[]) \
     ON CONFLICT (id) DO UPDATE SET name = excluded.name, state = excluded.state, active = excluded.active, \
     updated_at = excluded.updated_at, record = excluded.record, \
     owner = CASE WHEN jobs.id = ANY($21::uuid[]) THEN NULL \
     WHEN excluded.active AND NOT jobs.active THEN $22::uuid ELSE jobs.owner END), \
     released AS (UPDATE jobcenter.jobs SET owner = NULL WHERE id = ANY($21::uuid[]) AND owner = $22 \
     AND NOT (id = ANY($4::uuid[]))), \
     fence AS (SELECT jobcenter.fence($22) AS ok), \
     tasks AS (INSERT INTO jobcenter.tasks (job_id, idx, state, attempt, handler, record) \
     SELECT * FROM UNNEST($12::uuid[], $13::int4[], $14::text[], $15::int4[], $16::uuid[], $17::bytea[]) \
     ON CONFLICT (job_id, idx) DO UPDATE SET state = excluded.state, attempt = excluded.attempt, \
     handler = excluded.handler, record = excluded.record), \
     puts AS (INSERT INTO jobcenter.settings (key, value) SELECT * FROM UNNEST($18::text[], $19::bytea[]) \
     ON CONFLICT (key) DO UPDATE SET value = excluded.value), \
     deletes AS (DELETE FROM jobcenter.settings WHERE key = ANY($20)) \
     SELECT ok FROM fence";

/// The committer's connection with its statements prepared once.
struct Writer {
    client: tokio_postgres::Client,
    begin: tokio_postgres::Statement,
    commit: tokio_postgres::Statement,
    specs: tokio_postgres::Statement,
    jobs: tokio_postgres::Statement,
    tasks: tokio_postgres::Statement,
    put_settings: tokio_postgres::Statement,
    delete_settings: tokio_postgres::Statement,
    write_all: tokio_postgres::Statement,
    fence: tokio_postgres::Statement,
    release: tokio_postgres::Statement,
    remove: tokio_postgres::Statement,
}

impl Writer {
    async fn connect(target: &Target) -> Result<Writer, tokio_postgres::Error> {
        let client = target.connect().await?;
        let (begin, commit, specs, jobs, tasks, put_settings, delete_settings, write_all, fence, release, remove) = tokio::try_join!(
            client.prepare("BEGIN"),
            client.prepare("COMMIT"),
            client.prepare(INSERT_SPECS),
            client.prepare(UPSERT_JOBS),
            client.prepare(UPSERT_TASKS),
            client.prepare(UPSERT_SETTINGS),
            client.prepare(DELETE_SETTINGS),
            client.prepare(WRITE_ALL),
            client.prepare(FENCE),
            client.prepare(RELEASE_JOBS),
            client.prepare(REMOVE_JOBS),
        )?;
        Ok(Writer {
            client,
            begin,
            commit,
            specs,
            jobs,
            tasks,
            put_settings,
            delete_settings,
            write_all,
            fence,
            release,
            remove,
        })
    }
}

/// The rows of one statement, owned so that every statement of a flush can be in flight at once.
enum Rows {
    Specs(Vec<Uuid>, Vec<i64>, Vec<Vec<u8>>),
    Jobs(Vec<Uuid>, Vec<String>, Vec<&'static str>, Vec<bool>, Vec<Vec<u8>>, Vec<i64>, Vec<i64>, Vec<Vec<u8>>),
    Tasks(Vec<Uuid>, Vec<i32>, Vec<&'static str>, Vec<i32>, Vec<Option<Uuid>>, Vec<Vec<u8>>),
    PutSettings(Vec<String>, Vec<Vec<u8>>),
    DeleteSettings(Vec<String>),
}

impl Rows {
    fn is_specs(&self) -> bool {
        matches!(self, Rows::Specs(..))
    }

    fn is_jobs(&self) -> bool {
        matches!(self, Rows::Jobs(..))
    }

    fn is_tasks(&self) -> bool {
        matches!(self, Rows::Tasks(..))
    }
}

/// A flush as the one statement `WRITE_ALL`: its own transaction, one round trip.
async fn write_at_once(
    writer: &Writer,
    rows: Vec<Rows>,
    released: &Vec<Uuid>,
    me: &Option<Uuid>,
) -> Result<(), tokio_postgres::Error> {
    let (mut spec_jobs, mut spec_chunks, mut spec_data) = (Vec::new(), Vec::new(), Vec::new());
    let mut jobs = (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut tasks = (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let (mut put_keys, mut put_values, mut deletes): (Vec<String>, Vec<Vec<u8>>, Vec<String>) =
        (Vec::new(), Vec::new(), Vec::new());
    for row in rows {
        match row {
            Rows::Specs(a, b, c) => (spec_jobs, spec_chunks, spec_data) = (a, b, c),
            Rows::Jobs(a, b, c, d, e, f, g, h) => jobs = (a, b, c, d, e, f, g, h),
            Rows::Tasks(a, b, c, d, e, f) => tasks = (a, b, c, d, e, f),
            Rows::PutSettings(a, b) => (put_keys, put_values) = (a, b),
            Rows::DeleteSettings(a) => deletes = a,
        }
    }
    let params: [&(dyn ToSql + Sync); 22] = [
        &spec_jobs,
        &spec_chunks,
        &spec_data,
        &jobs.0,
        &jobs.1,
        &jobs.2,
        &jobs.3,
        &jobs.4,
        &jobs.5,
        &jobs.6,
        &jobs.7,
        &tasks.0,
        &tasks.1,
        &tasks.2,
        &tasks.3,
        &tasks.4,
        &tasks.5,
        &put_keys,
        &put_values,
        &deletes,
        released,
        me,
    ];
    writer.client.execute(&writer.write_all, &params).await.map(|_| ())
}

fn rows(batch: &Merged) -> Vec<Rows> {
    let mut out = Vec::new();
    for range in chunks(batch.spec_jobs.len()) {
        out.push(Rows::Specs(
            batch.spec_jobs[range.clone()].to_vec(),
            batch.spec_chunks[range.clone()].to_vec(),
            batch.spec_data[range].to_vec(),
        ));
    }
    for range in chunks(batch.jobs.len()) {
        let jobs = &batch.jobs[range];
        out.push(Rows::Jobs(
            jobs.iter().map(|j| j.id.0).collect(),
            jobs.iter().map(|j| j.name.clone()).collect(),
            jobs.iter().map(|j| j.state.as_str()).collect(),
            jobs.iter().map(|j| !j.state.is_terminal()).collect(),
            jobs.iter().map(|j| j.fingerprint.to_vec()).collect(),
            jobs.iter().map(|j| j.created_at.as_millis()).collect(),
            jobs.iter().map(|j| j.updated_at.as_millis()).collect(),
            jobs.iter().map(encode).collect(),
        ));
    }
    for range in chunks(batch.tasks.len()) {
        let tasks = &batch.tasks[range];
        out.push(Rows::Tasks(
            tasks.iter().map(|t| t.0).collect(),
            tasks.iter().map(|t| t.1).collect(),
            tasks.iter().map(|t| t.2).collect(),
            tasks.iter().map(|t| t.3).collect(),
            tasks.iter().map(|t| t.4).collect(),
            tasks.iter().map(|t| t.5.clone()).collect(),
        ));
    }
    let (puts, deletes): (Vec<_>, Vec<_>) = batch.settings.iter().partition(|(_, value)| value.is_some());
    if !puts.is_empty() {
        out.push(Rows::PutSettings(
            puts.iter().map(|(k, _)| k.clone()).collect(),
            puts.iter().map(|(_, v)| v.clone().unwrap_or_default()).collect(),
        ));
    }
    if !deletes.is_empty() {
        out.push(Rows::DeleteSettings(deletes.iter().map(|(k, _)| k.clone()).collect()));
    }
    out
}

/// One flush: every row of the merged batches in one transaction, sent as
/// one pipeline (`BEGIN`, the upserts, `COMMIT`), so that it costs one round
/// trip and the commit's own durable write.
async fn write_transaction(writer: &mut Writer, batch: &Merged, me: Option<Uuid>) -> Result<(), tokio_postgres::Error> {
    let rows = rows(batch);
    let fits_one_statement = [Rows::is_specs, Rows::is_jobs, Rows::is_tasks]
        .iter()
        .all(|kind| rows.iter().filter(|row| kind(row)).count() <= 1);
    if fits_one_statement && batch.removed.is_empty() {
        return write_at_once(writer, rows, &batch.released, &me).await;
    }
    let job_ids: Vec<Uuid> = batch.jobs.iter().map(|j| j.id.0).collect();
    let client = &writer.client;
    let mut statements: Vec<Pending<'_>> = Vec::with_capacity(rows.len() + 2);
    let none: [&(dyn ToSql + Sync); 0] = [];
    statements.push(Box::pin(client.execute_raw(&writer.begin, none)));
    statements.push(Box::pin(client.execute_raw(&writer.fence, [&me as &(dyn ToSql + Sync)])));
    if !batch.removed.is_empty() {
        statements.push(Box::pin(client.execute_raw(&writer.remove, [&batch.removed as &(dyn ToSql + Sync)])));
    }
    for row in &rows {
        type Param<'p> = &'p (dyn ToSql + Sync);
        let (statement, params): (&tokio_postgres::Statement, Vec<Param>) = match row {
            Rows::Specs(a, b, c) => (&writer.specs, vec![a, b, c]),
            Rows::Jobs(a, b, c, d, e, f, g, h) => (&writer.jobs, vec![a, b, c, d, e, f, g, h, &me, &batch.released]),
            Rows::Tasks(a, b, c, d, e, f) => (&writer.tasks, vec![a, b, c, d, e, f]),
            Rows::PutSettings(a, b) => (&writer.put_settings, vec![a, b]),
            Rows::DeleteSettings(a) => (&writer.delete_settings, vec![a]),
        };
        statements.push(Box::pin(client.execute_raw(statement, params)));
    }
    if !batch.released.is_empty() {
        let params: [&(dyn ToSql + Sync); 3] = [&batch.released, &me, &job_ids];
        statements.push(Box::pin(client.execute_raw(&writer.release, params)));
    }
    // A statement that fails aborts the transaction: the COMMIT then rolls it
    // back, and the failure is the statement's own error.
    statements.push(Box::pin(client.execute_raw(&writer.commit, none)));
    let outcomes = join_in_order(statements).await;
    for outcome in outcomes {
        outcome?;
    }
    Ok(())
}

/// Polls every future together (so that their requests go out as one
/// pipeline, in order) and returns their results in order.
async fn join_in_order<T>(futures: Vec<std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send + '_>>>) -> Vec<T> {
    let mut slots: Vec<Option<T>> = futures.iter().map(|_| None).collect();
    let mut futures: Vec<Option<std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send + '_>>>> =
        futures.into_iter().map(Some).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (slot, future) in slots.iter_mut().zip(futures.iter_mut()) {
            if let Some(running) = future {
                match running.as_mut().poll(cx) {
                    std::task::Poll::Ready(value) => {
                        *slot = Some(value);
                        *future = None;
                    }
                    std::task::Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            std::task::Poll::Pending
        } else {
            std::task::Poll::Ready(())
        }
    })
    .await;
    slots.into_iter().map(|slot| slot.expect("every future completed")).collect()
}

fn chunks(n: usize) -> impl Iterator<Item = std::ops::Range<usize>> {
    (0..n).step_by(ROWS_PER_STATEMENT).map(move |start| start..(start + ROWS_PER_STATEMENT).min(n))
}

impl Store for PgStore {
    fn write(&self, batch: &Batch) -> Result<(), Error> {
        if !batch.is_empty() {
            self.pending.lock().expect("pending lock").push(batch.clone());
        }
        Ok(())
    }

    fn flush(&self) -> Result<(), Error> {
        let batches: Vec<Batch> = self.pending.lock().expect("pending lock").clone();
        if batches.is_empty() {
            return Ok(());
        }
        let merged = merge(&batches);
        self.block_on(self.commit(&merged))?;
        self.pending.lock().expect("pending lock").drain(..batches.len());
        Ok(())
    }

    fn load_active(&self) -> Result<Vec<StoredJob>, Error> {
        self.block_on(async {
            let mut client = self.reader().await?;
            let transaction = read_transaction(&mut client).await.map_err(|e| self.error(&e))?;
            let rows = transaction
                .query(
                    "SELECT record FROM jobcenter.jobs WHERE active AND ($1::uuid IS NULL OR owner = $1) ORDER BY id",
                    &[&self.me.get().copied()],
                )
                .await
                .map_err(|e| self.error(&e))?;
            let records = rows.iter().map(|row| decode_job(row.get(0))).collect::<Result<Vec<JobRecord>, Error>>()?;
            self.read_jobs(&transaction, records).await
        })
    }

    fn get_job(&self, id: JobId) -> Result<Option<StoredJob>, Error> {
        self.block_on(async {
            let mut client = self.reader().await?;
            let transaction = read_transaction(&mut client).await.map_err(|e| self.error(&e))?;
            let row = transaction
                .query_opt("SELECT record FROM jobcenter.jobs WHERE id = $1", &[&id.0])
                .await
                .map_err(|e| self.error(&e))?;
            let Some(row) = row else { return Ok(None) };
            let record = decode_job(row.get(0))?;
            Ok(self.read_jobs(&transaction, vec![record]).await?.pop())
        })
    }

    fn list_jobs(&self, filter: &JobFilter) -> Result<Vec<JobRecord>, Error> {
        // The columns narrow the rows; what only the record knows (the
        // origin) is checked on each record, page after page.
        const PAGE: i64 = 500;
        self.block_on(async {
            let client = self.reader().await?;
            let state = filter.state.map(|s| s.as_str());
            let fingerprint = filter.fingerprint.map(|f| f.to_vec());
            let limit = filter.limit.unwrap_or(usize::MAX);
            let mut before = filter.before.map(|b| b.0);
            let mut out = Vec::new();
            while out.len() < limit {
                let page = i64::try_from(limit - out.len()).unwrap_or(i64::MAX).min(PAGE);
                let rows = client
                    .query(
                        "SELECT id, record FROM jobcenter.jobs WHERE ($1::text IS NULL OR state = $1) \
                         AND ($2::text IS NULL OR name = $2) AND ($3::bytea IS NULL OR fingerprint = $3) \
                         AND ($4::text IS NULL OR strpos(name, $4) > 0) AND ($5::uuid IS NULL OR id < $5) \
                         ORDER BY id DESC LIMIT $6",
                        &[&state, &filter.name, &fingerprint, &filter.name_contains, &before, &page],
                    )
                    .await
                    .map_err(|e| self.error(&e))?;
                for row in &rows {
                    let record = decode_job(row.get(1))?;
                    if filter.matches(&record) && out.len() < limit {
                        out.push(record);
                    }
                }
                match rows.last() {
                    Some(last) if rows.len() as i64 == page => before = Some(last.get(0)),
                    _ => break,
                }
            }
            Ok(out)
        })
    }

    fn put_setting(&self, key: &str, value: Option<&[u8]>) -> Result<(), Error> {
        self.block_on(async {
            let client = self.reader().await?;
            match value {
                Some(value) => {
                    client
                        .execute(
                            "INSERT INTO jobcenter.settings (key, value) VALUES ($1, $2) \
                         ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                            &[&key, &value],
                        )
                        .await
                }
                None => client.execute("DELETE FROM jobcenter.settings WHERE key = $1", &[&key]).await,
            }
            .map(|_| ())
            .map_err(|e| self.error(&e))
        })
    }

    fn cluster(&self) -> Option<&dyn super::cluster::Cluster> {
        Some(self)
    }

    fn settings(&self, prefix: &str) -> Result<Vec<(String, Vec<u8>)>, Error> {
        self.settings_any(&[prefix])
    }

    fn settings_any(&self, prefixes: &[&str]) -> Result<Vec<(String, Vec<u8>)>, Error> {
        self.block_on(async {
            let client = self.reader().await?;
            let rows = client
                .query(
                    "SELECT key, value FROM jobcenter.settings WHERE key ^@ ANY($1::text[]) ORDER BY key",
                    &[&prefixes],
                )
                .await
                .map_err(|e| self.error(&e))?;
            Ok(rows.iter().map(|row| (row.get(0), row.get(1))).collect())
        })
    }
}

async fn read_transaction(client: &mut Reader) -> Result<deadpool_postgres::Transaction<'_>, tokio_postgres::Error> {
    client.0.build_transaction().isolation_level(IsolationLevel::RepeatableRead).read_only(true).start().await
}

/// A connection of the readers' pool. A statement run outside a
/// transaction is prepared once per connection and kept: prepared on the
/// spot, it would cost a round trip and a transaction of its own (its
/// `Parse` ends with a `Sync`, which commits).
struct Reader(deadpool_postgres::Object);

type Params<'a> = &'a [&'a (dyn ToSql + Sync)];

impl Reader {
    async fn query(&self, sql: &str, params: Params<'_>) -> Result<Vec<tokio_postgres::Row>, tokio_postgres::Error> {
        self.0.query(&self.0.prepare_cached(sql).await?, params).await
    }

    async fn query_one(&self, sql: &str, params: Params<'_>) -> Result<tokio_postgres::Row, tokio_postgres::Error> {
        self.0.query_one(&self.0.prepare_cached(sql).await?, params).await
    }

    async fn query_opt(
        &self,
        sql: &str,
        params: Params<'_>,
    ) -> Result<Option<tokio_postgres::Row>, tokio_postgres::Error> {
        self.0.query_opt(&self.0.prepare_cached(sql).await?, params).await
    }

    async fn execute(&self, sql: &str, params: Params<'_>) -> Result<u64, tokio_postgres::Error> {
        self.0.execute(&self.0.prepare_cached(sql).await?, params).await
    }

    async fn transaction(&mut self) -> Result<deadpool_postgres::Transaction<'_>, tokio_postgres::Error> {
        self.0.transaction().await
    }
}

/// Creates the schema or brings it up to date, refusing a schema that is not
/// jobcenter's or is newer than this build. In one transaction, under an
/// advisory lock; a schema this start created is removed again if it fails.
async fn migrate(target: &Target, client: &mut tokio_postgres::Client) -> Result<(), Error> {
    let database = || target.display.clone();
    let fail = |e: &tokio_postgres::Error| setup_error(target, e);
    client.execute("SELECT pg_advisory_lock($1)", &[&MIGRATION_LOCK]).await.map_err(|e| fail(&e))?;
    let result = async {
        let runner = migrations::runner();
        let latest = runner.get_migrations().iter().map(|m| m.version()).max().unwrap_or(0);
        let row = client
            .query_one(
                "SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = 'jobcenter'), \
                 to_regclass($1) IS NOT NULL, \
                 (SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
                  WHERE n.nspname = 'jobcenter' AND c.relkind = 'r')",
                &[&HISTORY_TABLE],
            )
            .await
            .map_err(|e| fail(&e))?;
        let (schema_exists, history_exists, n_tables): (bool, bool, i64) = (row.get(0), row.get(1), row.get(2));
        if schema_exists && !history_exists && n_tables > 0 {
            return Err(Error::Foreign {
                database: database(),
                detail: format!("it holds {n_tables} tables and no {HISTORY_TABLE}"),
            });
        }
        if history_exists {
            let found: Option<i32> = client
                .query_one(&format!("SELECT max(version) FROM {HISTORY_TABLE}"), &[])
                .await
                .map_err(|e| fail(&e))?
                .get(0);
            if let Some(found) = found.filter(|found| *found > latest) {
                return Err(Error::Newer { database: database(), found: found as u32, expected: latest as u32 });
            }
        }
        let mut created = false;
        if !schema_exists {
            let may_create: bool = client
                .query_one("SELECT has_database_privilege(current_database(), 'CREATE')", &[])
                .await
                .map_err(|e| fail(&e))?
                .get(0);
            if !may_create {
                return Err(Error::NoPrivilege {
                    database: database(),
                    user: target.user.clone(),
                    detail: "it may not create schemas in this database".into(),
                });
            }
            client.batch_execute("CREATE SCHEMA jobcenter").await.map_err(|e| fail(&e))?;
            created = true;
        }
        let mut runner = runner;
        runner.set_migration_table_name(HISTORY_TABLE);
        let report = runner.set_grouped(true).set_abort_divergent(true).set_abort_missing(true).run_async(client).await;
        match report {
            Ok(report) => {
                for migration in report.applied_migrations() {
                    tracing::info!(database = %target.display, version = migration.version(), name = migration.name(), "schema migration applied");
                }
                Ok(())
            }
            Err(e) => {
                if created {
                    let _ = client.batch_execute("DROP SCHEMA IF EXISTS jobcenter CASCADE").await;
                }
                Err(migration_error(target, &e))
            }
        }
    }
    .await;
    let _ = client.execute("SELECT pg_advisory_unlock($1)", &[&MIGRATION_LOCK]).await;
    result
}

fn migration_error(target: &Target, e: &refinery::Error) -> Error {
    let source = std::error::Error::source(e).and_then(|s| s.downcast_ref::<tokio_postgres::Error>());
    match source {
        Some(e) => setup_error(target, e),
        None => match e.kind() {
            refinery::error::Kind::MissingVersion(migration) => Error::Newer {
                database: target.display.clone(),
                found: migration.version() as u32,
                expected: migrations::runner().get_migrations().iter().map(|m| m.version()).max().unwrap_or(0) as u32,
            },
            _ => Error::Foreign { database: target.display.clone(), detail: e.to_string() },
        },
    }
}

/// A failure while connecting: unreachable, refused, or no such database.
fn connect_error(target: &Target, e: &tokio_postgres::Error) -> Error {
    let detail = connect::strip_password(&database_message(e));
    match e.code() {
        Some(code) if *code == SqlState::INVALID_PASSWORD || *code == SqlState::INVALID_AUTHORIZATION_SPECIFICATION => {
            Error::Refused { database: target.display.clone(), user: target.user.clone(), detail }
        }
        Some(code) if *code == SqlState::INVALID_CATALOG_NAME => {
            Error::NoDatabase { database: target.display.clone(), name: target.database.clone() }
        }
        Some(code) if *code == SqlState::INSUFFICIENT_PRIVILEGE => {
            Error::NoPrivilege { database: target.display.clone(), user: target.user.clone(), detail }
        }
        Some(_) => Error::Database { database: target.display.clone(), detail },
        None => Error::Unreachable { database: target.display.clone(), detail },
    }
}

/// A failure while setting the schema up.
fn setup_error(target: &Target, e: &tokio_postgres::Error) -> Error {
    match e.code() {
        Some(code) if *code == SqlState::INSUFFICIENT_PRIVILEGE => Error::NoPrivilege {
            database: target.display.clone(),
            user: target.user.clone(),
            detail: database_message(e),
        },
        _ => connect_error(target, e),
    }
}

/// An error met while serving: the database is away (retried), or it refused.
fn classify(target: &Target, e: &tokio_postgres::Error) -> Error {
    let detail = connect::strip_password(&database_message(e));
    if e.code().is_some_and(|code| code.code() == FENCED) {
        let instance = detail.split_whitespace().nth(2).unwrap_or("?").to_string();
        return Error::Fenced { instance };
    }
    if is_transient(e) {
        Error::Unavailable { database: target.display.clone(), detail }
    } else {
        Error::Database { database: target.display.clone(), detail }
    }
}

/// The connection broke, the server is shutting down or starting, or the
/// transaction lost a race: weather, not a refusal.
fn is_transient(e: &tokio_postgres::Error) -> bool {
    match e.code() {
        None => true,
        Some(code) => {
            code.code().starts_with("08")
                || [
                    SqlState::ADMIN_SHUTDOWN,
                    SqlState::CRASH_SHUTDOWN,
                    SqlState::CANNOT_CONNECT_NOW,
                    SqlState::T_R_SERIALIZATION_FAILURE,
                    SqlState::T_R_DEADLOCK_DETECTED,
                    SqlState::TOO_MANY_CONNECTIONS,
                ]
                .contains(code)
        }
    }
}

/// The server's own message when it sent one, else the driver's with its cause.
fn database_message(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => db.message().to_string(),
        None => {
            let mut text = e.to_string();
            let mut source = std::error::Error::source(e);
            while let Some(cause) = source {
                text = format!("{text}: {cause}");
                source = cause.source();
            }
            text
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::Timestamp;
    use crate::model::{HandlerId, Hold, JobOrigin, JobState, Phase, TaskIdx};

    fn job(state: JobState) -> JobRecord {
        JobRecord {
            id: JobId::new(),
            name: "j".into(),
            state,
            origin: JobOrigin::User,
            n_tasks: 2,
            fingerprint: [0; 32],
            created_at: Timestamp(1),
            updated_at: Timestamp(1),
            finished_at: None,
            cancel_requested: false,
            handler: None,
        }
    }

    #[test]
    fn merging_keeps_the_last_record_of_each_key() {
        let mut record = job(JobState::Pending);
        let mut task = TaskRecord::initial(false, Timestamp(1));
        let first = Batch {
            jobs: vec![record.clone()],
            tasks: vec![(record.id, TaskIdx(0), task.clone())],
            settings: vec![("a".into(), Some(vec![1])), ("b".into(), Some(vec![2]))],
            ..Batch::default()
        };
        record.state = JobState::Running;
        task.phase =
            Phase::Held(Hold { handler: HandlerId::new(), assigned_at: Timestamp(2), started_at: Some(Timestamp(2)) });
        let second = Batch {
            jobs: vec![record.clone()],
            tasks: vec![(record.id, TaskIdx(0), task.clone()), (record.id, TaskIdx(1), task.clone())],
            settings: vec![("a".into(), None)],
            ..Batch::default()
        };
        let merged = merge(&[first, second]);
        assert_eq!(merged.jobs, vec![record]);
        assert_eq!(merged.tasks.len(), 2);
        assert_eq!(merged.tasks[0].2, "running");
        assert_eq!(merged.settings, vec![("a".to_string(), None), ("b".to_string(), Some(vec![2]))]);
        assert_eq!(chunks(45_000).collect::<Vec<_>>(), vec![0..20_000, 20_000..40_000, 40_000..45_000]);
    }

    #[test]
    fn a_url_through_a_relay_keeps_everything_but_the_server() {
        let via = |url: &str, password: Option<&[u8]>| super::url_via(url, "me", password, 7000);
        assert_eq!(
            via("postgres://u:p%40ss@db.example:5433/jobs?sslmode=require&host=/run/pg&port=5434", None),
            "postgres://u:p%40ss@127.0.0.1:7000/jobs?sslmode=require"
        );
        assert_eq!(via("postgresql://u@db/jobs", Some(b"s e/c")), "postgres://u:s%20e%2Fc@127.0.0.1:7000/jobs");
        assert_eq!(via("postgres:///jobs?host=/tmp/pg", Some(b"pw")), "postgres://me:pw@127.0.0.1:7000/jobs");
        assert_eq!(via("postgres://db/jobs", None), "postgres://127.0.0.1:7000/jobs");
    }
}
