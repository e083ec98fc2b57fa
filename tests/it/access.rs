//! Who may do what, on a real server with a credentials file made by
//! `jobcenter credentials add`: every HTTP route and gRPC method answers
//! each role as the table says (401 without a credential, 403 naming the
//! role needed, `UNAUTHENTICATED` and `PERMISSION_DENIED` on gRPC); the
//! file is read again on change and on SIGHUP without a restart, a broken
//! one is refused naming its line and the credentials before it stay;
//! repeated failures slow the answers; and no secret reaches the log.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use jobcenter::server::access::{self, Need, Role, GRPC, HTTP};

use crate::support::{self, raw_http, start_worker, wait_until, Server};

/// A job id no job has.
const NO_JOB: &str = "0190b0c8-0000-7000-8000-000000000000";

/// A credentials file with one credential of each role, made by the CLI;
/// the tokens by role.
fn credentials(dir: &Path, file: &str) -> (PathBuf, BTreeMap<&'static str, String>) {
    let path = dir.join(file);
    let mut tokens = BTreeMap::new();
    for role in Role::ALL {
        tokens.insert(role.name(), add(&path, &format!("{}-1", role.name()), role.name()));
    }
    (path, tokens)
}

/// `jobcenter credentials add NAME --role ROLE --file PATH`: the token it printed.
pub(crate) fn add(path: &Path, name: &str, role: &str) -> String {
    let mut command = std::process::Command::new(support::binary());
    command.args(["credentials", "add", name, "--role", role, "--file", path.to_str().unwrap()]);
    let output = support::run_with_timeout(command, Duration::from_secs(60));
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let token = String::from_utf8(output.stdout).unwrap().trim().to_string();
    assert!(token.starts_with(&format!("{name}.")), "{token}");
    token
}

fn request(server: &Server, method: &str, path: &str, token: Option<&str>) -> raw_http::Answer {
    let bearer = token.map(|t| format!("Bearer {t}"));
    let mut headers = vec![("Content-Type", "application/json")];
    if let Some(bearer) = &bearer {
        headers.push(("Authorization", bearer));
    }
    let body = matches!(method, "POST" | "PUT").then_some("{}");
    raw_http::request(&server.http, method, path, &headers, body)
}

/// A route's pattern made a path: no job's id, the `noop` job type, a
/// console file; and the parameters that keep a write from doing much.
fn concrete(method: &str, pattern: &str) -> String {
    let path = pattern
        .replace("{id}", NO_JOB)
        .replace("{task}", "t1")
        .replace("{job_type}", "noop")
        .replace("{file}", "app.js");
    match (method, pattern) {
        ("POST", "/api/recover" | "/api/prune") => format!("{path}?dry_run=true"),
        ("DELETE", "/api/session") => path,
        _ => path,
    }
}

/// Whether `role` may do what `need` asks.
fn may(role: Option<Role>, need: Need) -> bool {
    role.is_some_and(|role| need.admits(role)) || need == Need::Open
}

fn role_of(name: &str) -> Role {
    name.parse().unwrap()
}

