//! File descriptors on a real server started with a small limit of open
//! files: it raises its soft limit to the hard one, says in `/readyz` when
//! it nears the limit and when it ran out, waits rather than spins while it
//! is out, and takes connections again once some close.

use std::net::TcpStream;
use std::time::{Duration, Instant};

use crate::support::{raw_http, start_worker, wait_until, Server};

/// `/readyz`: its status and its words.
fn readyz(server: &Server) -> (u16, String) {
    let answer = raw_http::request(&server.http, "GET", "/readyz", &[], None);
    (answer.status, answer.body)
}

/// The descriptors a process holds now.
fn open_descriptors(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map(|d| d.count()).unwrap_or(0)
}

/// CPU ticks (user and system) a process has used so far.
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let fields: Vec<&str> = stat.rsplit_once(')').unwrap().1.split_whitespace().collect();
    fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
}

fn max_open_files(pid: u32) -> (u64, u64) {
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    let line = limits.lines().find(|l| l.starts_with("Max open files")).unwrap();
    let numbers: Vec<u64> = line.split_whitespace().filter_map(|w| w.parse().ok()).collect();
    (numbers[0], numbers[1])
}

#[test]
fn a_server_out_of_file_descriptors_says_so_waits_and_takes_connections_again() {
    let dir = tempfile::tempdir().unwrap();
    let server =
        Server::start_wrapped(&["prlimit", "--nofile=64:200", "--"], &dir.path().join("data"), "127.0.0.1:0", &[]);
    let pid = server.process.child.id();
    assert_eq!(max_open_files(pid), (200, 200), "the soft limit is raised to the hard limit");
    let log = || std::fs::read_to_string(&server.log).unwrap_or_default();
    assert!(log().contains("soft limit raised to the hard limit"), "{}", log());
    assert_eq!(readyz(&server), (200, "ready\n".into()));

    // Connections that say nothing, up to nine tenths of the limit: ready, and near it.
    let mut held: Vec<TcpStream> = Vec::new();
    let near = 180;
    while open_descriptors(pid) < near {
        let missing = near - open_descriptors(pid);
        for _ in 0..missing {
            held.push(TcpStream::connect(&server.grpc).unwrap());
        }
        wait_until(Duration::from_secs(10), || (open_descriptors(pid) >= near.min(200)).then_some(()));
    }
    let (status, body) = readyz(&server);
    assert_eq!(status, 200, "{body}");
    assert!(body.starts_with("ready; ") && body.contains("of 200 file descriptors open: near the limit"), "{body}");

    // Past the limit: the server says it is out and waits.
    for _ in 0..40 {
        held.push(TcpStream::connect(&server.grpc).unwrap());
    }
    wait_until(Duration::from_secs(10), || log().contains("out of file descriptors").then_some(()))
        .unwrap_or_else(|| panic!("no warning of descriptors run out: {}", log()));
    let (ticks, at) = (cpu_ticks(pid), Instant::now());
    std::thread::sleep(Duration::from_secs(3));
    let used = cpu_ticks(pid) - ticks;
    // A listener that tried again at once would keep a core busy: 100 ticks a second.
    assert!(used < 60, "{used} CPU ticks in {:?} while out of descriptors: the accept loop spins", at.elapsed());
    assert_eq!(log().matches("cannot accept a connection").count(), 1, "said once, not at every try: {}", log());

    // Some close: the waiting connections are taken, and /readyz says what happened.
    held.truncate(held.len() - 80);
    let (status, body) = readyz(&server);
    assert_eq!(status, 503, "{body}");
    assert!(
        body.starts_with("not ready: out of file descriptors (") && body.contains("of 200 file descriptors open"),
        "{body}"
    );

    // All close: ready again, and a worker connects and runs a job.
    held.clear();
    wait_until(Duration::from_secs(30), || (readyz(&server).0 == 200).then_some(()))
        .expect("ready again once the connections closed");
    let _worker = start_worker(&server, "after", &[], None);
    server.wait_for_workers(1);
    let job = server.submit_file(dir.path(), "after", &crate::support::nine_tasks(None, 0));
    let ended = wait_until(Duration::from_secs(60), || {
        let job = server.cli_json(&["job", &job, "--json"]);
        (job["state"] != "running" && job["state"] != "pending").then_some(job)
    })
    .expect("the job ends");
    assert_eq!(ended["state"], "succeeded", "{ended}");
}
