//! `jobcenter schedule add|list|pause|resume|remove|run-now`: schedules,
//! a job file run on a calendar, on a running admin.
#![allow(clippy::print_stdout)]

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;

use super::client::Connection;
use super::EXIT_USAGE;
use crate::jobfile::Format;
use crate::proto::api;

#[derive(clap::Args, Debug)]
pub struct ScheduleArgs {
    #[command(subcommand)]
    pub command: ScheduleCommand,
    #[command(flatten)]
    pub connection: Connection,
}

#[derive(clap::Subcommand, Debug)]
pub enum ScheduleCommand {
    /// Add a schedule: FILE (a job file) run on a calendar. Each run is an
    /// ordinary job whose origin names the schedule.
    Add {
        name: String,
        file: PathBuf,
        /// An interval (`15m`, `1h30m`: at its multiples since the epoch), or
        /// a cron expression of five fields (`0 3 * * mon-fri`) or `@daily`.
        #[arg(long)]
        calendar: String,
        /// The cron expression's IANA time zone (`Europe/Berlin`); UTC by default.
        #[arg(long, default_value = "")]
        time_zone: String,
        /// When a run comes due while the last is active: skip, queue_one, cancel_running or allow.
        #[arg(long, default_value = "skip")]
        overlap: String,
        /// Runs missed while no admin ran: `last` (the last of them, once) or `none`.
        #[arg(long, default_value = "last")]
        catch_up: String,
        /// How late a missed run may still be caught up (1h by default).
        #[arg(long, default_value = "")]
        catch_up_window: String,
        /// The bound of each run's offset from its slot (`30s`), the same on every instance.
        #[arg(long, default_value = "")]
        jitter: String,
        /// Add it paused.
        #[arg(long)]
        paused: bool,
        #[arg(long)]
        json: bool,
    },
    /// List the schedules, with their next and last runs.
    List {
        #[arg(long)]
        json: bool,
    },
    /// Pause a schedule: no run starts while it is paused.
    Pause { name: String },
    /// Resume a schedule: the runs due while it was paused do not start; the next does.
    Resume { name: String },
    /// Remove a schedule; the jobs of its runs stay.
    Remove { name: String },
    /// Start a run now, whatever the calendar, the overlap policy and the pause say.
    RunNow {
        name: String,
        #[arg(long)]
        json: bool,
    },
}

fn time(millis: i64) -> String {
    if millis == 0 {
        "-".into()
    } else {
        crate::clock::Timestamp(millis).to_rfc3339()
    }
}

/// The schedule's calendar as one word-group: `15m`, or `0 3 * * * Europe/Berlin`.
fn calendar(s: &api::Schedule) -> String {
    match s.time_zone.as_str() {
        "" => s.calendar.clone(),
        zone => format!("{} {zone}", s.calendar),
    }
}

fn print_one(s: &api::Schedule) {
    let state = if s.paused { "paused" } else { "active" };
    println!("schedule {} ({state}): {} overlap {} catch-up {}", s.name, calendar(s), s.overlap, s.catch_up);
    println!("  next run {}", if s.paused { "-".into() } else { time(s.next_run_ms) });
}

pub(super) async fn run(args: ScheduleArgs) -> anyhow::Result<ExitCode> {
    let mut client = args.connection.connect().await?;
    let answer = match args.command {
        ScheduleCommand::Add {
            name,
            file,
            calendar,
            time_zone,
            overlap,
            catch_up,
            catch_up_window,
            jitter,
            paused,
            json,
        } => {
            let job_file = std::fs::read(&file).with_context(|| format!("reading {}", file.display()))?;
            let format = Format::from_path(&file).name();
            let request = api::AddScheduleRequest {
                name,
                calendar,
                time_zone,
                overlap,
                catch_up,
                catch_up_window,
                jitter,
                paused,
                job_file,
                format: format.into(),
            };
            client.add_schedule(request).await.map(|r| {
                let schedule = r.into_inner();
                match json {
                    true => println!("{}", serde_json::to_string(&schedule).unwrap_or_default()),
                    false => print_one(&schedule),
                }
            })
        }
        ScheduleCommand::List { json } => {
            let schedules = client.list_schedules(api::ListSchedulesRequest {}).await;
            schedules.map(|r| list(&r.into_inner().schedules, json))
        }
        ScheduleCommand::Pause { name } => {
            client.set_schedule_paused(api::SetSchedulePausedRequest { name, paused: true }).await.map(|r| {
                println!("schedule {} paused", r.into_inner().name);
            })
        }
        ScheduleCommand::Resume { name } => {
            let resumed = client.set_schedule_paused(api::SetSchedulePausedRequest { name, paused: false }).await;
            resumed.map(|r| print_one(&r.into_inner()))
        }
        ScheduleCommand::Remove { name } => client.remove_schedule(api::ScheduleRef { name }).await.map(|r| {
            println!("schedule {} removed", r.into_inner().name);
        }),
        ScheduleCommand::RunNow { name, json } => client.run_schedule_now(api::ScheduleRef { name }).await.map(|r| {
            let r = r.into_inner();
            match json {
                true => println!("{}", serde_json::json!({ "name": r.name, "job_id": r.job_id })),
                false => println!("{}", r.job_id),
            }
        }),
    };
    match answer {
        Ok(()) => Ok(ExitCode::SUCCESS),
        // A refusal of what was given is one line, and the usage exit code.
        Err(status)
            if matches!(
                status.code(),
                tonic::Code::InvalidArgument | tonic::Code::NotFound | tonic::Code::FailedPrecondition
            ) =>
        {
            eprintln!("jobcenter: {}", status.message());
            Ok(ExitCode::from(EXIT_USAGE))
        }
        Err(status) => Err(anyhow::anyhow!("{}", status.message())),
    }
}

fn list(schedules: &[api::Schedule], json: bool) {
    if json {
        println!("{}", serde_json::to_string(schedules).unwrap_or_default());
        return;
    }
    if schedules.is_empty() {
        println!("no schedules (`jobcenter schedule add` adds one)");
        return;
    }
    println!(
        "{:<20} {:<28} {:<14} {:<7} {:<25} {:<25} LAST JOB",
        "NAME", "CALENDAR", "OVERLAP", "STATE", "NEXT RUN", "LAST RUN"
    );
    for s in schedules {
        let state = if s.paused { "paused" } else { "active" };
        let next = if s.paused { "-".into() } else { time(s.next_run_ms) };
        let last = match s.last_outcome.as_str() {
            "" => "-".to_string(),
            outcome => format!("{} {outcome}", time(s.last_slot_ms)),
        };
        let job = if s.last_job_id.is_empty() { "-" } else { &s.last_job_id };
        println!("{:<20} {:<28} {:<14} {:<7} {:<25} {:<25} {job}", s.name, calendar(s), s.overlap, state, next, last);
    }
}