#[test]
fn every_route_answers_each_role_as_the_table_says() {
    let dir = tempfile::tempdir().unwrap();
    let (file, tokens) = credentials(dir.path(), "credentials.toml");
    let server = Server::start(&dir.path().join("data"), &["--credentials", file.to_str().unwrap()]);

    // The router serves the table's routes, by method, and only them.
    let tabled: BTreeSet<(String, String)> =
        HTTP.iter().map(|(method, path, _)| (path.to_string(), method.to_lowercase())).collect();
    assert_eq!(crate::http_api::routed(), tabled, "the router and the table");

    let mut checked = 0;
    for (method, pattern, need) in HTTP {
        let path = concrete(method, pattern);
        let answer = request(&server, method, &path, None);
        assert_ne!(answer.status, 404, "{method} {path} is routed: {}", answer.body);
        assert_ne!(answer.status, 405, "{method} {path} is routed: {}", answer.body);
        if *need == Need::Open {
            assert!(![401, 403].contains(&answer.status), "{method} {path} is open: {}", answer.body);
        } else {
            assert_eq!(answer.status, 401, "{method} {path} without a credential: {}", answer.body);
        }
        for (name, token) in &tokens {
            let role = role_of(name);
            let answer = request(&server, method, &path, Some(token));
            let refused = [401, 403].contains(&answer.status);
            assert_eq!(
                !refused,
                may(Some(role), *need),
                "{method} {path} as {name}: {} {}",
                answer.status,
                answer.body
            );
            if let (true, Need::Any(needed)) = (refused, need) {
                assert_eq!(answer.status, 403, "{method} {path} as {name}: {}", answer.body);
                let error = answer.json()["error"].as_str().unwrap_or_default().to_string();
                let needed = access::either(needed);
                assert!(error.contains(&format!("needs the role {needed}")), "{method} {path} as {name}: {error}");
            }
            checked += 1;
        }
    }
    assert_eq!(checked, HTTP.len() * Role::ALL.len());
    // A token of no credential is refused as none, on a route of any role.
    for (method, path) in [("GET", "/api/jobs"), ("POST", "/api/jobs")] {
        let status = request(&server, method, path, Some("viewer-1.0000")).status;
        assert_eq!(status, 401, "{method} {path} with a made-up token");
    }

    // gRPC: every method of the three services, with each role.
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", server.grpc))
            .unwrap()
            .connect()
            .await
            .expect("connect to the gRPC port");
        for (path, need) in GRPC {
            let anonymous = grpc::call(&channel, path, None).await;
            match need {
                Need::Open => assert!(!anonymous.is_refusal(), "{path} is open: {anonymous:?}"),
                Need::Any(_) => assert_eq!(anonymous, grpc::Outcome::Unauthenticated, "{path} without a credential"),
            }
            for (name, token) in &tokens {
                let outcome = grpc::call(&channel, path, Some(token)).await;
                let role = role_of(name);
                if may(Some(role), *need) {
                    assert!(!outcome.is_refusal(), "{path} as {name}: {outcome:?}");
                } else {
                    let Need::Any(needed) = need else { unreachable!() };
                    let needed = access::either(needed);
                    assert_eq!(
                        outcome,
                        grpc::Outcome::PermissionDenied(format!(
                            "the role {role} may not do this: it needs the role {needed}"
                        )),
                        "{path} as {name}"
                    );
                }
            }
        }
    });

    // The real client says what it lacks: a viewer cannot cancel.
    let viewer = dir.path().join("viewer.token");
    std::fs::write(&viewer, &tokens["viewer"]).unwrap();
    let output = server.cli(&["cancel", NO_JOB, "--token-file", viewer.to_str().unwrap()]);
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("needs the role operator"), "{stderr}");
    let output = server.cli(&["jobs", "--token-file", viewer.to_str().unwrap()]);
    assert!(output.status.success(), "a viewer lists jobs: {}", String::from_utf8_lossy(&output.stderr));

    no_secret_in(&server.log, &tokens);
}

/// The log holds no token, nor any part of one's secret.
fn no_secret_in(log: &Path, tokens: &BTreeMap<&str, String>) {
    let log = std::fs::read_to_string(log).unwrap();
    for token in tokens.values() {
        let secret = token.rsplit_once('.').map_or(token.as_str(), |(_, s)| s);
        assert!(!log.contains(&secret[..16]), "a secret in the log");
    }
}

#[test]
fn a_worker_credential_runs_work_and_reads_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (file, tokens) = credentials(dir.path(), "credentials.yaml");
    let server = Server::start(&dir.path().join("data"), &["--credentials", file.to_str().unwrap()]);
    let token_file = |role: &str| {
        let path = dir.path().join(format!("{role}.token"));
        std::fs::write(&path, &tokens[role]).unwrap();
        path
    };
    let (worker, operator) = (token_file("worker"), token_file("operator"));
    let _worker = start_worker(&server, "w1", &["--token-file", worker.to_str().unwrap()], None);
    let job_file = dir.path().join("job.json");
    std::fs::write(&job_file, support::nine_tasks(None, 10)).unwrap();
    let output = server.cli(&["submit", job_file.to_str().unwrap(), "--token-file", operator.to_str().unwrap()]);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let job = String::from_utf8(output.stdout).unwrap().trim().to_string();
    let ended = wait_until(Duration::from_secs(60), || {
        let answer = request(&server, "GET", &format!("/api/jobs/{job}"), Some(&tokens["operator"]));
        let state = answer.json()["state"].as_str().unwrap_or_default().to_string();
        (state == "succeeded" || state == "failed").then_some(state)
    });
    assert_eq!(ended.as_deref(), Some("succeeded"), "the worker with a worker's credential ran the job");
    let output = server.cli(&["jobs", "--token-file", worker.to_str().unwrap()]);
    assert!(!output.status.success(), "a worker's credential lists no job");
    assert!(String::from_utf8_lossy(&output.stderr).contains("needs the role viewer"));
}

