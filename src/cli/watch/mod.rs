//! `jobcenter watch JOB_ID` (and `submit --watch`): follows a job through the
//! server's watch stream, in a full-screen view on a terminal and as plain
//! lines otherwise; reconnects with backoff when the stream breaks, and
//! starts again from the new snapshot. Also the live tables of
//! `jobs --watch` and `workers --watch`.
#![allow(clippy::print_stdout)]

mod state;
pub(super) mod tables;
mod view;

use std::io::IsTerminal;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ratatui::crossterm::event::{self as term, KeyCode, KeyEventKind, KeyModifiers};
use tokio::sync::{mpsc, Notify};

use self::state::{Changed, Command, Key, Link, WatchState};
use super::client::Connection;
use super::{EXIT_JOB_FAILED, EXIT_USAGE};
use crate::backoff::Backoff;
use crate::clock::{Clock, SystemClock, Timestamp};
use crate::model::{JobState, TaskState};
use crate::proto::api::{self, job_event};

const BACKOFF_MIN: Duration = Duration::from_millis(200);
const BACKOFF_MAX: Duration = Duration::from_secs(5);
/// Updates applied at most between two frames.
const UPDATES_PER_FRAME: usize = 20_000;

#[derive(clap::Args, Debug)]
pub struct WatchArgs {
    /// The job's id.
    pub id: String,
    /// Print plain lines (the default when stdout is not a terminal).
    #[arg(long)]
    pub plain: bool,
    #[command(flatten)]
    pub connection: Connection,
}

pub(super) async fn run(args: WatchArgs) -> anyhow::Result<ExitCode> {
    watch(&args.connection, &args.id, args.plain).await
}

/// What the stream follower tells the screen.
enum Update {
    Event(api::JobEvent),
    Live,
    /// The job has ended and the server closed the stream; nothing comes until a retry.
    Ended,
    Lost {
        error: String,
        retry_in: Duration,
    },
    Fatal(String),
    Details(Box<api::Task>),
    /// The outcome of a cancel or retry, to show.
    Done(String),
}

/// Follows a job until it ends (plain) or until the operator quits (full
/// screen); exit code 0 if the job succeeded, 1 otherwise.
pub(super) async fn watch(connection: &Connection, job_id: &str, plain: bool) -> anyhow::Result<ExitCode> {
    let plain = plain || !std::io::stdout().is_terminal();
    let (updates_tx, updates) = mpsc::channel(4096);
    let rewatch = Arc::new(Notify::new());
    let follower = tokio::spawn(follow(connection.clone(), job_id.to_string(), updates_tx.clone(), rewatch.clone()));
    let result = if plain {
        drop(updates_tx);
        watch_plain(connection, job_id, updates).await
    } else {
        let actions =
            Actions { connection: connection.clone(), job_id: job_id.to_string(), updates: updates_tx, rewatch };
        watch_screen(actions, updates).await
    };
    follower.abort();
    result
}

enum Outcome {
    /// The job ended and the stream with it.
    Ended,
    /// The stream broke; `live` if it had delivered something first.
    Lost {
        error: String,
        live: bool,
    },
    Fatal(String),
    /// Nobody listens any more.
    Closed,
}

fn is_terminal_state(state: &str) -> bool {
    state.parse::<JobState>().is_ok_and(JobState::is_terminal)
}

/// Keeps a watch stream open: reconnects with backoff when it breaks and,
/// once the job has ended, waits for `rewatch` (after a retry).
async fn follow(connection: Connection, job_id: String, updates: mpsc::Sender<Update>, rewatch: Arc<Notify>) {
    let mut pauses = Backoff::doubling(BACKOFF_MIN, BACKOFF_MAX);
    loop {
        match watch_once(&connection, &job_id, &updates).await {
            Outcome::Ended => {
                if updates.send(Update::Ended).await.is_err() {
                    return;
                }
                pauses.reset();
                rewatch.notified().await;
            }
            Outcome::Lost { error, live } => {
                if live {
                    pauses.reset();
                }
                let backoff = pauses.next_pause();
                tracing::debug!(job.id = %job_id, %error, retry_in_ms = backoff.as_millis() as u64, "watch stream lost");
                if updates.send(Update::Lost { error, retry_in: backoff }).await.is_err() {
                    return;
                }
                tokio::time::sleep(backoff).await;
            }
            Outcome::Fatal(message) => {
                let _ = updates.send(Update::Fatal(message)).await;
                return;
            }
            Outcome::Closed => return,
        }
    }
}

