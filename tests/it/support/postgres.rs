//! A real, throwaway PostgreSQL for the tests: `PgCluster::start` runs
//! `initdb` in a fresh temporary directory and a server on 127.0.0.1 (a free
//! port) and on a unix socket inside that directory, with the superuser
//! `jobcenter` and a random password (`scram-sha-256` over TCP, `trust` over
//! the socket). `fsync` and `synchronous_commit` stay on: durability is under
//! test. The binaries come from Debian's `postgresql` package, which
//! `.ci/setup` installs; without them every test that starts a cluster fails
//! and says so.
//!
//! `initdb` and `postgres` refuse to run as root. When the tests run as root
//! (as CI does), every server-side command runs as the `postgres` system user
//! through `runuser -u postgres --`, and the directory belongs to that user;
//! clients (`psql`) run as the current user.
//!
//! No server outlives its test process. Each cluster has a watchdog, a small
//! `sh` in its own process group that ignores SIGINT, SIGTERM and SIGHUP and
//! blocks reading a pipe whose only writer is the test process. The pipe
//! closes when the cluster is dropped or when the test process ends in any
//! way (returning, panicking, a signal, SIGKILL); the watchdog then stops the
//! server (`pg_ctl stop -m immediate`) and removes the directory. `Drop`
//! closes the pipe and waits for it, so a dropped cluster is gone when
//! `drop` returns; [`shared`], a cluster that lives as long as the process,
//! relies on the watchdog alone.
//!
//! It needs nothing from the rest of the harness.
#![allow(dead_code)]

use std::io::Write;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{mpsc, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// The bound of every wait for the server: start, stop, readiness, reload.
pub const WAIT: Duration = Duration::from_secs(30);
/// The superuser every cluster is created with.
pub const SUPERUSER: &str = "jobcenter";
/// How long a client waits for a connection (`PGCONNECT_TIMEOUT`).
const CONNECT_TIMEOUT_SECONDS: &str = "10";
/// How long one `psql` run may take before it is killed.
const PSQL_LIMIT: Duration = Duration::from_secs(120);

/// How `stop` shuts the server down (`pg_ctl stop -m MODE`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shutdown {
    /// Ends sessions, writes a checkpoint, exits cleanly.
    Fast,
    /// Exits at once, as a crash would; the next start replays the WAL.
    Immediate,
}

impl Shutdown {
    fn mode(self) -> &'static str {
        match self {
            Shutdown::Fast => "fast",
            Shutdown::Immediate => "immediate",
        }
    }
}

/// A process that was running, named by its pid and its start time (field
/// 22 of `/proc/PID/stat`), so a reused pid is not mistaken for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProcessId {
    pub pid: u32,
    pub start_time: u64,
}

impl ProcessId {
    pub fn of(pid: u32) -> Option<ProcessId> {
        let (_, start_time) = stat(pid)?;
        Some(ProcessId { pid, start_time })
    }

    /// Whether this very process still runs (a zombie does not).
    pub fn is_alive(&self) -> bool {
        matches!(stat(self.pid), Some((state, start_time)) if state != 'Z' && start_time == self.start_time)
    }
}

/// State and start time of a process, from `/proc/PID/stat`.
fn stat(pid: u32) -> Option<(char, u64)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name is in parentheses and may hold spaces: fields count from the last ')'.
    let rest = &text[text.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let state = fields.first()?.chars().next()?;
    // Field 3 (state) is fields[0]; field 22 (starttime) is fields[19].
    Some((state, fields.get(19)?.parse().ok()?))
}

/// The parent pid of a process.
fn parent_of(pid: u32) -> Option<u32> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &text[text.rfind(')')? + 1..];
    rest.split_whitespace().nth(1)?.parse().ok()
}

// ---------------------------------------------------------------------------
// Binaries and the server's user

/// The directory holding `initdb`, `pg_ctl`, `postgres` and `psql`: the
/// highest version under `/usr/lib/postgresql/*/bin` (Debian's layout), else
/// `pg_config --bindir`. Panics, saying how to install them, if neither has
/// `initdb`.
pub fn bindir() -> &'static Path {
    static BINDIR: OnceLock<PathBuf> = OnceLock::new();
    BINDIR.get_or_init(|| {
        find_bindir().unwrap_or_else(|| {
            panic!(
                "PostgreSQL is not installed: no initdb under /usr/lib/postgresql/*/bin nor in `pg_config --bindir`; \
                 run `bash .ci/setup` (it installs Debian's `postgresql` package)"
            )
        })
    })
}

