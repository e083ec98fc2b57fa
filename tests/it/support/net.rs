//! Several hosts on one machine, for the tests that cross a network: each
//! host is a network namespace with an address of its own, and a router
//! namespace joins them, one veth pair per host. The test process itself is
//! one more host (its namespace is the machine's), so it reaches every other
//! host by its address while nothing else does.
//!
//! Faults are made where a real network makes them, in the router, so that
//! the hosts' own stacks see nothing but silence: [`Network::cut`] takes a
//! host's link down at the router (its process lives on, its packets go
//! nowhere, its connections stall), and [`Network::block`] drops packets
//! from one address to another with a `blackhole` routing rule, one way or,
//! with [`Network::partition`], both. A connection across a block stalls; a
//! new one times out. Nothing leaves the addresses the network made.
//!
//! Making namespaces needs root and iproute2's `ip`: a test that cannot
//! make them panics with one line saying so, it is never skipped. No
//! namespace outlives its test process: a watchdog, a small `sh` in its own
//! process group that ignores SIGINT, SIGTERM and SIGHUP, deletes them once
//! the pipe from the test process closes, however the process ended.
//!
//! It needs nothing from the rest of the harness.
#![allow(dead_code)]

use std::ffi::OsStr;
use std::io::Write;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;

/// A router and the hosts joined to it; removed when dropped.
pub struct Network {
    /// Prefix of every namespace name of this network.
    prefix: String,
    /// The second octet: hosts are `10.OCTET.K.2`, their gateways `10.OCTET.K.1`.
    octet: u8,
    router: String,
    /// The machine's end of the test process's link.
    root_link: String,
    hosts: Mutex<Vec<String>>,
    rules: Mutex<Vec<(String, String)>>,
    watchdog: Child,
}

/// One host: a namespace and its address.
#[derive(Clone, Debug)]
pub struct Host {
    pub name: String,
    pub namespace: String,
    /// Its address, such as `10.117.3.2`.
    pub address: String,
    /// Its link's name in the router.
    link: String,
}

impl Host {
    /// `program` run in this host's namespace (`ip netns exec NS program`):
    /// `ip` execs it, so the child's pid is the program's.
    pub fn command(&self, program: impl AsRef<OsStr>) -> Command {
        let mut command = Command::new("ip");
        command.args(["netns", "exec", &self.namespace]).arg(program);
        command
    }

    /// The words that run a program in this host's namespace, for wrappers.
    pub fn wrapper(&self) -> Vec<String> {
        vec!["ip".into(), "netns".into(), "exec".into(), self.namespace.clone()]
    }

    /// `ADDRESS:PORT` on this host.
    pub fn at(&self, port: u16) -> String {
        format!("{}:{port}", self.address)
    }
}

impl Network {
    /// A router namespace, with the test process's own host attached.
    pub fn new() -> Network {
        static NETWORKS: AtomicU32 = AtomicU32::new(0);
        let n = NETWORKS.fetch_add(1, Ordering::SeqCst);
        let pid = std::process::id();
        let prefix = format!("jc{pid}n{n}");
        let octet = free_octet(pid, n);
        let router = format!("{prefix}-router");
        let root_link = format!("jcr{octet}");
        let watchdog = start_watchdog(&prefix, &root_link);
        let network = Network {
            prefix,
            octet,
            router: router.clone(),
            root_link: root_link.clone(),
            hosts: Mutex::new(Vec::new()),
            rules: Mutex::new(Vec::new()),
            watchdog,
        };
        ip(&["netns", "add", &router]);
        ip(&["-n", &router, "link", "set", "lo", "up"]);
        run(Command::new("ip").args(["netns", "exec", &router, "sysctl", "-qw", "net.ipv4.ip_forward=1"]));
        // The test process's link: host 1, in the machine's namespace.
        ip(&["link", "add", &root_link, "type", "veth", "peer", "name", "h1", "netns", &router]);
        ip(&["-n", &router, "addr", "add", &format!("10.{octet}.1.1/24"), "dev", "h1"]);
        ip(&["-n", &router, "link", "set", "h1", "up"]);
        ip(&["addr", "add", &format!("10.{octet}.1.2/24"), "dev", &root_link]);
        ip(&["link", "set", &root_link, "up"]);
        ip(&["route", "add", &format!("10.{octet}.0.0/16"), "via", &format!("10.{octet}.1.1")]);
        network
    }

    /// The test process's own address on this network.
    pub fn here(&self) -> String {
        format!("10.{}.1.2", self.octet)
    }

