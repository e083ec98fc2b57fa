//! The engine's loop: it feeds the core the commands that arrive (waking
//! it at its next deadline when none does), one turn at a time, and hands
//! each turn's step to the committer. The one part of the engine's state
//! machine that awaits or reads the clock: `core` does neither.

use std::sync::Arc;

use tokio::sync::mpsc;

use super::core::{Command, Core, Step};
use crate::clock::{Clock, Timestamp};

pub(super) async fn run(
    mut core: Core,
    clock: Arc<dyn Clock>,
    mut commands: mpsc::Receiver<Command>,
    steps: mpsc::Sender<Step>,
    stop: tokio_util::sync::CancellationToken,
) {
    let max = core.most_commands_per_turn();
    let mut received: Vec<Command> = Vec::with_capacity(max);
    // One timer, set again only when the next deadline moves: a turn that
    // leaves it where it was registers and drops nothing.
    let timer = tokio::time::sleep(std::time::Duration::ZERO);
    tokio::pin!(timer);
    let mut armed: Option<Timestamp> = None;
    loop {
        match core.next_wake(clock.now()) {
            Some(at) if armed != Some(at) => {
                let wait = std::time::Duration::from_millis(at.millis_since(clock.now()));
                timer.as_mut().reset(tokio::time::Instant::now() + wait);
                armed = Some(at);
            }
            Some(_) => {}
            None => armed = None,
        }
        let first = tokio::select! {
            command = commands.recv() => match command {
                Some(command) => Some(command),
                None => break,
            },
            () = &mut timer, if armed.is_some() => {
                armed = None;
                None
            }
            () = stop.cancelled() => break,
        };
        received.extend(first);
        while received.len() < max {
            match commands.try_recv() {
                Ok(command) => received.push(command),
                Err(_) => break,
            }
        }
        let taken = std::time::Instant::now();
        received.iter_mut().for_each(|command| command.taken(taken));
        let step = core.turn(received.drain(..), clock.now());
        if (!step.batch.is_empty() || !step.actions.is_empty()) && steps.send(step).await.is_err() {
            break;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::super::core::{Command, ReportCommand};
    use crate::follower::Outcome;
    use crate::model::{AttemptId, HandlerId, JobId, TaskIdx, TaskRef};

    fn report(received: Option<Instant>) -> Command {
        ReportCommand::Complete {
            attempt: AttemptId::new(TaskRef { job: JobId::new(), idx: TaskIdx(0) }, 1),
            handler: HandlerId::new(),
            outcome: Outcome::Succeeded { output: Vec::new() },
            received,
            waited_ms: 0,
            answer: None,
        }
        .into()
    }

    fn waited(command: &Command) -> i64 {
        let Command::Report(ReportCommand::Complete { waited_ms, .. }) = command else { unreachable!() };
        *waited_ms
    }

    #[test]
    fn a_report_taken_by_the_loop_notes_how_long_it_waited_since_the_server_received_it() {
        let received = Instant::now();
        let mut command = report(Some(received));
        command.taken(received + Duration::from_millis(10_250));
        assert_eq!(waited(&command), 10_250);
        let mut command = report(None);
        command.taken(received + Duration::from_secs(1));
        assert_eq!(waited(&command), 0, "a report with no time of receipt waited nothing known");
    }
}