#[test]
fn the_file_is_read_again_on_change_and_on_sighup_and_a_broken_one_keeps_the_last() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("credentials.toml");
    let ann = add(&file, "ann", "viewer");
    let server = Server::start(&dir.path().join("data"), &["--credentials", file.to_str().unwrap()]);
    let status = |token: &str, method: &str, path: &str| request(&server, method, path, Some(token)).status;
    assert_eq!(status(&ann, "GET", "/api/jobs"), 200);

    // Added while it runs: taken without a restart.
    let bo = add(&file, "bo", "operator");
    let taken = wait_until(Duration::from_secs(10), || (status(&bo, "GET", "/api/jobs") == 200).then_some(()));
    assert!(taken.is_some(), "a credential added to the file is taken");
    assert_eq!(status(&bo, "POST", &format!("/api/jobs/{NO_JOB}/cancel")), 404, "an operator may cancel");

    // ann signs in to the console.
    let answer = raw_http::request(
        &server.http,
        "POST",
        "/api/session",
        &[("Content-Type", "application/json")],
        Some(&serde_json::json!({ "token": ann }).to_string()),
    );
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert_eq!(answer.json()["role"], "viewer");
    let cookie = answer.header("set-cookie").unwrap().split(';').next().unwrap().to_string();
    let in_session = |path: &str| raw_http::request(&server.http, "GET", path, &[("Cookie", &cookie)], None);
    assert_eq!(in_session("/api/jobs").status, 200);
    assert_eq!(in_session("/api/session").json()["role"], "viewer");

    // A broken file: named with its line in the log, and the credentials before it stay.
    let good = std::fs::read_to_string(&file).unwrap();
    std::fs::write(&file, format!("{good}\n[[credential]]\nname = \"cy\"\nrole = \"root\"\nhash = \"x\"\n")).unwrap();
    let broken_line = good.lines().count() + 2;
    let expected = format!("{}:{broken_line}: credential cy: unknown role \"root\"", file.display());
    let logged = wait_until(Duration::from_secs(10), || {
        std::fs::read_to_string(&server.log).unwrap().contains(&expected).then_some(())
    });
    assert!(logged.is_some(), "the log names the file, its line and the rule: {expected}");
    assert_eq!(status(&ann, "GET", "/api/jobs"), 200);
    assert_eq!(status(&bo, "GET", "/api/jobs"), 200);

    // ann's entry goes: her token and her session end.
    let without_ann: String = {
        let entries: Vec<&str> = good.split("\n[[credential]]").filter(|e| !e.contains("name = \"ann\"")).collect();
        entries.join("\n[[credential]]")
    };
    std::fs::write(&file, &without_ann).unwrap();
    let ended = wait_until(Duration::from_secs(10), || (status(&ann, "GET", "/api/jobs") == 401).then_some(()));
    assert!(ended.is_some(), "a removed credential is refused");
    assert_eq!(in_session("/api/jobs").status, 401, "its console session ended");
    assert_eq!(in_session("/api/session").json()["authenticated"], false);
    assert_eq!(status(&bo, "GET", "/api/jobs"), 200);

    // A change that keeps the file's size, time and inode is seen at SIGHUP.
    let stamp = std::fs::metadata(&file).unwrap().modified().unwrap();
    let changed = without_ann.replace("role = \"operator\"", "role = \"instance\"");
    assert_eq!(changed.len(), without_ann.len());
    std::fs::write(&file, &changed).unwrap();
    std::fs::File::options().write(true).open(&file).unwrap().set_modified(stamp).unwrap();
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(status(&bo, "GET", "/api/jobs"), 200, "not seen before the signal");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(server.process.child.id() as i32),
        nix::sys::signal::Signal::SIGHUP,
    )
    .unwrap();
    let seen = wait_until(Duration::from_secs(10), || (status(&bo, "GET", "/api/jobs") == 403).then_some(()));
    assert!(seen.is_some(), "bo is an instance after SIGHUP");
    let mut server = server;
    assert!(server.process.is_running(), "SIGHUP does not stop the server");
}