    /// A new host named `name`, with its link up.
    pub fn host(&self, name: &str) -> Host {
        let mut hosts = self.hosts.lock().unwrap();
        let k = hosts.len() + 2;
        assert!(k < 250, "a network holds at most 248 hosts");
        let namespace = format!("{}-{name}", self.prefix);
        let link = format!("h{k}");
        ip(&["netns", "add", &namespace]);
        hosts.push(namespace.clone());
        ip(&["-n", &namespace, "link", "set", "lo", "up"]);
        ip(&["-n", &namespace, "link", "add", "eth0", "type", "veth", "peer", "name", &link, "netns", &self.router]);
        let address = format!("10.{}.{k}.2", self.octet);
        ip(&["-n", &self.router, "addr", "add", &format!("10.{}.{k}.1/24", self.octet), "dev", &link]);
        ip(&["-n", &self.router, "link", "set", &link, "up"]);
        ip(&["-n", &namespace, "addr", "add", &format!("{address}/24"), "dev", "eth0"]);
        ip(&["-n", &namespace, "link", "set", "eth0", "up"]);
        ip(&["-n", &namespace, "route", "add", "default", "via", &format!("10.{}.{k}.1", self.octet)]);
        Host { name: name.into(), namespace, address, link }
    }

    /// Takes `host`'s link down at the router: its processes live on, what
    /// they send is lost, nothing reaches them.
    pub fn cut(&self, host: &Host) {
        ip(&["-n", &self.router, "link", "set", &host.link, "down"]);
    }

    /// Brings `host`'s link up again.
    pub fn heal(&self, host: &Host) {
        ip(&["-n", &self.router, "link", "set", &host.link, "up"]);
    }

    /// Drops every packet from `from` to `to` (one way).
    pub fn block(&self, from: &str, to: &str) {
        ip(&["-n", &self.router, "rule", "add", "from", from, "to", to, "blackhole"]);
        self.rules.lock().unwrap().push((from.to_string(), to.to_string()));
    }

    /// Drops every packet between any address of `a` and any of `b`, both ways.
    pub fn partition(&self, a: &[&str], b: &[&str]) {
        for x in a {
            for y in b {
                self.block(x, y);
                self.block(y, x);
            }
        }
    }

    /// Removes every block.
    pub fn unblock_all(&self) {
        for (from, to) in self.rules.lock().unwrap().drain(..) {
            ip(&["-n", &self.router, "rule", "del", "from", &from, "to", &to, "blackhole"]);
        }
    }
}

impl Drop for Network {
    /// Closes the watchdog's pipe and waits for it to remove the namespaces.
    fn drop(&mut self) {
        drop(self.watchdog.stdin.take());
        let _ = self.watchdog.wait();
    }
}

/// A second octet whose `10.OCTET.0.0/16` no route of the machine's
/// namespace covers, spread by process so that concurrent test processes
/// seldom meet.
fn free_octet(pid: u32, n: u32) -> u8 {
    let routes = String::from_utf8_lossy(&run(Command::new("ip").args(["-4", "route", "show"]))).to_string();
    for i in 0..100u32 {
        let octet = 100 + ((pid.wrapping_mul(7) + n * 13 + i) % 100) as u8;
        let taken = routes.lines().any(|route| route.starts_with(&format!("10.{octet}.")));
        let link_taken = std::path::Path::new(&format!("/sys/class/net/jcr{octet}")).exists();
        if !taken && !link_taken {
            return octet;
        }
    }
    panic!("no free 10.X.0.0/16 among 10.100 to 10.199 for a test network");
}

/// Runs `ip ARGS`, panicking in one line if it fails.
fn ip(args: &[&str]) {
    run(Command::new("ip").args(args));
}

fn run(command: &mut Command) -> Vec<u8> {
    let output = command
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("network namespaces are needed and `ip` (iproute2) cannot run: {e}"));
    if !output.status.success() {
        panic!(
            "network namespaces are needed (root and iproute2): {command:?} failed: {}",
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    output.stdout
}

/// Starts the watchdog of the namespaces named `PREFIX-*`: once its stdin
/// (a pipe only this process writes to) closes, it kills what still runs in
/// them and deletes them, and the machine's end of the test process's link.
fn start_watchdog(prefix: &str, root_link: &str) -> Child {
    const SCRIPT: &str = r#"trap '' INT TERM HUP
prefix=$1
link=$2
cat >/dev/null 2>&1
for ns in $(ip netns list | awk '{print $1}' | grep "^$prefix-"); do
    for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$pid" 2>/dev/null; done
    ip netns del "$ns" 2>/dev/null
done
ip link del "$link" 2>/dev/null
exit 0
"#;
    let mut child = Command::new("/bin/sh")
        .args(["-c", SCRIPT, "jobcenter-net-watchdog", prefix, root_link])
        .current_dir("/")
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn()
        .unwrap_or_else(|e| panic!("network namespaces are needed and their watchdog cannot start: {e}"));
    // Nothing is written; the pipe only has to stay open.
    let _ = child.stdin.as_mut().map(|stdin| stdin.flush());
    child
}
