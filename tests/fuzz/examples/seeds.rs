//! Writes the seed corpus of every fuzz target (`corpus/<target>/`): the
//! repository's example job files and a few refused ones, message
//! sequences a worker and a peer instance send (good and hostile), and
//! real encoded records, groups, specs and journal frames.
//!
//!     cargo run --manifest-path tests/fuzz/Cargo.toml --example seeds -- tests/fuzz/corpus

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use jobcenter::clock::Timestamp;
use jobcenter::jobfile::{self, Format, Limits};
use jobcenter::model::{End, HandlerId, Hold, JobId, JobOrigin, JobRecord, JobState, LastAttempt, Phase, TaskRecord};
use jobcenter::proto::peer::{
    peer_report, DedupeKeysRequest, FreeSlots, KnowsRequest, LendRequest, PeerCancel, PeerGiveUp, PeerOutcome,
    PeerProgress, PeerReport,
};
use jobcenter::proto::plugin::{
    worker_to_admin_message::Body, ActivityEvent, ConfigSchemaResponse, ConfigValue, DetectionComplete,
    DetectionProposals, JobCompleted, JobProgressUpdate, JobResult, JobTypeCapability, JobTypeDescriptor, RunningWork,
    WorkerHeartbeat, WorkerHello, WorkerToAdminMessage,
};
use jobcenter::store::fuzzing::{self as stored, JournalEntry};
use jobcenter_fuzz::frame::{self, PLACEHOLDER_JOB};
use jobcenter_fuzz::peer::Call;

fn write(dir: &Path, target: &str, name: &str, bytes: &[u8]) {
    let dir = dir.join(target);
    std::fs::create_dir_all(&dir).expect("a corpus directory");
    std::fs::write(dir.join(name), bytes).expect("a seed is written");
}

fn main() {
    let dir: PathBuf = std::env::args().nth(1).unwrap_or_else(|| "tests/fuzz/corpus".into()).into();
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    jobfiles(&dir, &root);
    worker_stream(&dir);
    store_codec(&dir, &root);
    peer(&dir);
}

/// A job file seed: the format's choice byte (with the high bit, the tight limits), then the document.
fn job_seed(format: u8, tight: bool, document: &[u8]) -> Vec<u8> {
    let mut seed = vec![format | if tight { 0x80 } else { 0 }];
    seed.extend_from_slice(document);
    seed
}