fn classify(status: tonic::Status, live: bool) -> Outcome {
    use tonic::Code;
    match status.code() {
        Code::NotFound | Code::InvalidArgument | Code::Unauthenticated | Code::PermissionDenied => {
            Outcome::Fatal(status.message().to_string())
        }
        _ => Outcome::Lost { error: status.message().to_string(), live },
    }
}

async fn watch_once(connection: &Connection, job_id: &str, updates: &mpsc::Sender<Update>) -> Outcome {
    let mut client = match connection.connect().await {
        Ok(client) => client,
        Err(e) => return Outcome::Lost { error: format!("{e:#}"), live: false },
    };
    let mut stream = match client.watch_job(api::JobRef { job_id: job_id.into() }).await {
        Ok(response) => response.into_inner(),
        Err(status) => return classify(status, false),
    };
    let mut live = false;
    let mut ended = false;
    let mut assembly = crate::wire::JobAssembly::default();
    loop {
        match stream.message().await {
            Ok(Some(mut event)) => {
                // A snapshot comes in parts: it goes on whole.
                if let Some(job_event::Event::Snapshot(part)) = &mut event.event {
                    match assembly.push(std::mem::take(part)) {
                        Ok(Some(job)) => event.event = Some(job_event::Event::Snapshot(job)),
                        Ok(None) => continue,
                        Err(e) => return Outcome::Lost { error: e, live },
                    }
                }
                if !live {
                    live = true;
                    if updates.send(Update::Live).await.is_err() {
                        return Outcome::Closed;
                    }
                }
                match &event.event {
                    Some(job_event::Event::Snapshot(job)) => ended = is_terminal_state(&job.state),
                    Some(job_event::Event::Job(transition)) => ended = is_terminal_state(&transition.state),
                    _ => {}
                }
                if updates.send(Update::Event(event)).await.is_err() {
                    return Outcome::Closed;
                }
            }
            Ok(None) if ended => return Outcome::Ended,
            Ok(None) => return Outcome::Lost { error: "the server closed the stream".into(), live },
            Err(status) => return classify(status, live),
        }
    }
}

/// Reads the whole job once (for output lines and errors that transitions do not carry).
async fn read_job(connection: &Connection, job_id: &str) -> anyhow::Result<api::Job> {
    let mut client = connection.connect().await?;
    super::client::read_job(&mut client, job_id).await.map_err(|s| anyhow::anyhow!("{}", s.message()))
}

fn clock_time(at_ms: i64) -> String {
    let text = Timestamp(at_ms).to_rfc3339();
    text.get(11..23).map(String::from).unwrap_or(text)
}

fn exit_code(state: &WatchState) -> ExitCode {
    if state.job.state == Some(JobState::Succeeded) {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(EXIT_JOB_FAILED)
    }
}

// ---- plain lines ----

fn counts_text(state: &WatchState) -> String {
    let counts: Vec<String> = state.counts().iter().filter(|(_, n)| *n > 0).map(|(s, n)| format!("{s} {n}")).collect();
    if counts.is_empty() {
        "no tasks".into()
    } else {
        counts.join(", ")
    }
}

/// `12:00:03.100 task 4 failed (attempt 1): the error`
fn transition_line(state: &WatchState, change: &Changed) -> String {
    let task = state.task(change.idx);
    let mut line = format!("{} task {} {}", clock_time(task.updated_at_ms), task.id, change.to);
    if task.attempt > 0 && change.to != TaskState::UpstreamFailed && change.to != TaskState::Pending {
        line.push_str(&format!(" (attempt {})", task.attempt));
    }
    if matches!(change.to, TaskState::Failed | TaskState::Ready) && !task.error.is_empty() {
        line.push_str(&format!(": {}", task.error));
    }
    line
}

/// The closing lines: the outcome, then each failed task with its error.
fn summary_lines(state: &WatchState) -> Vec<String> {
    let mut lines = vec![format!(
        "job {} {:?} {} after {}: {}",
        state.job.id,
        state.job.name,
        state.job_state_name(),
        view::duration(state.elapsed_ms()),
        counts_text(state)
    )];
    let mut failed = Vec::new();
    let mut upstream = Vec::new();
    for idx in 0..state.len() as u32 {
        match state.state_of(idx) {
            TaskState::Failed => failed.push(idx),
            TaskState::UpstreamFailed => upstream.push(idx),
            _ => {}
        }
    }
    const SHOWN: usize = 20;
    for &idx in failed.iter().take(SHOWN) {
        let task = state.task(idx);
        lines.push(format!("  failed: task {} (attempt {}): {}", task.id, task.attempt, task.error));
    }
    if failed.len() > SHOWN {
        lines.push(format!("  and {} more failed tasks", failed.len() - SHOWN));
    }
    if !upstream.is_empty() {
        let ids: Vec<&str> = upstream.iter().take(SHOWN).map(|&i| state.task(i).id.as_str()).collect();
        let more = if upstream.len() > SHOWN { format!(" and {} more", upstream.len() - SHOWN) } else { String::new() };
        lines.push(format!("  upstream_failed: {}{more}", ids.join(", ")));
    }
    lines
}

