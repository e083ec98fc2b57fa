//! What several admin instances sharing one store need from it: a registry
//! of instances with heartbeats on the store's clock, a fence on every
//! write, job ownership, one detection per job type and interval, and named
//! leases. Only the PostgreSQL store offers it; the embedded one serves one
//! instance.

use std::time::Duration;

use super::{Error, StoredJob};
use crate::model::{HandlerId, JobId, JobState};

/// What an instance does in the cluster.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// An admin server: leads its share of the jobs, detects, recovers.
    Server,
    /// `jobcenter run`: leads only the job it was started with.
    Run,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Server => "server",
            Role::Run => "run",
        }
    }
}

/// How an instance introduces itself.
#[derive(Clone, Debug)]
pub struct Introduction {
    pub role: Role,
    pub grpc_address: String,
    pub http_address: String,
}

/// What an instance reports with every heartbeat.
#[derive(Clone, Debug, Default)]
pub struct Beat {
    pub jobs_led: usize,
    pub workers: usize,
    /// Job types a worker connected to it can detect.
    pub detectors: Vec<String>,
    /// Job types it detected in its last interval.
    pub detections: Vec<String>,
    /// Handlers (workers) connected to it.
    pub handlers: Vec<HandlerId>,
    /// It has reached the database without a break for the lag threshold,
    /// so it may judge others silent: one that has just reached it again
    /// (the database restarted, or failed over) cannot tell an instance
    /// that is silent from one the outage kept silent too.
    pub may_judge: bool,
}

/// One instance as the store knows it.
#[derive(Clone, Debug)]
pub struct Instance {
    pub id: HandlerId,
    pub role: Role,
    pub grpc_address: String,
    pub http_address: String,
    /// Milliseconds since the epoch, on the store's clock.
    pub started_at_ms: i64,
    pub heartbeat_ms: i64,
    /// How long ago its last heartbeat was, on the store's clock.
    pub heartbeat_age_ms: i64,
    pub paused: bool,
    pub jobs_led: usize,
    pub workers: usize,
    pub detectors: Vec<String>,
    pub detections: Vec<String>,
    pub handlers: Vec<HandlerId>,
    /// False once deactivated (its row stays visible for a while).
    pub active: bool,
}

/// What a heartbeat learned about the cluster.
#[derive(Clone, Debug)]
pub struct Membership {
    /// The store's clock when the heartbeat landed, in milliseconds.
    pub now_ms: i64,
    /// Every live instance, this one included, by id.
    pub instances: Vec<Instance>,
    /// Instances this heartbeat found silent and deactivated.
    pub deactivated: Vec<HandlerId>,
    /// Jobs not ended, led or not.
    pub active_jobs: usize,
    /// Jobs not ended that nobody leads.
    pub unowned_jobs: usize,
}

impl Membership {
    /// The live servers (instances that share the jobs), by id.
    pub fn servers(&self) -> impl Iterator<Item = &Instance> {
        self.instances.iter().filter(|i| i.role == Role::Server)
    }
}

/// A console session as the cluster keeps it: its anti-forgery token and
/// its caller in the stored form the server gives it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SharedSession {
    pub csrf: String,
    pub caller: String,
}

/// Where a job stands in the cluster.
#[derive(Clone, Debug)]
pub struct Whereabouts {
    pub state: JobState,
    /// The instance leading it, when one does.
    pub owner: Option<Instance>,
}

/// What an instance asks of one permit key: `capacity` slots in all; it
/// wants `want` of them now and runs `running` tasks under the key, which
/// it keeps slots for whatever the split says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PermitRequest {
    pub key: String,
    pub capacity: u32,
    pub want: u32,
    pub running: u32,
}

/// What a settlement left for one permit key: the slots this instance
/// holds, and what the split allots it. They differ while it keeps slots
/// for tasks still running past its share, or waits for slots another
/// instance has yet to give back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Grant {
    pub held: u32,
    pub target: u32,
}

/// What an instance hears of the others' permits between settlements: the
/// value changes whenever another instance says the split changed for
/// others (it waits for slots, it wants less and gave back slots others
/// want, it deactivated an instance), and it says whether such news is
/// heard at all just now. While it is `false` nothing may be assumed
/// unchanged.
pub type PermitNews = tokio::sync::watch::Receiver<bool>;

/// Splits `capacity` slots over instances by what each wants (max-min
/// fairness: nobody gets more than they want, and what one does not want is
/// shared by the others); returns what `me` is allotted. Instances in
/// `wants` are the live ones that want something, `me` included if it does.
/// Who gets the odd slots when there are not enough to go round changes
/// with `turn`, so that no instance waits for ever.
pub fn allot<I: Ord + Copy + std::hash::Hash>(capacity: u32, wants: &[(I, u32)], me: I, turn: u64) -> u32 {
    use std::hash::{Hash, Hasher};
    let order = |id: &I| {
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        (id, turn).hash(&mut hasher);
        hasher.finish()
    };
    let mut sorted: Vec<(u32, u64, I)> = wants.iter().map(|(id, want)| (*want, order(id), *id)).collect();
    sorted.sort();
    let mut left = capacity;
    let mut mine = 0;
    for (i, (want, _, id)) in sorted.iter().enumerate() {
        let rest = (sorted.len() - i) as u32;
        let given = (*want).min(left.div_ceil(rest));
        left -= given;
        if *id == me {
            mine = given;
        }
    }
    mine
}