#[test]
fn a_broken_file_is_refused_at_start_naming_its_line() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("credentials.toml");
    std::fs::write(&file, "# ours\n[[credential]]\nname = \"ann\"\nrole = \"viewer\"\nhash = \"plain\"\n").unwrap();
    let mut command = std::process::Command::new(support::binary());
    command.args(["server", "--data-dir", dir.path().join("data").to_str().unwrap(), "--http", "127.0.0.1:0"]);
    command.args(["--grpc", "0", "--credentials", file.to_str().unwrap()]);
    let output = support::run_with_timeout(command, Duration::from_secs(30));
    assert_eq!(output.status.code(), Some(2), "the usage exit code");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(
        stderr.trim(),
        format!(
            "jobcenter: {}:2: credential ann: the hash is not an argon2 hash (a token's hash is made by `jobcenter \
             credentials add`)",
            file.display()
        )
    );
}

#[test]
fn repeated_failures_from_one_address_slow_its_answers() {
    let dir = tempfile::tempdir().unwrap();
    let (file, tokens) = credentials(dir.path(), "credentials.toml");
    let server = Server::start(&dir.path().join("data"), &["--credentials", file.to_str().unwrap()]);
    let timed = |token: &str| {
        let began = Instant::now();
        let status = request(&server, "GET", "/api/jobs", Some(token)).status;
        (status, began.elapsed())
    };
    // Five failures are free, and the sixth answer waits for none.
    for _ in 0..6 {
        assert_eq!(timed("viewer-1.guess").0, 401);
    }
    // Past them, each answer waits, twice as long each time (at least; the
    // machine may add to it).
    for least in [250, 500, 1000] {
        let (status, took) = timed("viewer-1.guess");
        assert_eq!(status, 401);
        assert!(took >= Duration::from_millis(least), "waited {took:?}, not {least} ms");
    }
    // A right credential not verified before waits too, then passes; one
    // verified before does not wait (another client behind the address).
    let (status, took) = timed(&tokens["viewer"]);
    assert_eq!(status, 200);
    assert!(took >= Duration::from_millis(2000), "waited {took:?}");
    no_secret_in(&server.log, &tokens);
    let metrics = request(&server, "GET", "/metrics", Some(&tokens["admin"])).body;
    for token in tokens.values() {
        assert!(!metrics.contains(token.as_str()), "a token in the metrics");
    }
}

/// Calls any gRPC method with one empty message, as bytes.
mod grpc {
    use bytes::{Buf, BufMut};
    use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
    use tonic::{Code, Status};

    #[derive(Debug, PartialEq, Eq)]
    pub enum Outcome {
        Unauthenticated,
        PermissionDenied(String),
        /// Past the guard: the method answered (or is still answering).
        Reached,
    }

    impl Outcome {
        pub fn is_refusal(&self) -> bool {
            !matches!(self, Outcome::Reached)
        }
    }

    #[derive(Default)]
    struct Raw;

    impl Codec for Raw {
        type Encode = Vec<u8>;
        type Decode = Vec<u8>;
        type Encoder = Raw;
        type Decoder = Raw;

        fn encoder(&mut self) -> Raw {
            Raw
        }

        fn decoder(&mut self) -> Raw {
            Raw
        }
    }

    impl Encoder for Raw {
        type Item = Vec<u8>;
        type Error = Status;

        fn encode(&mut self, item: Vec<u8>, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
            dst.put_slice(&item);
            Ok(())
        }
    }

    impl Decoder for Raw {
        type Item = Vec<u8>;
        type Error = Status;

        fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Vec<u8>>, Status> {
            let bytes = src.chunk().to_vec();
            src.advance(bytes.len());
            Ok(Some(bytes))
        }
    }

    fn outcome(status: &Status) -> Outcome {
        match status.code() {
            Code::Unauthenticated => Outcome::Unauthenticated,
            Code::PermissionDenied => Outcome::PermissionDenied(status.message().to_string()),
            _ => Outcome::Reached,
        }
    }

    pub async fn call(channel: &tonic::transport::Channel, path: &str, token: Option<&str>) -> Outcome {
        let mut client = tonic::client::Grpc::new(channel.clone());
        client.ready().await.expect("the channel is ready");
        let mut request = tonic::Request::new(tokio_stream::iter(vec![Vec::new()]));
        if let Some(token) = token {
            request.metadata_mut().insert("authorization", format!("Bearer {token}").parse().unwrap());
        }
        let path = http::uri::PathAndQuery::try_from(path.to_string()).unwrap();
        // A method past the guard may keep its stream open: its first
        // answer, or a second, is enough to tell.
        let call = async {
            match client.streaming(request, path, Raw).await {
                Err(status) => outcome(&status),
                Ok(response) => match response.into_inner().message().await {
                    Err(status) => outcome(&status),
                    Ok(_) => Outcome::Reached,
                },
            }
        };
        tokio::time::timeout(std::time::Duration::from_secs(2), call).await.unwrap_or(Outcome::Reached)
    }
}