fn find_bindir() -> Option<PathBuf> {
    let mut versions: Vec<(Vec<u32>, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let version: Option<Vec<u32>> =
                entry.file_name().to_str()?.split('.').map(|part| part.parse().ok()).collect();
            let bin = entry.path().join("bin");
            bin.join("initdb").is_file().then_some((version?, bin))
        })
        .collect();
    versions.sort();
    if let Some((_, bin)) = versions.pop() {
        return Some(bin);
    }
    let output = Command::new("pg_config").arg("--bindir").stderr(Stdio::null()).output().ok()?;
    let bin = PathBuf::from(String::from_utf8_lossy(&output.stdout).trim());
    (output.status.success() && bin.join("initdb").is_file()).then_some(bin)
}

fn program(name: &str) -> PathBuf {
    let path = bindir().join(name);
    assert!(path.is_file(), "{} is missing: run `bash .ci/setup`", path.display());
    path
}

/// The user the server runs as when the tests run as root: `postgres`, with
/// its uid and gid. `None` when the tests do not run as root.
fn server_user() -> Option<(u32, u32)> {
    static USER: OnceLock<Option<(u32, u32)>> = OnceLock::new();
    *USER.get_or_init(|| {
        // /proc/self belongs to the process's effective user.
        let uid = std::fs::metadata("/proc/self").expect("read /proc/self").uid();
        if uid != 0 {
            return None;
        }
        let id = |flag: &str| -> Option<u32> {
            let output = Command::new("id").args([flag, "postgres"]).stderr(Stdio::null()).output().ok()?;
            String::from_utf8_lossy(&output.stdout).trim().parse().ok().filter(|_| output.status.success())
        };
        match (id("-u"), id("-g")) {
            (Some(uid), Some(gid)) => Some((uid, gid)),
            _ => panic!(
                "the tests run as root, where initdb and postgres refuse to run, and there is no `postgres` user \
                 to run them as: run `bash .ci/setup` (Debian's `postgresql` package creates it)"
            ),
        }
    })
}

fn runuser() -> &'static str {
    ["/usr/sbin/runuser", "/sbin/runuser", "/usr/bin/runuser"]
        .into_iter()
        .find(|p| Path::new(p).is_file())
        .unwrap_or("runuser")
}

/// A command for a server-side program (`initdb`, `pg_ctl`), as `postgres`
/// when the tests run as root.
fn server_command(name: &str) -> Command {
    let mut command = match server_user() {
        Some(_) => {
            let mut command = Command::new(runuser());
            command.args(["-u", "postgres", "--"]).arg(program(name));
            command
        }
        None => Command::new(program(name)),
    };
    clean_env(&mut command);
    command
}

/// Removes every `PG*` variable, so that only what a call names applies.
fn clean_env(command: &mut Command) {
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("PG") {
            command.env_remove(key);
        }
    }
    command.env("LC_ALL", "C");
}

/// Hands a path to the server's user (when the tests run as root).
fn give_to_server(path: &Path) {
    if let Some((uid, gid)) = server_user() {
        std::os::unix::fs::chown(path, Some(uid), Some(gid))
            .unwrap_or_else(|e| panic!("chown {} to postgres: {e}", path.display()));
    }
}

/// Runs a command to its end with `input` on stdin, killing it after `limit`.
fn run_bounded(mut command: Command, input: Option<&str>, limit: Duration) -> Output {
    command.stdin(if input.is_some() { Stdio::piped() } else { Stdio::null() });
    command.stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = command.spawn().unwrap_or_else(|e| panic!("could not start {command:?}: {e}"));
    if let Some(input) = input {
        let mut stdin = child.stdin.take().expect("stdin");
        let input = input.to_string();
        std::thread::spawn(move || {
            let _ = stdin.write_all(input.as_bytes());
        });
    }
    let pid = child.id();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(limit) {
        Ok(output) => output.unwrap_or_else(|e| panic!("wait for {command:?}: {e}")),
        Err(_) => {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), nix::sys::signal::Signal::SIGKILL);
            panic!("{command:?} did not finish within {limit:?}");
        }
    }
}