pub trait Cluster: Send + Sync {
    /// Registers this process as a new instance; every later write of the
    /// store is fenced by that registration.
    fn register(&self, introduction: &Introduction) -> Result<HandlerId, Error>;
    /// This instance, once registered.
    fn me(&self) -> Option<HandlerId>;
    /// Writes this instance's heartbeat, then deactivates every instance
    /// silent for longer than `lag` and releases the jobs it led, all in one
    /// transaction. `Error::Fenced` when this instance was deactivated.
    fn heartbeat(&self, beat: &Beat, lag: Duration) -> Result<Membership, Error>;
    /// Takes the lead of jobs nobody leads: first every one with an attempt
    /// held by one of `handlers` (workers connected here), then others up to
    /// `up_to` in all.
    fn claim(&self, up_to: usize, handlers: &[HandlerId]) -> Result<Vec<StoredJob>, Error>;
    /// Claims the detection of `job_type` for interval `slot` (the store's
    /// clock divided by `interval`); false when another instance has it or
    /// the slot is no longer current.
    fn claim_detection(&self, job_type: &str, interval: Duration, slot: i64) -> Result<bool, Error>;
    /// Takes or renews the named lease for `ttl`; false while another
    /// instance holds it.
    fn lease(&self, name: &str, ttl: Duration) -> Result<bool, Error>;
    /// Every registered instance, deactivated ones included until removed.
    fn instances(&self) -> Result<Vec<Instance>, Error>;
    /// Keeps a console session under `id` (a digest of its cookie) for
    /// `lifetime` on the store's clock; sessions past theirs go.
    fn open_session(&self, id: &[u8], session: &SharedSession, lifetime: Duration) -> Result<(), Error>;
    /// The session under `id`, if it is open and younger than `lifetime`.
    fn session(&self, id: &[u8], lifetime: Duration) -> Result<Option<SharedSession>, Error>;
    /// Ends the session under `id`; answers it, if it was open.
    fn close_session(&self, id: &[u8]) -> Result<Option<SharedSession>, Error>;
    /// Pauses or resumes the scheduler of one instance or of all; returns
    /// how many instances changed.
    fn set_paused(&self, instance: Option<HandlerId>, paused: bool) -> Result<usize, Error>;
    /// Where a job stands, or `None` when there is no such job.
    fn whereabouts(&self, job: JobId) -> Result<Option<Whereabouts>, Error>;
    /// A clean stop: releases this instance's jobs and removes its row.
    fn leave(&self) -> Result<(), Error>;
    /// Takes and gives back permit slots so that this instance holds, for
    /// each request, its allotted share of what the live instances want
    /// (never fewer than it runs, never more than the capacity); returns the
    /// slots held and allotted per request, in order.
    fn permits(&self, requests: &[PermitRequest]) -> Result<Vec<Grant>, Error>;
    /// News of the other instances' permits, once this instance is
    /// registered; `None` when the store cannot tell.
    fn permit_news(&self) -> Option<PermitNews>;
    /// Claims the run of `schedule` for `slot`, cluster-wide: fresh, taken
    /// over from an instance no longer active (its writes are all in, so
    /// the schedule's last run says whether it started the run), or held
    /// by a live instance.
    fn claim_schedule_run(&self, schedule: &str, slot: i64) -> Result<RunClaim, Error>;
}

/// What a claim of a schedule's run found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RunClaim {
    /// Nobody had claimed it: this instance has.
    Fresh,
    /// Claimed earlier by an instance no longer active, or by this one: this instance has it now.
    TakenOver,
    /// A live instance has it.
    Held,
}

#[cfg(test)]
mod tests {
    use super::allot;

    #[test]
    fn permits_are_split_by_what_each_instance_wants() {
        let (a, b, c) = (1, 2, 3);
        assert_eq!(allot(10, &[(a, 4)], a, 0), 4, "alone, as much as it wants");
        assert_eq!(allot(10, &[(a, 40)], a, 0), 10, "never past the capacity");
        // Even when all want more than an even share.
        let wants = [(a, 10), (b, 10), (c, 10)];
        let shares: Vec<u32> = [a, b, c].iter().map(|me| allot(9, &wants, *me, 0)).collect();
        assert_eq!(shares, [3, 3, 3]);
        // What one does not want goes to the others.
        let wants = [(a, 1), (b, 10), (c, 10)];
        let shares: Vec<u32> = [a, b, c].iter().map(|me| allot(9, &wants, *me, 0)).collect();
        assert_eq!(shares, [1, 4, 4]);
        // The shares never add up past the capacity, and nobody wanting
        // something is left out while there is enough to go round.
        for capacity in 0..12 {
            for wants in [[(a, 0), (b, 5), (c, 7)], [(a, 3), (b, 3), (c, 3)], [(a, 1), (b, 1), (c, 9)]] {
                let total: u32 = [a, b, c].iter().map(|me| allot(capacity, &wants, *me, 0)).sum();
                let wanted: u32 = wants.iter().map(|(_, w)| w).sum();
                assert_eq!(total, capacity.min(wanted), "capacity {capacity}, wants {wants:?}");
            }
        }
        // With 2 slots for 3, one waits, but not the same one at every turn.
        let short = [(a, 5), (b, 5), (c, 5)];
        for turn in 0..4 {
            let total: u32 = [a, b, c].iter().map(|me| allot(2, &short, *me, turn)).sum();
            assert_eq!(total, 2);
        }
        let waiting: std::collections::BTreeSet<i32> =
            (0..64).flat_map(|turn| [a, b, c].into_iter().filter(move |me| allot(2, &short, *me, turn) == 0)).collect();
        assert_eq!(waiting.len(), 3, "each instance waits at some turn, none at every turn");
    }
}