async fn watch_plain(
    connection: &Connection,
    job_id: &str,
    mut updates: mpsc::Receiver<Update>,
) -> anyhow::Result<ExitCode> {
    let mut state = WatchState::new();
    while !state.job.is_ended() {
        let Some(update) = updates.recv().await else { anyhow::bail!("the watch stream stopped") };
        match update {
            Update::Event(event) => {
                let first = !state.has_snapshot();
                let job_transition = match &event.event {
                    Some(job_event::Event::Job(t)) => Some(t.clone()),
                    _ => None,
                };
                let snapshot = matches!(event.event, Some(job_event::Event::Snapshot(_)));
                let changes = state.apply_event(event);
                if snapshot && first {
                    println!(
                        "watching job {} {:?}: {}, {} tasks ({})",
                        state.job.id,
                        state.job.name,
                        state.job_state_name(),
                        state.len(),
                        counts_text(&state)
                    );
                } else if snapshot {
                    println!("resumed from a new snapshot: {}, {}", state.job_state_name(), counts_text(&state));
                }
                for change in &changes {
                    println!("{}", transition_line(&state, change));
                }
                if let Some(t) = job_transition {
                    println!("{} job {}", clock_time(t.at_ms), t.state);
                }
            }
            Update::Lost { error, retry_in } => {
                eprintln!(
                    "jobcenter: lost the watch stream ({error}); trying again in {}",
                    view::duration(retry_in.as_millis() as i64)
                );
            }
            Update::Fatal(message) => {
                eprintln!("jobcenter: {message}");
                return Ok(ExitCode::from(EXIT_USAGE));
            }
            Update::Live | Update::Ended | Update::Details(_) | Update::Done(_) => {}
        }
    }
    match read_job(connection, job_id).await {
        Ok(job) => {
            state.apply_snapshot(job);
        }
        Err(e) => eprintln!("jobcenter: could not read the final job ({e:#}); the summary shows what the stream said"),
    }
    for line in summary_lines(&state) {
        println!("{line}");
    }
    Ok(exit_code(&state))
}

// ---- full screen ----

/// What the screen can ask of the server, each in the background.
struct Actions {
    connection: Connection,
    job_id: String,
    updates: mpsc::Sender<Update>,
    rewatch: Arc<Notify>,
}

impl Actions {
    fn cancel(&self) {
        let (connection, job_id, updates) = (self.connection.clone(), self.job_id.clone(), self.updates.clone());
        tokio::spawn(async move {
            let result = async {
                let mut client = connection.connect().await?;
                client.cancel_job(api::JobRef { job_id }).await.map_err(|s| anyhow::anyhow!("{}", s.message()))
            }
            .await;
            let message = match result {
                Ok(_) => "cancel sent: waiting tasks are canceled, running ones are asked to stop".to_string(),
                Err(e) => format!("cancel failed: {e:#}"),
            };
            let _ = updates.send(Update::Done(message)).await;
        });
    }

    fn retry(&self) {
        let (connection, job_id, updates) = (self.connection.clone(), self.job_id.clone(), self.updates.clone());
        let rewatch = self.rewatch.clone();
        tokio::spawn(async move {
            let result = async {
                let mut client = connection.connect().await?;
                client.retry_job(api::JobRef { job_id }).await.map_err(|s| anyhow::anyhow!("{}", s.message()))
            }
            .await;
            let message = match result {
                Ok(_) => {
                    rewatch.notify_one();
                    "retry sent: the failed part runs again".to_string()
                }
                Err(e) => format!("retry failed: {e:#}"),
            };
            let _ = updates.send(Update::Done(message)).await;
        });
    }

    /// The whole job again; the one task asked for (or all, as a snapshot).
    fn fetch(&self, task_id: Option<String>) {
        let (connection, job_id, updates) = (self.connection.clone(), self.job_id.clone(), self.updates.clone());
        tokio::spawn(async move {
            let update = match read_job(&connection, &job_id).await {
                Ok(job) => match task_id {
                    Some(id) => match job.tasks.into_iter().find(|t| t.id == id) {
                        Some(task) => Update::Details(Box::new(task)),
                        None => return,
                    },
                    None => Update::Event(api::JobEvent { event: Some(job_event::Event::Snapshot(job)) }),
                },
                Err(e) => Update::Done(format!("could not read the job: {e:#}")),
            };
            let _ = updates.send(update).await;
        });
    }
}