fn wait_for<T>(limit: Duration, mut check: impl FnMut() -> Option<T>) -> Option<T> {
    let started = Instant::now();
    loop {
        if let Some(value) = check() {
            return Some(value);
        }
        if started.elapsed() > limit {
            return None;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

// ---------------------------------------------------------------------------
// Clients

/// Runs `sql` with `psql` over the connection `conninfo` names (a URL or
/// `key=value` pairs), with `password` as `PGPASSWORD` if given, never
/// prompting. Returns stdout (unaligned, tuples only, no trailing newline),
/// or stderr if psql failed: it could not connect, or a statement failed.
pub fn try_psql(conninfo: &str, password: Option<&str>, sql: &str) -> Result<String, String> {
    let mut command = psql_command();
    command.arg("-d").arg(conninfo).args(["-f", "-"]);
    if let Some(password) = password {
        command.env("PGPASSWORD", password);
    }
    let output = run_bounded(command, Some(sql), PSQL_LIMIT);
    let stdout = String::from_utf8_lossy(&output.stdout).trim_end_matches('\n').to_string();
    if output.status.success() {
        Ok(stdout)
    } else {
        Err(format!("{}{}", String::from_utf8_lossy(&output.stderr), stdout))
    }
}

/// `psql` with no `PG*` variable but a bounded connect timeout, no psqlrc, no
/// password prompt, stopping at the first error, printing bare values.
pub fn psql_command() -> Command {
    let mut command = Command::new(program("psql"));
    clean_env(&mut command);
    command.env("PGCONNECT_TIMEOUT", CONNECT_TIMEOUT_SECONDS);
    command.args(["-X", "-w", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1"]);
    command
}

/// A SQL identifier, quoted.
pub fn quote_identifier(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// A SQL string literal, quoted.
pub fn quote_literal(value: &str) -> String {
    format!("'{}'", value.replace('\'', "''"))
}

/// A `key=value` connection parameter's value, quoted.
fn conninfo_value(value: &str) -> String {
    format!("'{}'", value.replace('\\', "\\\\").replace('\'', "\\'"))
}

/// Percent-encodes everything but unreserved characters, for a URL part.
fn url_encode(value: &str) -> String {
    value
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

// ---------------------------------------------------------------------------
// Ports

/// Ports are taken from 25000..27700: below 32768, where Linux starts
/// handing out ephemeral ports, and apart from the SeaweedFS harness's
/// ranges; each test process starts at its own offset.
const PORT_BASE: u16 = 25_000;
const PORT_SPAN: u32 = 2_700;

fn free_port() -> u16 {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let start = std::process::id().wrapping_mul(131) % PORT_SPAN;
    for _ in 0..PORT_SPAN {
        let port = PORT_BASE + ((start + NEXT.fetch_add(1, Ordering::SeqCst)) % PORT_SPAN) as u16;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free port in {PORT_BASE}..{}", PORT_BASE as u32 + PORT_SPAN);
}

/// Whether something accepts TCP connections on 127.0.0.1:`port`.
pub fn port_open(port: u16) -> bool {
    TcpStream::connect_timeout(&SocketAddr::from(([127, 0, 0, 1], port)), Duration::from_millis(500)).is_ok()
}

// ---------------------------------------------------------------------------
// The cluster

/// A PostgreSQL cluster of its own: a data directory, a server, a watchdog.
pub struct PgCluster {
    dir: tempfile::TempDir,
    /// The address it listens on over TCP: `127.0.0.1`, or a test host's.
    host: String,
    /// The words that start its server on a test host (`ip netns exec NS`).
    wrapper: Vec<String>,
    port: u16,
    password: String,
    /// Stops the server and removes `dir` once its stdin closes.
    watchdog: Child,
    databases: AtomicU32,
    ca_certificate: Mutex<Option<PathBuf>>,
}

/// A cluster for the whole test process, started on first use; each test
/// creates its own database in it ([`PgCluster::new_database`]). Tests that
/// stop the server, change its configuration or enable TLS start their own.
pub fn shared() -> &'static PgCluster {
    static SHARED: OnceLock<PgCluster> = OnceLock::new();
    SHARED.get_or_init(PgCluster::start)
}

impl PgCluster {
    /// Creates a cluster in a fresh temporary directory and starts its
    /// server; returns once it accepts password connections over TCP.
    pub fn start() -> PgCluster {
        PgCluster::create("127.0.0.1", &[]).start_on_free_port()
    }

    /// The same on a test host: the server runs under `wrapper` (`ip netns
    /// exec NS`) and listens on `host` (its address), port 5432, taking
    /// password connections and replication from any address.
    pub fn start_on_host(host: &str, wrapper: &[String]) -> PgCluster {
        let mut cluster = PgCluster::create(host, wrapper);
        cluster.port = 5432;
        cluster.write_settings();
        if let Err(log) = cluster.pg_ctl_start() {
            panic!("PostgreSQL did not start on {host}:\n{log}");
        }
        cluster.wait_ready();
        cluster
    }

    /// A streaming replica of `primary` on a test host, made with
    /// `pg_basebackup`; it follows the primary until [`promote`](Self::promote).
    /// With `synchronous`, the primary acknowledges no commit before this
    /// replica has it on disk (`synchronous_standby_names`).
    pub fn replica_of(primary: &PgCluster, host: &str, wrapper: &[String], synchronous: bool) -> PgCluster {
        let mut replica = PgCluster::empty(host, wrapper, primary.password.clone());
        let mut backup = server_command("pg_basebackup");
        backup.current_dir(replica.dir.path()).arg("-D").arg(replica.data_dir());
        let source = format!("host={} port={} user={SUPERUSER} application_name=replica", primary.host, primary.port);
        backup.arg("-d").arg(source).args(["-X", "stream", "-R", "--checkpoint=fast", "--no-sync"]);
        backup.env("PGPASSWORD", &primary.password);
        let output = run_bounded(backup, None, Duration::from_secs(120));
        assert!(
            output.status.success(),
            "pg_basebackup failed: {}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        replica.port = 5432;
        replica.write_settings();
        if let Err(log) = replica.pg_ctl_start() {
            panic!("the replica did not start on {host}:\n{log}");
        }
        replica.wait_ready();
        if synchronous {
            primary
                .psql("postgres", "ALTER SYSTEM SET synchronous_standby_names = 'replica';\nSELECT pg_reload_conf();");
            let streaming = wait_for(WAIT, || {
                let state = primary.psql("postgres", "SELECT sync_state FROM pg_stat_replication");
                (state.trim() == "sync").then_some(())
            });
            assert!(streaming.is_some(), "the replica did not become synchronous\n{}", primary.log());
        }
        replica
    }

    /// Promotes a replica to a primary (`pg_ctl promote`), waiting until it takes writes.
    pub fn promote(&self) {
        let mut pg_ctl = server_command("pg_ctl");
        pg_ctl.current_dir(self.dir.path()).args(["promote", "-w", "-t", &WAIT.as_secs().to_string(), "-D"]);
        pg_ctl.arg(self.data_dir());
        let output = run_bounded(pg_ctl, None, WAIT + Duration::from_secs(10));
        assert!(output.status.success(), "pg_ctl promote failed: {}", String::from_utf8_lossy(&output.stderr));
        let writable =
            wait_for(WAIT, || (self.psql("postgres", "SELECT pg_is_in_recovery()").trim() == "f").then_some(()));
        assert!(writable.is_some(), "the promoted replica is still in recovery\n{}", self.log());
    }

    /// The address it listens on.
    pub fn host(&self) -> &str {
        &self.host
    }

    /// A new directory, initialized, not started.
    fn create(host: &str, wrapper: &[String]) -> PgCluster {
        let cluster = PgCluster::empty(host, wrapper, uuid::Uuid::new_v4().simple().to_string());
        cluster.initdb();
        cluster
    }

    /// A new directory with its socket directory and watchdog, no data yet.
    fn empty(host: &str, wrapper: &[String], password: String) -> PgCluster {
        let server_user = server_user();
        let dir = tempfile::Builder::new().prefix("jobcenter-pg-").tempdir().expect("create a temporary directory");
        give_to_server(dir.path());
        let watchdog = start_watchdog(dir.path());
        let cluster = PgCluster {
            dir,
            host: host.to_string(),
            wrapper: wrapper.to_vec(),
            port: 0,
            password,
            watchdog,
            databases: AtomicU32::new(0),
            ca_certificate: Mutex::new(None),
        };
        if server_user.is_some() {
            let mut check = Command::new(runuser());
            check.args(["-u", "postgres", "--", "test", "-w"]).arg(cluster.dir.path());
            let output = run_bounded(check, None, WAIT);
            assert!(
                output.status.success(),
                "the postgres user cannot write {}: set TMPDIR to a directory it can reach, such as /tmp",
                cluster.dir.path().display()
            );
        }
        std::fs::create_dir(cluster.socket_dir()).expect("create the socket directory");
        give_to_server(&cluster.socket_dir());
        cluster
    }

    fn initdb(&self) {
        let password_file = self.dir.path().join("password");
        std::fs::write(&password_file, &self.password).expect("write the password file");
        give_to_server(&password_file);
        let mut initdb = server_command("initdb");
        initdb.current_dir(self.dir.path()).arg("-D").arg(self.data_dir());
        initdb.args(["-U", SUPERUSER, "--auth-local=trust", "--auth-host=scram-sha-256"]);
        // --no-sync: only initdb's own files skip fsync; the server fsyncs as usual.
        initdb.args(["-E", "UTF8", "--no-locale", "--no-sync"]).arg(format!("--pwfile={}", password_file.display()));
        let output = run_bounded(initdb, None, Duration::from_secs(120));
        let _ = std::fs::remove_file(&password_file);
        assert!(
            output.status.success(),
            "initdb failed: {}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        let conf = self.data_dir().join("postgresql.conf");
        let mut file = std::fs::OpenOptions::new().append(true).open(&conf).expect("open postgresql.conf");
        writeln!(file, "\ninclude 'jobcenter.conf'").expect("write postgresql.conf");
        if self.host != "127.0.0.1" {
            // On a test host: clients and replicas come from other hosts.
            let hba = self.data_dir().join("pg_hba.conf");
            let mut file = std::fs::OpenOptions::new().append(true).open(&hba).expect("open pg_hba.conf");
            writeln!(file, "host all all 0.0.0.0/0 scram-sha-256\nhost replication all 0.0.0.0/0 scram-sha-256")
                .expect("write pg_hba.conf");
        }
    }

    /// Writes the settings, on a new free port each time, until the server
    /// starts (another process may take the port between the check and the bind).
    fn start_on_free_port(mut self) -> PgCluster {
        let mut failures = Vec::new();
        for _ in 0..3 {
            self.port = free_port();
            self.write_settings();
            match self.pg_ctl_start() {
                Ok(()) => {
                    self.wait_ready();
                    return self;
                }
                Err(log) if log.contains("could not bind") || log.contains("could not create any TCP/IP sockets") => {
                    failures.push(log)
                }
                Err(log) => panic!("PostgreSQL did not start:\n{log}"),
            }
        }
        panic!("PostgreSQL found no free port:\n{}", failures.join("\n---\n"));
    }

    fn write_settings(&self) {
        let settings = format!(
            "# Written by the test harness (tests/it/support/postgres.rs).\n\
             listen_addresses = '{host}'\n\
             port = {port}\n\
             unix_socket_directories = '{socket}'\n\
             max_connections = 200\n\
             shared_buffers = '128MB'\n\
             huge_pages = off\n\
             fsync = on\n\
             synchronous_commit = on\n\
             full_page_writes = on\n\
             log_min_messages = warning\n\
             log_line_prefix = '%m [%p] %q%u@%d '\n\
             lc_messages = 'C'\n\
             timezone = 'UTC'\n",
            host = self.host,
            port = self.port,
            socket = self.socket_dir().display(),
        );
        let path = self.data_dir().join("jobcenter.conf");
        std::fs::write(&path, settings).expect("write jobcenter.conf");
        give_to_server(&path);
    }

    /// `pg_ctl start`, waiting (bounded) until the server is ready; the log on failure.
    fn pg_ctl_start(&self) -> Result<(), String> {
        let mut pg_ctl = self.wrapped(server_command("pg_ctl"));
        pg_ctl.current_dir(self.dir.path()).args(["start", "-s", "-w", "-t", &WAIT.as_secs().to_string()]);
        pg_ctl.arg("-D").arg(self.data_dir()).arg("-l").arg(self.log_path());
        let output = run_bounded(pg_ctl, None, WAIT + Duration::from_secs(10));
        if output.status.success() {
            return Ok(());
        }
        Err(format!(
            "pg_ctl start: {}{}\nserver log:\n{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr),
            self.log()
        ))
    }

    /// `command` run under the wrapper, if the server runs on a test host.
    fn wrapped(&self, command: Command) -> Command {
        let Some((program, rest)) = self.wrapper.split_first() else { return command };
        let mut wrapped = Command::new(program);
        wrapped.args(rest).arg(command.get_program()).args(command.get_args());
        for (key, value) in command.get_envs() {
            match value {
                Some(value) => wrapped.env(key, value),
                None => wrapped.env_remove(key),
            };
        }
        if let Some(dir) = command.get_current_dir() {
            wrapped.current_dir(dir);
        }
        wrapped
    }

    /// Waits until `select 1` runs over TCP with the password.
    fn wait_ready(&self) {
        let mut last = String::new();
        let ready = wait_for(WAIT, || match try_psql(&self.conninfo("postgres"), Some(&self.password), "select 1") {
            Ok(out) if out == "1" => Some(()),
            Ok(out) => {
                last = out;
                None
            }
            Err(e) => {
                last = e;
                None
            }
        });
        if ready.is_none() {
            panic!(
                "PostgreSQL on port {} did not accept connections within {WAIT:?}: {last}\nserver log:\n{}",
                self.port,
                self.log()
            );
        }
    }

    /// The temporary directory holding everything of this cluster.
    pub fn root(&self) -> &Path {
        self.dir.path()
    }

    pub fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    pub fn socket_dir(&self) -> PathBuf {
        self.dir.path().join("socket")
    }

    pub fn log_path(&self) -> PathBuf {
        self.dir.path().join("postgres.log")
    }

    /// The server's log so far (warnings and errors).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn password(&self) -> &str {
        &self.password
    }

    /// `postgres://jobcenter:PASSWORD@HOST:PORT/DATABASE`
    pub fn url(&self, database: &str) -> String {
        self.url_as(SUPERUSER, Some(&self.password), database)
    }

    /// `postgres://jobcenter@HOST:PORT/DATABASE`
    pub fn url_without_password(&self, database: &str) -> String {
        self.url_as(SUPERUSER, None, database)
    }

    /// `postgres://USER[:PASSWORD]@HOST:PORT/DATABASE`, each part percent-encoded.
    pub fn url_as(&self, user: &str, password: Option<&str>, database: &str) -> String {
        let password = password.map(|p| format!(":{}", url_encode(p))).unwrap_or_default();
        format!("postgres://{}{password}@{}:{}/{}", url_encode(user), self.host, self.port, url_encode(database))
    }

    /// `host=HOST port=PORT user=jobcenter dbname=DATABASE`, without the
    /// password, to extend with more `key=value` pairs (`sslmode=...`).
    pub fn conninfo(&self, database: &str) -> String {
        format!("host={} port={} user={SUPERUSER} dbname={}", self.host, self.port, conninfo_value(database))
    }

    /// Runs `sql` as the superuser over the unix socket and returns stdout
    /// (unaligned, tuples only, no trailing newline); panics with stderr if
    /// a statement fails. Statements run one by one, each in its own
    /// transaction unless the SQL says `BEGIN`.
    pub fn psql(&self, database: &str, sql: &str) -> String {
        let conninfo = format!(
            "host={} port={} user={SUPERUSER} dbname={}",
            conninfo_value(&self.socket_dir().display().to_string()),
            self.port,
            conninfo_value(database)
        );
        try_psql(&conninfo, None, sql).unwrap_or_else(|e| panic!("psql on {database} failed: {e}\nSQL: {sql}"))
    }

    /// Creates database `name` and returns its URL.
    pub fn create_database(&self, name: &str) -> String {
        self.psql("postgres", &format!("CREATE DATABASE {}", quote_identifier(name)));
        self.url(name)
    }

    /// Creates a database with a name unique in this cluster and returns the name.
    pub fn new_database(&self) -> String {
        let name = format!("test_{}", self.databases.fetch_add(1, Ordering::SeqCst));
        self.create_database(&name);
        name
    }

    /// Creates a login role with no privilege beyond what PUBLIC has (it may
    /// connect; since PostgreSQL 15 it may not create in schema `public`),
    /// runs `grants` (SQL, may be empty) as the superuser in `database`, and
    /// returns the role's URL for `database`.
    pub fn create_role(&self, name: &str, password: &str, database: &str, grants: &str) -> String {
        self.psql(
            "postgres",
            &format!(
                "CREATE ROLE {} LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION PASSWORD {}",
                quote_identifier(name),
                quote_literal(password)
            ),
        );
        if !grants.trim().is_empty() {
            self.psql(database, grants);
        }
        self.url_as(name, Some(password), database)
    }

    /// Stops the server (`pg_ctl stop -m fast|immediate`), waiting until it
    /// has exited. The directory and the port stay for [`start_again`](Self::start_again).
    pub fn stop(&self, mode: Shutdown) {
        let output = self.pg_ctl_stop(mode);
        assert!(
            output.status.success(),
            "pg_ctl stop -m {} failed: {}{}\nserver log:\n{}",
            mode.mode(),
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr),
            self.log()
        );
    }

    fn pg_ctl_stop(&self, mode: Shutdown) -> Output {
        let mut pg_ctl = server_command("pg_ctl");
        pg_ctl.current_dir(self.dir.path()).args(["stop", "-s", "-w", "-t", &WAIT.as_secs().to_string()]);
        pg_ctl.args(["-m", mode.mode()]).arg("-D").arg(self.data_dir());
        run_bounded(pg_ctl, None, WAIT + Duration::from_secs(10))
    }

    /// Starts the stopped server again on the same directory and port (after
    /// an immediate stop it replays the WAL first), and waits until it is ready.
    pub fn start_again(&self) {
        if let Err(log) = self.pg_ctl_start() {
            panic!("PostgreSQL did not start again on port {}:\n{log}", self.port);
        }
        self.wait_ready();
    }

    /// Whether the server runs (`pg_ctl status`).
    pub fn is_running(&self) -> bool {
        let mut pg_ctl = server_command("pg_ctl");
        pg_ctl.current_dir(self.dir.path()).args(["status", "-D"]).arg(self.data_dir());
        run_bounded(pg_ctl, None, WAIT).status.success()
    }

    /// The postmaster's pid, from `postmaster.pid`, while the server runs.
    pub fn postmaster_pid(&self) -> Option<u32> {
        let text = std::fs::read_to_string(self.data_dir().join("postmaster.pid")).ok()?;
        text.lines().next()?.trim().parse().ok()
    }

    /// The postmaster (first) and its children (checkpointer, backends, ...).
    pub fn server_processes(&self) -> Vec<ProcessId> {
        let Some(postmaster) = self.postmaster_pid() else { return Vec::new() };
        let mut processes: Vec<ProcessId> = ProcessId::of(postmaster).into_iter().collect();
        for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let Some(pid) = entry.file_name().to_str().and_then(|name| name.parse::<u32>().ok()) else { continue };
            if parent_of(pid) == Some(postmaster) {
                processes.extend(ProcessId::of(pid));
            }
        }
        processes
    }

    /// Turns TLS on: a fresh CA and a server certificate for `127.0.0.1`
    /// and `localhost` (`server.crt`, `server.key` with mode 0600 in the data
    /// directory), `ALTER SYSTEM SET ssl = on`, a reload; returns once a
    /// `sslmode=verify-full` connection works, with the CA certificate's
    /// path (for `sslrootcert`). Plain connections are still accepted until
    /// [`require_tls`](Self::require_tls).
    pub fn enable_tls(&self) -> PathBuf {
        use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
        let ca_key = KeyPair::generate().expect("generate the CA key");
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("CA parameters");
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params.distinguished_name.push(DnType::CommonName, "jobcenter test PostgreSQL CA");
        let ca_cert = ca_params.self_signed(&ca_key).expect("sign the CA certificate");
        let issuer = Issuer::new(ca_params, ca_key);
        let server_key = KeyPair::generate().expect("generate the server key");
        let mut server_params = CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()])
            .expect("server certificate parameters");
        server_params.distinguished_name.push(DnType::CommonName, "127.0.0.1");
        let server_cert = server_params.signed_by(&server_key, &issuer).expect("sign the server certificate");

        let ca_path = self.dir.path().join("ca.crt");
        std::fs::write(&ca_path, ca_cert.pem()).expect("write ca.crt");
        for (name, contents, mode) in
            [("server.crt", server_cert.pem(), 0o644), ("server.key", server_key.serialize_pem(), 0o600)]
        {
            let path = self.data_dir().join(name);
            std::fs::write(&path, contents).unwrap_or_else(|e| panic!("write {name}: {e}"));
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).expect("chmod");
            give_to_server(&path);
        }
        self.psql("postgres", "ALTER SYSTEM SET ssl = on;\nSELECT pg_reload_conf();");
        let conninfo = format!("{} sslmode=verify-full sslrootcert={}", self.conninfo("postgres"), ca_path.display());
        let mut last = String::new();
        let on = wait_for(WAIT, || match try_psql(&conninfo, Some(&self.password), "select 1") {
            Ok(_) => Some(()),
            Err(e) => {
                last = e;
                None
            }
        });
        if on.is_none() {
            panic!("TLS did not come up within {WAIT:?}: {last}\nserver log:\n{}", self.log());
        }
        *self.ca_certificate.lock().unwrap() = Some(ca_path.clone());
        ca_path
    }

    /// The CA certificate of [`enable_tls`](Self::enable_tls), once it ran.
    pub fn ca_certificate(&self) -> Option<PathBuf> {
        self.ca_certificate.lock().unwrap().clone()
    }

    /// Accepts TCP connections over TLS only (`hostssl` lines in
    /// `pg_hba.conf`; the unix socket stays `trust`), and returns once a
    /// `sslmode=disable` connection is refused. Call [`enable_tls`](Self::enable_tls) first.
    pub fn require_tls(&self) {
        assert!(self.ca_certificate().is_some(), "require_tls needs enable_tls first");
        let hba = "# Written by the test harness (tests/it/support/postgres.rs): TLS only over TCP.\n\
                   local   all  all                 trust\n\
                   hostssl all  all  127.0.0.1/32   scram-sha-256\n\
                   hostssl all  all  ::1/128        scram-sha-256\n";
        // Writing into the existing file keeps its owner and mode.
        std::fs::write(self.data_dir().join("pg_hba.conf"), hba).expect("write pg_hba.conf");
        self.psql("postgres", "SELECT pg_reload_conf();");
        let plain = format!("{} sslmode=disable", self.conninfo("postgres"));
        let refused = wait_for(WAIT, || try_psql(&plain, Some(&self.password), "select 1").is_err().then_some(()));
        if refused.is_none() {
            panic!("plain connections are still accepted {WAIT:?} after requiring TLS\nserver log:\n{}", self.log());
        }
    }
}

impl Drop for PgCluster {
    /// Closes the watchdog's pipe and waits for it to stop the server and
    /// remove the directory; stops the server itself if the watchdog does not end.
    fn drop(&mut self) {
        drop(self.watchdog.stdin.take());
        let ended = wait_for(WAIT + Duration::from_secs(10), || self.watchdog.try_wait().ok().flatten());
        if ended.is_none() {
            let _ = self.watchdog.kill();
            let _ = self.watchdog.wait();
            let mut pg_ctl = server_command("pg_ctl");
            pg_ctl
                .current_dir("/")
                .args(["stop", "-s", "-w", "-t", "10", "-m", "immediate", "-D"])
                .arg(self.data_dir());
            let _ = pg_ctl.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null()).status();
        }
    }
}

/// Starts the watchdog of the cluster in `dir`: it waits for its stdin (a
/// pipe only this process writes to) to close, then stops the server in
/// `dir/data` and removes `dir`. It runs in its own process group and
/// ignores SIGINT, SIGTERM and SIGHUP, so a Ctrl-C that ends the tests does
/// not end it first.
fn start_watchdog(dir: &Path) -> Child {
    const SCRIPT: &str = r#"trap '' INT TERM HUP
dir=$1
shift
cat >/dev/null 2>&1
"$@" >/dev/null 2>&1
rm -rf "$dir"
"#;
    let mut command = Command::new("/bin/sh");
    command.args(["-c", SCRIPT, "jobcenter-pg-watchdog"]).arg(dir);
    if server_user().is_some() {
        command.arg(runuser()).args(["-u", "postgres", "--"]);
    }
    command
        .arg(program("pg_ctl"))
        .args(["stop", "-s", "-w", "-t", "20", "-m", "immediate", "-D"])
        .arg(dir.join("data"));
    clean_env(&mut command);
    command.current_dir("/").stdin(Stdio::piped()).stdout(Stdio::null()).stderr(Stdio::null()).process_group(0);
    command.spawn().expect("start the PostgreSQL watchdog")
}
