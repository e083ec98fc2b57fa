//! A full disk under the embedded store: the data directory on a small
//! tmpfs of its own, filled by another writer while a job runs. Writes wait
//! (nothing is acknowledged that is not stored, nothing is dispatched),
//! the log says why in one line, `/readyz` answers 503, the process lives
//! on, and the job goes on as the reference model says, nothing run twice,
//! once the room comes back. Mounting needs root: without it the test fails
//! with one line saying so.

use crate::support;
use crate::support::layered;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use layered::{layered_job, Rng, Work};
use support::{exec_events, executions, start_worker, wait_until, Server};

/// A tmpfs of `megabytes`, unmounted when dropped.
struct Disk {
    path: PathBuf,
}

impl Disk {
    fn mount(path: &Path, megabytes: u32) -> Disk {
        std::fs::create_dir_all(path).unwrap();
        let output = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={megabytes}m"), "tmpfs"])
            .arg(path)
            .output()
            .unwrap_or_else(|e| panic!("a small disk of its own is needed and `mount` cannot run: {e}"));
        assert!(
            output.status.success(),
            "a small disk of its own is needed (mount -t tmpfs, as root): {}",
            String::from_utf8_lossy(&output.stderr).trim()
        );
        Disk { path: path.to_path_buf() }
    }

    fn free(&self) -> u64 {
        let stat = nix::sys::statvfs::statvfs(&self.path).expect("statvfs");
        stat.blocks_available() * stat.fragment_size()
    }

    /// Writes a file of zeros until `leave` bytes are free.
    fn fill(&self, leave: u64) -> PathBuf {
        let path = self.path.join("filler");
        let mut file = std::fs::File::create(&path).unwrap();
        let chunk = vec![0u8; 1 << 20];
        while self.free() > leave {
            let n = ((self.free() - leave) as usize).min(chunk.len());
            if file.write_all(&chunk[..n]).is_err() {
                break;
            }
        }
        file.sync_all().unwrap();
        path
    }
}

impl Drop for Disk {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg("-l").arg(&self.path).status();
    }
}

#[test]
fn a_full_disk_holds_every_write_back_and_the_job_goes_on_once_there_is_room() {
    let dir = tempfile::tempdir().unwrap();
    let disk = Disk::mount(&dir.path().join("disk"), 48);
    let mut server = Server::start(&disk.path.join("data"), &["--min-free-space", "8MiB", "--heartbeat", "1s"]);
    let log = dir.path().join("exec.log");
    let _worker = start_worker(&server, "w", &["--max-execute", "4"], Some(&log));
    server.wait_for_workers(1);
    let job = layered_job(&mut Rng(0xf0_11d1), "full-disk", 3_000, 100, &Work::Sleep { from: 1, spread: 5 });
    let file = dir.path().join("job.json");
    std::fs::write(&file, &job.text).unwrap();
    let id = String::from_utf8(server.cli(&["submit", file.to_str().unwrap()]).stdout).unwrap().trim().to_string();
    wait_until(Duration::from_secs(60), || (exec_events(&log, &id).len() >= 600).then_some(())).expect("the job runs");

    let filler = disk.fill(4 << 20);
    let full = Instant::now();
    let status = || common_status(&server.http);
    wait_until(Duration::from_secs(10), || (status() == Some(503)).then_some(()))
        .unwrap_or_else(|| panic!("/readyz still answers {:?} on a full disk", status()));
    // Nothing goes out meanwhile: what ran ends, nothing new starts.
    std::thread::sleep(Duration::from_secs(2));
    let before = exec_events(&log, &id).iter().filter(|e| e.2 == "start").count();
    // A submission meanwhile is not acknowledged (or, if it is, it is stored).
    let small = dir.path().join("small.json");
    std::fs::write(&small, r#"{"name":"meanwhile","tasks":[{"id":"a","job_type":"noop"}]}"#).unwrap();
    let mut meanwhile = std::process::Command::new(support::binary());
    meanwhile.args(["submit", small.to_str().unwrap(), "--admin", &server.http]);
    let meanwhile = support::wait_with_timeout(
        meanwhile.stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped()).spawn().unwrap(),
        Duration::from_secs(5),
    );
    let after = exec_events(&log, &id).iter().filter(|e| e.2 == "start").count();
    assert_eq!(before, after, "tasks were dispatched while no write could be stored");
    assert!(server.process.is_running(), "the server stopped on a full disk");
    let text = std::fs::read_to_string(&server.log).unwrap();
    assert!(
        text.contains("writes wait until there is room"),
        "no line in the log says why: {}",
        &text[text.len().saturating_sub(1500)..]
    );

    std::fs::remove_file(filler).unwrap();
    let room = Instant::now();
    wait_until(Duration::from_secs(15), || (status() == Some(200)).then_some(()))
        .unwrap_or_else(|| panic!("/readyz answers {:?} with room again", status()));
    let back = room.elapsed();
    let done = wait_until(Duration::from_secs(120), || {
        let done = server.cli_json(&["job", &id, "--json"]);
        matches!(done["state"].as_str(), Some("succeeded" | "failed")).then_some(done)
    })
    .expect("the job ended");
    job.assert_as_modelled(&done);
    let events = exec_events(&log, &id);
    job.assert_each_succeeded_once(&events);
    job.assert_orderly_executions(&done, &events);
    executions(&events);
    let (reruns, _) = job.reruns(&events);
    assert!(reruns.is_empty(), "tasks ran again because of the full disk: {reruns:?}");
    if let Some(output) = meanwhile.filter(|o| o.status.success()) {
        let id = String::from_utf8_lossy(&output.stdout).trim().to_string();
        let stored = server.cli(&["job", &id, "--json"]);
        assert!(stored.status.success(), "the submission acknowledged on a full disk is not stored");
    }
    eprintln!(
        "full disk: not ready, nothing dispatched for {:?}; ready {back:?} after room came back; the job ended as modelled",
        room - full
    );
}

/// `GET /readyz`'s status, if it answers.
fn common_status(address: &str) -> Option<u16> {
    use std::io::Read;
    let mut stream = std::net::TcpStream::connect(address).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(3))).ok()?;
    stream.write_all(b"GET /readyz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").ok()?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer).ok()?;
    answer.split_whitespace().nth(1)?.parse().ok()
}
