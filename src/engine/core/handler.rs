//! The steps about handlers: connected, gone, their slots, what they run
//! after a reconnect, and their leases renewed by another instance.

use super::{Core, HandlerCommand, Step};
use crate::clock::Timestamp;
use crate::follower::Loss;

impl Core {
    pub(super) fn apply_handler(&mut self, command: HandlerCommand, now: Timestamp, step: &mut Step) {
        match command {
            HandlerCommand::Connected { spec } => {
                let handler = spec.handler;
                tracing::debug!(%handler, capacity = spec.capacity, held = self.dispatch.held_by(handler), "handler joined");
                self.attempts.back(handler);
                self.dispatch.add_handler(spec);
            }
            HandlerCommand::Disconnected { handler, session, keep_for, reason } => {
                if !self.dispatch.remove_handler(handler, Some(session)) {
                    return;
                }
                match keep_for {
                    Some(wait) if self.dispatch.held_by(handler) > 0 => {
                        let seconds = wait.as_secs_f64();
                        let reason =
                            format!("lost with its worker: {reason}, and it did not come back within {seconds:.1} s");
                        self.attempts.away(handler, now.plus_millis(wait.as_millis() as i64), reason);
                    }
                    Some(_) => {}
                    None => self.lose_handler(
                        handler,
                        &Loss::WithWorker(format!("lost with its worker: {reason}")),
                        now,
                        step,
                    ),
                }
            }
            HandlerCommand::HandlerGone { handler, loss } => {
                self.dispatch.remove_handler(handler, None);
                self.attempts.back(handler);
                self.lose_handler(handler, &loss, now, step);
            }
            HandlerCommand::HandlerSlots { handler, total } => self.dispatch.report_slots(handler, total),
            HandlerCommand::HandlerElsewhere { handler, running } => self.dispatch.report_elsewhere(handler, running),
            HandlerCommand::Reconcile { handler, running, reported, dropped_before, reply } => {
                let reconciled = self.reconcile(handler, &running, &reported, dropped_before, now, step);
                step.reply(reply, reconciled);
            }
            HandlerCommand::Holds { handler, attempts, reply } => {
                let _ = reply.send(self.holdings(handler, attempts));
            }
            HandlerCommand::Returned { handler, name, reply } => {
                let returned = self.returned(handler, name, now, step);
                step.reply(reply, returned);
            }
            HandlerCommand::Vouch { handler, attempts, keep, reply } => {
                let held = self.held_by(handler, attempts);
                if !held.is_empty() {
                    self.attempts.vouch(handler, now.plus_millis(keep.as_millis() as i64), now);
                }
                let _ = reply.send(held);
            }
        }
    }
}