enum Input {
    Key(Key),
    Interrupt,
    Resize,
}

fn key_of(event: term::KeyEvent) -> Option<Input> {
    if event.kind == KeyEventKind::Release {
        return None;
    }
    let key = match event.code {
        KeyCode::Char('c') if event.modifiers.contains(KeyModifiers::CONTROL) => return Some(Input::Interrupt),
        KeyCode::Up => Key::Up,
        KeyCode::Down => Key::Down,
        KeyCode::Left => Key::Left,
        KeyCode::Right => Key::Right,
        KeyCode::PageUp => Key::PageUp,
        KeyCode::PageDown => Key::PageDown,
        KeyCode::Home => Key::Home,
        KeyCode::End => Key::End,
        KeyCode::Enter => Key::Enter,
        KeyCode::Esc => Key::Esc,
        KeyCode::Backspace => Key::Backspace,
        KeyCode::Char(c) => Key::Char(c),
        _ => return None,
    };
    Some(Input::Key(key))
}

/// Reads terminal events on a thread of its own until `stop` is set.
fn spawn_input(stop: Arc<AtomicBool>) -> mpsc::UnboundedReceiver<Input> {
    let (tx, rx) = mpsc::unbounded_channel();
    std::thread::spawn(move || {
        while !stop.load(Ordering::Relaxed) {
            match term::poll(Duration::from_millis(100)) {
                Ok(true) => {}
                Ok(false) => continue,
                Err(_) => return,
            }
            let input = match term::read() {
                Ok(term::Event::Key(key)) => key_of(key),
                Ok(term::Event::Resize(..)) => Some(Input::Resize),
                Ok(_) => None,
                Err(_) => return,
            };
            if let Some(input) = input {
                if tx.send(input).is_err() {
                    return;
                }
            }
        }
    });
    rx
}

/// Applies an update; a fatal one ends the view with its message.
fn apply_update(state: &mut WatchState, update: Update, actions: &Actions) -> Result<(), String> {
    match update {
        Update::Event(event) => {
            state.apply_event(event);
        }
        Update::Live => state.link = Link::Live,
        Update::Ended => {
            state.link = Link::Ended;
            // Output lines and final times are not in transitions: read them once.
            actions.fetch(None);
        }
        Update::Lost { error, retry_in } => {
            state.link = Link::Lost { error, retry_in_ms: retry_in.as_millis() as u64 };
        }
        Update::Fatal(message) => return Err(message),
        Update::Details(task) => state.apply_task_details(*task),
        Update::Done(message) => state.message = Some(message),
    }
    Ok(())
}

async fn watch_screen(actions: Actions, mut updates: mpsc::Receiver<Update>) -> anyhow::Result<ExitCode> {
    let mut terminal = ratatui::try_init()?;
    let stop = Arc::new(AtomicBool::new(false));
    let mut inputs = spawn_input(stop.clone());
    let mut state = WatchState::new();
    let mut tick = tokio::time::interval(Duration::from_millis(500));
    let clock = SystemClock;
    let result: Result<(), String> = loop {
        state.set_now(clock.now().as_millis());
        if let Err(e) = terminal.draw(|frame| view::draw(frame, &mut state)) {
            break Err(format!("cannot draw: {e}"));
        }
        tokio::select! {
            update = updates.recv() => {
                let Some(update) = update else { break Err("the watch stream stopped".into()) };
                let mut outcome = apply_update(&mut state, update, &actions);
                let mut n = 1;
                while outcome.is_ok() && n < UPDATES_PER_FRAME {
                    match updates.try_recv() {
                        Ok(update) => outcome = apply_update(&mut state, update, &actions),
                        Err(_) => break,
                    }
                    n += 1;
                }
                if let Err(message) = outcome {
                    break Err(message);
                }
            }
            input = inputs.recv() => match input {
                None | Some(Input::Interrupt) => break Ok(()),
                Some(Input::Resize) => {}
                Some(Input::Key(key)) => match state.handle_key(key) {
                    Command::None => {}
                    Command::Quit => break Ok(()),
                    Command::CancelJob => actions.cancel(),
                    Command::RetryJob => actions.retry(),
                    Command::FetchDetails(task_id) => actions.fetch(Some(task_id)),
                },
            },
            _ = tick.tick() => {}
        }
    };
    stop.store(true, Ordering::Relaxed);
    ratatui::restore();
    match result {
        Ok(()) => Ok(exit_code(&state)),
        Err(message) => {
            eprintln!("jobcenter: {message}");
            Ok(ExitCode::from(EXIT_USAGE))
        }
    }
}