/// A console sign-in at `server`: the session's cookie and anti-forgery token.
fn sign_in(server: &Server, token: &str) -> (String, String) {
    let answer = raw_http::request(
        &server.http,
        "POST",
        "/api/session",
        &[("Content-Type", "application/json")],
        Some(&serde_json::json!({ "token": token }).to_string()),
    );
    assert_eq!(answer.status, 200, "{}", answer.body);
    let cookie = answer.header("set-cookie").unwrap().split(';').next().unwrap().to_string();
    (cookie, answer.json()["csrf"].as_str().unwrap().to_string())
}

/// A request in a console session (a write with its anti-forgery token).
fn in_session(server: &Server, method: &str, path: &str, (cookie, csrf): &(String, String)) -> raw_http::Answer {
    let headers = [("Cookie", cookie.as_str()), ("X-CSRF-Token", csrf.as_str()), ("Content-Type", "application/json")];
    raw_http::request(&server.http, method, path, &headers, None)
}

#[test]
fn a_console_session_is_served_by_every_instance_and_ends_at_all_of_them() {
    let pg = support::postgres::shared();
    let database = pg.new_database();
    let url = pg.url(&database);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("credentials.toml");
    let (ann, bo) = (add(&file, "ann", "operator"), add(&file, "bo", "viewer"));
    let peer = dir.path().join("peer.token");
    std::fs::write(&peer, add(&file, "peer", "instance")).unwrap();
    let start = |name: &str| {
        let free = crate::support::free_port;
        let (http, grpc) = (format!("127.0.0.1:{}", free()), free().to_string());
        let args = [
            "--database-url",
            &url,
            "--grpc",
            &grpc,
            "--credentials",
            file.to_str().unwrap(),
            "--peer-token-file",
            peer.to_str().unwrap(),
        ];
        Server::start_on(&dir.path().join(name), &http, &args)
    };
    let (a, b) = (start("a"), start("b"));

    // Signed in at a, served by b: its reads, and its writes with the token.
    let session = sign_in(&a, &ann);
    assert_eq!(in_session(&b, "GET", "/api/jobs", &session).status, 200);
    assert_eq!(in_session(&b, "GET", "/api/session", &session).json()["name"], "ann");
    let cancel = in_session(&b, "POST", &format!("/api/jobs/{NO_JOB}/cancel"), &session);
    assert_eq!(cancel.status, 404, "an operator's write at b, judged and not found: {}", cancel.body);
    // The database keeps a digest of the cookie, never the cookie.
    let cookie_value = session.0.split_once('=').unwrap().1;
    let keys = pg.psql(&database, "SELECT encode(id, 'hex') FROM jobcenter.sessions");
    assert_eq!(keys.lines().filter(|l| !l.trim().is_empty()).count(), 1, "{keys}");
    assert!(!keys.contains(cookie_value));

    // Signed out at b: over at a too, at once.
    assert_eq!(in_session(&b, "DELETE", "/api/session", &session).status, 200);
    assert_eq!(in_session(&a, "GET", "/api/jobs", &session).status, 401, "signed out everywhere");

    // A credential removed from the file: its session ends at every instance.
    let bos = sign_in(&b, &bo);
    assert_eq!(in_session(&a, "GET", "/api/jobs", &bos).status, 200);
    let text = std::fs::read_to_string(&file).unwrap();
    let without_bo: Vec<&str> = text.split("\n[[credential]]").filter(|e| !e.contains("name = \"bo\"")).collect();
    let removed = Instant::now();
    std::fs::write(&file, without_bo.join("\n[[credential]]")).unwrap();
    let ended = wait_until(Duration::from_secs(10), || {
        let statuses = [&a, &b].map(|s| in_session(s, "GET", "/api/jobs", &bos).status);
        (statuses == [401, 401]).then(|| removed.elapsed())
    });
    let took = ended.expect("bo's session ends at both instances");
    eprintln!("bo's session ended at both instances {took:?} after the file changed");
    assert_eq!(in_session(&b, "GET", "/api/session", &bos).json()["authenticated"], false);
}