fn jobfiles(dir: &Path, root: &Path) {
    for name in ["maintenance.json", "nine-tasks.json", "nine-tasks-fail.json", "seaweedfs-maintenance.json"] {
        let document = std::fs::read(root.join("examples").join(name)).expect("an example job file");
        write(dir, "jobfile", name, &job_seed(0, false, &document));
    }
    let toml = std::fs::read(root.join("examples/maintenance-fails.toml")).expect("the TOML example");
    write(dir, "jobfile", "maintenance-fails.toml", &job_seed(1, false, &toml));
    write(dir, "jobfile", "maintenance-fails-tight.toml", &job_seed(1, true, &toml));
    let yaml = "name: yaml\ntasks:\n  - id: a\n    job_type: noop\n    parameters: {n: 1, list: [1, 2.5, x]}\n  - id: b\n    job_type: shell\n    depends_on: [a]\n    priority: high\n    labels: {node: n1, size: 3, ok: true}\n    retry_limit: 2\n    execution_timeout_seconds: 60\n";
    write(dir, "jobfile", "two-tasks.yaml", &job_seed(2, false, yaml.as_bytes()));
    write(dir, "jobfile", "two-tasks-tight.yaml", &job_seed(2, true, yaml.as_bytes()));
    let refused: [(&str, u8, &str); 8] = [
        ("cycle.json", 0, r#"{"name":"loop","tasks":[{"id":"a","job_type":"noop","depends_on":["b"]},{"id":"b","job_type":"noop","depends_on":["a"]}]}"#),
        ("problems.json", 0, r#"{"name":"","tasks":[{"id":"a b","job_type":"../x","depends_on":["a b","zz"],"parameters":[1],"labels":{"":1,"k":[]}},{"id":"a b","job_type":"noop"}]}"#),
        ("unknown-field.json", 0, r#"{"name":"x","tasks":[{"id":"a","job_type":"noop","retries":3}]}"#),
        ("truncated.json", 0, r#"{"name":"x","tasks":[{"id":"a","#),
        ("deep.json", 0, &format!(r#"{{"name":"x","tasks":[{{"id":"a","job_type":"noop","parameters":{{"p":{}1{}}}}}]}}"#, "[".repeat(40), "]".repeat(40))),
        ("bad-syntax.toml", 1, "name = \"x\"\n[[tasks]\nid = 1\n"),
        ("wrong-type.toml", 1, "name = \"x\"\n[[tasks]]\nid = \"a\"\njob_type = \"noop\"\nretry_limit = \"three\"\n"),
        ("duplicate.yaml", 2, "name: d\ntasks:\n  - {id: a, job_type: noop}\n  - {id: a, job_type: noop, depends_on: [a]}\n  - id: c\n    job_type: noop\n    priority: urgent\n"),
    ];
    for (name, format, document) in refused {
        write(dir, "jobfile", name, &job_seed(format, false, document.as_bytes()));
    }
    write(
        dir,
        "jobfile",
        "tight-limits.json",
        &job_seed(0, true, std::fs::read(root.join("examples/nine-tasks.json")).expect("example").as_slice()),
    );
}

fn message(body: Body) -> WorkerToAdminMessage {
    WorkerToAdminMessage { worker_id: "seed".into(), sent_at: None, body: Some(body) }
}

fn hello(job_types: &[&str], metadata: &[(&str, &str)]) -> WorkerToAdminMessage {
    message(Body::Hello(WorkerHello {
        worker_id: "seed-worker".into(),
        worker_instance_id: "5eed0000-0000-4000-8000-000000000001".into(),
        address: "10.0.0.7:7000".into(),
        worker_version: "seed".into(),
        capabilities: job_types
            .iter()
            .map(|t| JobTypeCapability {
                job_type: (*t).into(),
                can_detect: true,
                can_execute: true,
                max_detection_concurrency: 1,
                max_execution_concurrency: 2,
                ..JobTypeCapability::default()
            })
            .collect(),
        metadata: metadata.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
        ..WorkerHello::default()
    }))
}

fn attempt(idx: u32, attempt: u32) -> String {
    format!("{PLACEHOLDER_JOB}.{idx}.{attempt}")
}

fn heartbeat(running: &[String]) -> WorkerToAdminMessage {
    message(Body::Heartbeat(WorkerHeartbeat {
        worker_id: "seed-worker".into(),
        running_work: running
            .iter()
            .map(|id| RunningWork {
                work_id: id.clone(),
                job_type: "noop".into(),
                progress_percent: 10.0,
                ..RunningWork::default()
            })
            .collect(),
        execution_slots_used: running.len() as i32,
        execution_slots_total: 2,
        ..WorkerHeartbeat::default()
    }))
}

fn progress(job_id: String, percent: f64, stage: &str) -> WorkerToAdminMessage {
    message(Body::JobProgressUpdate(JobProgressUpdate {
        job_id,
        job_type: "noop".into(),
        progress_percent: percent,
        stage: stage.into(),
        message: "half way".into(),
        ..JobProgressUpdate::default()
    }))
}

fn completed(job_id: String, success: bool, error: &str, lines: &[&str]) -> WorkerToAdminMessage {
    let output = ConfigValue {
        kind: Some(jobcenter::proto::plugin::config_value::Kind::StringList(jobcenter::proto::plugin::StringList {
            values: lines.iter().map(|l| l.to_string()).collect(),
        })),
    };
    message(Body::JobCompleted(JobCompleted {
        job_id,
        job_type: "noop".into(),
        success,
        error_message: error.into(),
        result: Some(JobResult {
            output_values: BTreeMap::from([("output".to_string(), output)]),
            summary: "done".into(),
        }),
        activities: vec![ActivityEvent { stage: "copy".into(), message: "copied".into(), ..ActivityEvent::default() }],
        ..JobCompleted::default()
    }))
}

fn worker_stream(dir: &Path) {
    let seeds: Vec<(&str, Vec<WorkerToAdminMessage>)> = vec![
        (
            "runs-its-tasks",
            vec![
                hello(&["noop"], &[]),
                heartbeat(&[attempt(1, 1)]),
                progress(attempt(1, 1), 50.0, "copying"),
                completed(attempt(1, 1), true, "", &["line one", "line two"]),
                completed(attempt(3, 1), false, "disk full", &[]),
                progress(attempt(2, 1), 10.0, "starting"),
                completed(attempt(2, 1), true, "", &[]),
            ],
        ),
        (
            "completes-another-workers-attempt",
            vec![hello(&["noop"], &[]), completed(attempt(0, 1), true, "", &["forged"])],
        ),
        ("progress-on-another-workers-attempt", vec![hello(&["noop"], &[]), progress(attempt(0, 1), 99.0, "forged")]),
        ("heartbeat-before-hello", vec![heartbeat(&[])]),
        ("hello-twice", vec![hello(&["noop"], &[]), hello(&["noop"], &[])]),
        ("empty-body", vec![hello(&["noop"], &[]), WorkerToAdminMessage::default()]),
        ("bad-job-type", vec![hello(&["../etc"], &[])]),
        ("no-identity", vec![message(Body::Hello(WorkerHello::default()))]),
        (
            "lease-and-running-work",
            vec![
                hello(&["noop"], &[("jobcenter.lease_ms", "2000"), ("rack", "r1")]),
                heartbeat(&[attempt(0, 1), attempt(1, 1), "not-an-attempt".into()]),
                completed(attempt(1, 1), true, "", &[]),
                completed(attempt(3, 1), false, jobcenter::wire::AT_CAPACITY, &[]),
            ],
        ),
        ("lease-too-long", vec![hello(&["noop"], &[("jobcenter.lease_ms", "99999999")])]),
        ("lease-not-a-number", vec![hello(&["noop"], &[("jobcenter.lease_ms", "soon")])]),
        (
            "gives-up",
            vec![
                hello(&["noop"], &[]),
                completed(attempt(1, 1), false, jobcenter::wire::LEASE_EXPIRED, &[]),
                completed(attempt(3, 1), false, jobcenter::wire::STOPPING, &[]),
            ],
        ),
        (
            "schema-answers",
            vec![
                hello(&["noop"], &[]),
                message(Body::ConfigSchemaResponse(ConfigSchemaResponse {
                    request_id: "schema-1".into(),
                    job_type: "noop".into(),
                    success: true,
                    job_type_descriptor: Some(JobTypeDescriptor {
                        job_type: "noop".into(),
                        ..JobTypeDescriptor::default()
                    }),
                    ..ConfigSchemaResponse::default()
                })),
                message(Body::ConfigSchemaResponse(ConfigSchemaResponse {
                    request_id: "unasked".into(),
                    job_type: "vacuum".into(),
                    success: true,
                    job_type_descriptor: Some(JobTypeDescriptor {
                        job_type: "vacuum".into(),
                        ..JobTypeDescriptor::default()
                    }),
                    ..ConfigSchemaResponse::default()
                })),
            ],
        ),
        (
            "detection-with-no-request",
            vec![
                hello(&["noop"], &[]),
                message(Body::DetectionProposals(DetectionProposals {
                    request_id: "detect-1".into(),
                    ..DetectionProposals::default()
                })),
                message(Body::DetectionComplete(DetectionComplete {
                    request_id: "detect-1".into(),
                    success: true,
                    ..DetectionComplete::default()
                })),
                progress(String::new(), 0.0, "detecting"),
            ],
        ),
        (
            "out-of-range-reports",
            vec![
                hello(&["noop"], &[]),
                progress(attempt(1, 1), f64::NAN, &"s".repeat(600)),
                progress(attempt(3, 1), 1e12, "beyond"),
                completed(attempt(1, 1), false, &"e".repeat(5000), &["x".repeat(1500).as_str()]),
            ],
        ),
        (
            "unknown-job",
            vec![
                hello(&["noop"], &[]),
                progress("0f0f0f0f-0000-4000-8000-000000000000.0.1".into(), 1.0, "x"),
                completed("7.7.7".into(), true, "", &[]),
            ],
        ),
        ("completion-before-work", vec![hello(&["other"], &[]), completed(attempt(1, 1), true, "", &[])]),
    ];
    for (name, messages) in seeds {
        write(dir, "worker_stream", name, &frame::encode(&messages));
    }
}

fn record(seed: u32) -> TaskRecord {
    let mut task = TaskRecord::initial(seed.is_multiple_of(2), Timestamp(1_700_000_000_000 + i64::from(seed)));
    let handler = HandlerId(uuid::Uuid::from_u128(0x5eed_0000_0000_4000_8000_0000_0000_0001));
    let at = Timestamp(1_700_000_000_500);
    let hold = Hold { handler, assigned_at: at, started_at: Some(at) };
    let ended = |end| Phase::Ended { end, at };
    task.phase = [Phase::Pending, Phase::Held(hold), ended(End::Succeeded), ended(End::Failed)][seed as usize % 4];
    task.attempt = seed % 5;
    if seed.is_multiple_of(3) {
        task.error = Some(Arc::from(format!("error {seed}").as_str()));
        task.output = vec![Arc::from("a line"), Arc::from(format!("line {seed}").as_str())].into();
        task.progress_percent = 42.5;
        task.stage = Arc::from("copying");
        if task.hold().is_none() {
            task.last_attempt = LastAttempt { handler: Some(handler), assigned_at: Some(at), started_at: Some(at) };
        }
    }
    task
}

fn choice(choice: u8, bytes: &[u8]) -> Vec<u8> {
    let mut seed = vec![choice];
    seed.extend_from_slice(bytes);
    seed
}

/// Pieces as the target reads them: each a 2-byte length, then its bytes.
fn pieces(pieces: &[Vec<u8>]) -> Vec<u8> {
    let mut out = Vec::new();
    for piece in pieces {
        out.extend_from_slice(&(piece.len() as u16).to_le_bytes());
        out.extend_from_slice(piece);
    }
    out
}

fn store_codec(dir: &Path, root: &Path) {
    write(dir, "store_codec", "task-record-initial", &choice(0, &stored::encode(&record(1))));
    write(dir, "store_codec", "task-record-full", &choice(0, &stored::encode(&record(3))));
    let job = JobRecord {
        id: JobId::from_bytes(*uuid::Uuid::from_u128(0x0190_0000_0000_7000_8000_0000_0000_0001).as_bytes()),
        name: "nine".into(),
        state: JobState::Running,
        origin: JobOrigin::Scheduler { job_type: "vacuum".into(), sequence: 7 },
        n_tasks: 9,
        fingerprint: [7; 32],
        created_at: Timestamp(1_700_000_000_000),
        updated_at: Timestamp(1_700_000_001_000),
        finished_at: None,
        cancel_requested: true,
        handler: Some(HandlerId(uuid::Uuid::from_u128(1))),
    };
    write(dir, "store_codec", "job-record", &choice(1, &stored::encode(&job)));
    let group: Vec<(u8, TaskRecord)> = vec![(0, record(0)), (3, record(3)), (31, record(6))];
    write(dir, "store_codec", "task-group", &choice(2, &stored::encode(&group)));
    let changed: Vec<(u8, TaskRecord)> = vec![(3, record(4)), (5, record(5))];
    let again: Vec<(u8, TaskRecord)> = vec![(0, record(9)), (31, record(1))];
    let splice = pieces(&[stored::encode(&group), stored::encode(&changed), stored::encode(&again)]);
    write(dir, "store_codec", "task-group-spliced", &choice(3, &splice));
    let document = std::fs::read(root.join("examples/nine-tasks.json")).expect("an example job file");
    let spec = jobfile::parse(&document, Format::Json, "nine-tasks.json", &Limits::default()).expect("the example");
    let chunks: Vec<Vec<u8>> = stored::encode_spec(&spec).into_iter().map(|(_, chunk)| chunk).collect();
    write(dir, "store_codec", "spec-nine-tasks", &choice(4, &pieces(&chunks)));
    let mut key = job.id.as_bytes().to_vec();
    key.extend_from_slice(&7u32.to_be_bytes());
    write(dir, "store_codec", "task-key", &choice(5, &key));
    let entries = vec![
        JournalEntry {
            seq: 7,
            tree: 1,
            ops: vec![(key.clone(), Some(stored::encode(&group))), (b"gone".to_vec(), None)],
        },
        JournalEntry { seq: 8, tree: 0, ops: vec![(b"settings/x".to_vec(), Some(b"{}".to_vec()))] },
    ];
    let payload = stored::encode_journal_payload(&entries);
    write(dir, "store_codec", "journal-payload", &choice(6, &payload));
    let file = stored::journal_file(3, &[payload.clone(), stored::encode_journal_payload(&entries[1..])]);
    write(dir, "store_codec", "journal-file", &choice(7, &file));
}

fn report(handler: &str, attempt_id: String, kind: peer_report::Kind) -> Call {
    Call::Report(PeerReport { handler: handler.into(), attempt_id, kind: Some(kind) })
}

fn peer(dir: &Path) {
    const X: &str = "0b0b0b0b-0000-4000-8000-00000000000a";
    const Y: &str = "0b0b0b0b-0000-4000-8000-00000000000b";
    let lend = |handler: &str, total: u32, types: &[(&str, u32)]| {
        Call::Lend(LendRequest {
            instance: "0b0b0b0b-0000-4000-8000-000000000001".into(),
            slots: vec![FreeSlots {
                handler: handler.into(),
                total,
                job_types: types.iter().map(|(t, n)| (t.to_string(), *n)).collect::<HashMap<_, _>>(),
            }],
            address: "127.0.0.1:19999".into(),
        })
    };
    let outcome = |success: bool, canceled: bool, error: &str| {
        peer_report::Kind::Outcome(PeerOutcome { success, error: error.into(), output: vec!["out".into()], canceled })
    };
    let give_up = |counted: bool| peer_report::Kind::GiveUp(PeerGiveUp { counted, reason: "lost".into() });
    let progress =
        peer_report::Kind::Progress(PeerProgress { percent: 30.0, stage: "copy".into(), message: "m".into() });
    let seeds: Vec<(&str, Vec<Call>)> = vec![
        (
            "lend-and-report",
            vec![
                lend(X, 2, &[("peer", 2), ("other", 1)]),
                report(X, attempt(0, 1), progress.clone()),
                report(X, attempt(0, 1), outcome(true, false, "")),
                lend(X, 1, &[("peer", 1)]),
                report(X, attempt(1, 1), outcome(false, false, "broke")),
                Call::DedupeKeys(DedupeKeysRequest {}),
            ],
        ),
        (
            "report-from-another-handler",
            vec![lend(X, 1, &[("peer", 1)]), report(Y, attempt(0, 1), outcome(true, false, ""))],
        ),
        ("report-wrong-attempt", vec![lend(X, 1, &[("peer", 1)]), report(X, attempt(0, 2), outcome(true, false, ""))]),
        ("report-unlent", vec![report(X, attempt(2, 1), outcome(false, true, "stop"))]),
        (
            "give-ups",
            vec![
                lend(X, 3, &[("peer", 1), ("other", 1)]),
                report(X, attempt(0, 1), give_up(true)),
                report(X, attempt(2, 1), give_up(false)),
            ],
        ),
        (
            "bad-ids",
            vec![
                lend("not-a-uuid", 1, &[("peer", 1)]),
                report(X, "not.an.attempt".into(), give_up(true)),
                report("nobody", attempt(0, 1), give_up(true)),
            ],
        ),
        (
            "cancel-and-knows",
            vec![
                Call::Cancel(PeerCancel { handler: X.into(), attempt_id: attempt(0, 1), reason: "stop".into() }),
                Call::Knows(KnowsRequest { handler: X.into(), attempt_ids: vec![attempt(0, 1), "x".into()] }),
                Call::Cancel(PeerCancel { handler: "x".into(), attempt_id: String::new(), reason: String::new() }),
            ],
        ),
        ("lend-nothing-offered", vec![lend(X, 0, &[("peer", 5)]), lend(Y, 5, &[]), lend(X, 5, &[("nothing", 5)])]),
        ("empty-report", vec![Call::Report(PeerReport { handler: X.into(), attempt_id: attempt(0, 1), kind: None })]),
    ];
    for (name, calls) in seeds {
        let bytes: Vec<u8> = calls.iter().flat_map(Call::encode).collect();
        write(dir, "peer", name, &bytes);
    }
}
