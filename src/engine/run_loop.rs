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
