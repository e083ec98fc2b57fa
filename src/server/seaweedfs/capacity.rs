//! The capacity view: per volume server and disk, the master's figures
//! (volume slots, volumes, EC shards, bytes) adjusted for the maintenance
//! under way and for finished changes the master has not reported yet; and
//! the check that keeps two proposals off one nearly full disk. The model is
//! pure (`Topology`, `Change`, `view`, `Placement`); `Tracker` feeds it from
//! the master and the engine.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use super::master::Masters;
use crate::clock::{Clock, Timestamp};
use crate::engine::EngineHandle;
use crate::model::JobId;
use crate::proto::api::DiskCapacity;
use crate::proto::master::VolumeListResponse;
use crate::proto::worker::TaskParams;

/// SeaweedFS counts one volume slot for every 10 EC shards on a disk.
pub(crate) const SHARDS_PER_SLOT: i64 = 10;
/// A finished change the master has not shown after this long is taken as
/// shown (it went another way than planned, or the master restarted).
pub(crate) const UNREPORTED_AT_MOST_MS: i64 = 5 * 60 * 1000;

/// A volume as the master lists it on one disk.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct VolumeHere {
    pub size: u64,
    pub deleted_bytes: u64,
    pub compact_revision: u32,
}

/// One disk of one volume server, as the master reports it.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Disk {
    pub server: String,
    pub data_center: String,
    pub rack: String,
    pub disk_type: String,
    pub disk_id: u32,
    pub max_volumes: i64,
    pub free_slots: i64,
    pub volumes: BTreeMap<u32, VolumeHere>,
    /// EC shards by volume: the bit set of shard ids, and their bytes.
    pub shards: BTreeMap<u32, (u32, u64)>,
}

impl Disk {
    pub(crate) fn shard_count(&self) -> i64 {
        self.shards.values().map(|(bits, _)| i64::from(bits.count_ones())).sum()
    }

    pub(crate) fn used_bytes(&self) -> u64 {
        self.volumes.values().map(|v| v.size).sum::<u64>() + self.shards.values().map(|(_, b)| b).sum::<u64>()
    }

    fn is(&self, server: &str, disk_id: Option<u32>) -> bool {
        same_server(&self.server, server) && disk_id.is_none_or(|id| id == self.disk_id)
    }
}

/// Whether two volume server addresses name one server: `host:port`, with
/// or without SeaweedFS's `.grpcport` suffix.
pub(crate) fn same_server(a: &str, b: &str) -> bool {
    fn plain(address: &str) -> &str {
        let address = address.trim();
        match address.rsplit_once(':') {
            Some((_, port)) if port.contains('.') => {
                &address[..address.len() - port.len() + port.find('.').unwrap_or(0)]
            }
            _ => address,
        }
    }
    plain(a) == plain(b)
}

/// The master's topology, flattened to disks.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Topology {
    pub disks: Vec<Disk>,
    pub volume_size_limit: u64,
}

impl Topology {
    pub(crate) fn from_master(list: &VolumeListResponse) -> Topology {
        let mut disks = Vec::new();
        let info = list.topology_info.clone().unwrap_or_default();
        for dc in &info.data_center_infos {
            for rack in &dc.rack_infos {
                for node in &rack.data_node_infos {
                    let server = if node.address.is_empty() { node.id.clone() } else { node.address.clone() };
                    let mut by_type: Vec<(&String, &crate::proto::master::DiskInfo)> = node.disk_infos.iter().collect();
                    by_type.sort_by_key(|(t, _)| t.as_str());
                    for (disk_type, info) in by_type {
                        disks.push(Disk {
                            server: server.clone(),
                            data_center: dc.id.clone(),
                            rack: rack.id.clone(),
                            disk_type: if disk_type.is_empty() { "hdd".into() } else { disk_type.clone() },
                            disk_id: info.disk_id,
                            max_volumes: info.max_volume_count,
                            free_slots: info.free_volume_count,
                            volumes: info
                                .volume_infos
                                .iter()
                                .map(|v| {
                                    let here = VolumeHere {
                                        size: v.size,
                                        deleted_bytes: v.deleted_byte_count,
                                        compact_revision: v.compact_revision,
                                    };
                                    (v.id, here)
                                })
                                .collect(),
                            shards: info
                                .ec_shard_infos
                                .iter()
                                .map(|s| {
                                    (s.id, (s.ec_index_bits, s.shard_sizes.iter().map(|b| (*b).max(0) as u64).sum()))
                                })
                                .collect(),
                        });
                    }
                }
            }
        }
        disks.sort_by(|a, b| (&a.server, a.disk_id, &a.disk_type).cmp(&(&b.server, b.disk_id, &b.disk_type)));
        Topology { disks, volume_size_limit: list.volume_size_limit_mb * 1024 * 1024 }
    }

    /// The disk a change on `server` (and `disk_id`, when known) lands on.
    fn disk_index(&self, server: &str, disk_id: Option<u32>) -> Option<usize> {
        self.disks
            .iter()
            .position(|d| d.is(server, disk_id))
            .or_else(|| self.disks.iter().position(|d| d.is(server, None)))
    }

    /// Where a volume is, as a regular volume: (server, disk id, figures).
    fn volume(&self, id: u32) -> impl Iterator<Item = (&Disk, &VolumeHere)> {
        self.disks.iter().filter_map(move |d| d.volumes.get(&id).map(|v| (d, v)))
    }
}

/// What one task does to one disk.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Delta {
    pub server: String,
    pub disk_id: Option<u32>,
    pub volumes: i64,
    pub shards: i64,
    pub bytes: i64,
    /// The shard ids `shards` counts, when known.
    pub shard_ids: Vec<u32>,
}

/// The kind of change a maintenance task makes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Vacuum,
    Encode,
    Move,
    MoveShards,
}

impl Kind {
    /// Its name in the API: `vacuum`, `encode`, `move` or `move_shards`.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Kind::Vacuum => "vacuum",
            Kind::Encode => "encode",
            Kind::Move => "move",
            Kind::MoveShards => "move_shards",
        }
    }

    /// How a disk's work list names it.
    fn described(self) -> &'static str {
        match self {
            Kind::Vacuum => "vacuum",
            Kind::Encode => "erasure coding",
            Kind::Move => "move",
            Kind::MoveShards => "shard move",
        }
    }
}

/// One task's change to the cluster: what it holds on disks while it runs,
/// and what it leaves once done.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Change {
    /// `JOB_ID/TASK_ID`, or a proposal's id.
    pub key: String,
    pub kind: Kind,
    pub volume: u32,
    /// Taken up while it runs (reservations, copies being written).
    pub while_running: Vec<Delta>,
    /// The end state, once done.
    pub once_done: Vec<Delta>,
    /// When it finished; `None` while it runs.
    pub finished_at_ms: Option<i64>,
    /// The volume's compaction revision when a vacuum began.
    pub revision_before: Option<u32>,
    /// What it was planned from, to plan again once the master knows the
    /// volume's size (it reports sizes with its servers' heartbeats).
    pub job_type: String,
    pub at: Where,
    pub sized: bool,
}

/// What a task's parameters and labels say about where it acts.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Where {
    pub volume: u32,
    /// (server, disk id, shard ids) it reads from.
    pub sources: Vec<(String, Option<u32>, Vec<u32>)>,
    /// (server, disk id, shard ids) it writes to.
    pub targets: Vec<(String, Option<u32>, Vec<u32>)>,
}

impl Where {
    /// From a SeaweedFS `task_params_pb`, else from the loose parameters and
    /// labels (`volume_id`, `server`/`source_server`/`source_node`,
    /// `target_server`/`target_node`).
    pub(crate) fn of(params: Option<&TaskParams>, loose: &dyn Fn(&str) -> Option<String>) -> Option<Where> {
        if let Some(p) = params.filter(|p| p.volume_id != 0 || !p.sources.is_empty()) {
            let volume = if p.volume_id != 0 { p.volume_id } else { p.sources[0].volume_id };
            return Some(Where {
                volume,
                sources: p.sources.iter().map(|s| (s.node.clone(), Some(s.disk_id), s.shard_ids.clone())).collect(),
                targets: p.targets.iter().map(|t| (t.node.clone(), Some(t.disk_id), t.shard_ids.clone())).collect(),
            });
        }
        let volume: u32 = loose("volume_id")?.trim().parse().ok()?;
        let first = |keys: &[&str]| keys.iter().find_map(|k| loose(k).filter(|v| !v.trim().is_empty()));
        let source = first(&["source_server", "source_node", "server"]);
        let target = first(&["target_server", "target_node"]);
        Some(Where {
            volume,
            sources: source.into_iter().map(|s| (s, None, Vec::new())).collect(),
            targets: target.into_iter().map(|t| (t, None, Vec::new())).collect(),
        })
    }
}

impl Change {
    /// The change a task of `job_type` makes, given where it acts and the
    /// topology it starts from; `None` for job types that change no disk.
    pub(crate) fn plan(key: String, job_type: &str, at: &Where, topology: &Topology) -> Option<Change> {
        let volume = at.volume;
        let here = topology.volume(volume).next().map(|(_, v)| v.clone()).unwrap_or_default();
        let size = i64::try_from(here.size).unwrap_or(i64::MAX);
        let delta = |server: &str, disk: Option<u32>, volumes: i64, shards: i64, bytes: i64| Delta {
            server: server.to_string(),
            disk_id: disk,
            volumes,
            shards,
            bytes,
            shard_ids: Vec::new(),
        };
        let with_ids = |mut d: Delta, ids: &[u32]| {
            d.shard_ids = ids.to_vec();
            d
        };
        let (kind, while_running, once_done, revision_before) = match job_type {
            "vacuum" => {
                let live = size - i64::try_from(here.deleted_bytes).unwrap_or(0);
                let mut running = Vec::new();
                let mut done = Vec::new();
                // Every replica is compacted: a copy of the live data, then
                // the garbage is gone.
                let servers: Vec<(String, Option<u32>)> = if at.sources.is_empty() {
                    topology.volume(volume).map(|(d, _)| (d.server.clone(), Some(d.disk_id))).collect()
                } else {
                    at.sources.iter().map(|(s, d, _)| (s.clone(), *d)).collect()
                };
                for (server, disk) in servers {
                    running.push(delta(&server, disk, 0, 0, live.max(0)));
                    done.push(delta(&server, disk, 0, 0, -(size - live.max(0))));
                }
                (Kind::Vacuum, running, done, Some(here.compact_revision))
            }
            "erasure_coding" | "volume_balance" | "ec_balance" => {
                // What arrives on a target is held while the task runs and
                // stays; what leaves a source leaves only once it is done.
                let (mut running, mut done) = (Vec::new(), Vec::new());
                let shard_bytes = size / SHARDS_PER_SLOT;
                for (server, disk, shards) in &at.targets {
                    let n = shards.len().max(1) as i64;
                    let arriving = match job_type {
                        "erasure_coding" => with_ids(delta(server, *disk, 0, n, n * shard_bytes), shards),
                        "volume_balance" => delta(server, *disk, 1, 0, size),
                        _ => with_ids(delta(server, *disk, 0, n, 0), shards),
                    };
                    running.push(arriving.clone());
                    done.push(arriving);
                }
                for (server, disk, shards) in &at.sources {
                    let leaving = match job_type {
                        "erasure_coding" => {
                            // The shards are made beside the volume before they go out.
                            running.push(delta(server, *disk, 0, 0, size + size * 4 / 10));
                            delta(server, *disk, -1, 0, -size)
                        }
                        "volume_balance" => delta(server, *disk, -1, 0, -size),
                        _ => with_ids(delta(server, *disk, 0, -(shards.len().max(1) as i64), 0), shards),
                    };
                    done.push(leaving);
                }
                let kind = match job_type {
                    "erasure_coding" => Kind::Encode,
                    "volume_balance" => Kind::Move,
                    _ => Kind::MoveShards,
                };
                (kind, running, done, None)
            }
            _ => return None,
        };
        Some(Change {
            key,
            kind,
            volume,
            while_running,
            once_done,
            finished_at_ms: None,
            revision_before,
            job_type: job_type.to_string(),
            at: at.clone(),
            sized: here.size > 0,
        })
    }

    /// Whether the master's topology already shows this finished change.
    pub(crate) fn shown_by(&self, topology: &Topology) -> bool {
        let on = |delta: &Delta| topology.disk_index(&delta.server, delta.disk_id).map(|i| &topology.disks[i]);
        match self.kind {
            Kind::Vacuum => topology.volume(self.volume).all(|(_, v)| Some(v.compact_revision) != self.revision_before),
            Kind::Encode => topology.volume(self.volume).next().is_none(),
            Kind::Move => self.once_done.iter().all(|d| {
                let holds = on(d).is_some_and(|disk| disk.volumes.contains_key(&self.volume));
                holds == (d.volumes > 0)
            }),
            Kind::MoveShards => self
                .once_done
                .iter()
                .filter(|d| d.shards > 0)
                .all(|d| on(d).is_some_and(|disk| disk.shards.contains_key(&self.volume))),
        }
    }

    /// What it counts for now: while it runs, what it holds (nothing freed
    /// yet); once done and not yet shown by the master, its end state.
    fn deltas(&self) -> &[Delta] {
        if self.finished_at_ms.is_some() {
            &self.once_done
        } else {
            &self.while_running
        }
    }
}

fn slots_used(volumes: i64, shards: i64) -> i64 {
    volumes + (shards.max(0) + SHARDS_PER_SLOT - 1) / SHARDS_PER_SLOT
}

/// The part of a delta the master does not show yet on `disk`: a volume
/// already there (or already gone) and shards already there (or already
/// gone) are in its own figures, and are not counted twice.
fn not_yet_shown(delta: &Delta, volume: u32, disk: &Disk) -> (i64, i64) {
    let holds_volume = disk.volumes.contains_key(&volume);
    let volumes = match delta.volumes {
        v if v > 0 && holds_volume => 0,
        v if v < 0 && !holds_volume => 0,
        v => v,
    };
    let present = disk.shards.get(&volume).map_or(0, |(bits, _)| *bits);
    let shown = |id: &u32| *id < 32 && present & (1 << id) != 0;
    let shards = match delta.shards {
        _ if delta.shard_ids.is_empty() => delta.shards,
        s if s > 0 => delta.shard_ids.iter().filter(|id| !shown(id)).count() as i64,
        _ => -(delta.shard_ids.iter().filter(|id| shown(id)).count() as i64),
    };
    (volumes, shards)
}

/// The view: every disk with the master's figures, and the changes that
/// land on it counted (`pending_*`, `free_slots_after`, `work`).
pub(crate) fn view(topology: &Topology, changes: &[Change]) -> Vec<DiskCapacity> {
    let mut disks: Vec<DiskCapacity> = topology
        .disks
        .iter()
        .map(|d| {
            let volumes = d.volumes.len() as i64;
            let ec_shards = d.shard_count();
            DiskCapacity {
                server: d.server.clone(),
                data_center: d.data_center.clone(),
                rack: d.rack.clone(),
                disk_type: d.disk_type.clone(),
                disk_id: d.disk_id,
                max_volumes: d.max_volumes,
                volumes,
                ec_shards,
                free_slots: d.free_slots,
                used_bytes: d.used_bytes(),
                free_slots_after: d.free_slots,
                ..DiskCapacity::default()
            }
        })
        .collect();
    for change in changes {
        for delta in change.deltas() {
            let Some(i) = topology.disk_index(&delta.server, delta.disk_id) else { continue };
            let (volumes, shards) = not_yet_shown(delta, change.volume, &topology.disks[i]);
            let disk = &mut disks[i];
            disk.pending_volumes += volumes;
            disk.pending_shards += shards;
            disk.pending_bytes += delta.bytes;
            let what = change.kind.described();
            let when = if change.finished_at_ms.is_some() { ", done, not yet reported" } else { "" };
            let line = format!("{}: {what} of volume {}{when}", change.key, change.volume);
            if !disk.work.contains(&line) {
                disk.work.push(line);
            }
        }
    }
    for disk in &mut disks {
        let now = slots_used(disk.volumes, disk.ec_shards);
        let then = slots_used(disk.volumes + disk.pending_volumes, disk.ec_shards + disk.pending_shards);
        disk.free_slots_after = disk.free_slots - (then - now);
    }
    disks
}

/// Proposals placed one after another on the view: each takes what it
/// needs on its target disks, and one whose target would be left with no
/// free slot is set aside.
pub(crate) struct Placement<'a> {
    topology: &'a Topology,
    changes: Vec<Change>,
}

impl<'a> Placement<'a> {
    pub(crate) fn new(topology: &'a Topology, changes: Vec<Change>) -> Placement<'a> {
        Placement { topology, changes }
    }

    /// Takes the change if every disk it adds to keeps a free slot (or
    /// does not lose one it has not got); else says which disk is too full.
    pub(crate) fn place(&mut self, change: Change) -> Result<(), String> {
        self.changes.push(change);
        let view = view(self.topology, &self.changes);
        let change = self.changes.last().expect("just pushed");
        let short = change.while_running.iter().filter(|d| d.volumes > 0 || d.shards > 0).find_map(|d| {
            let i = self.topology.disk_index(&d.server, d.disk_id)?;
            let disk = &view[i];
            (disk.free_slots_after < 0).then(|| {
                format!(
                    "{} disk {} would have {} free volume slots with the work under way ({} by the master; {})",
                    disk.server,
                    disk.disk_id,
                    disk.free_slots_after,
                    disk.free_slots,
                    disk.work.iter().filter(|w| !w.starts_with(&change.key)).cloned().collect::<Vec<_>>().join("; ")
                )
            })
        });
        match short {
            None => Ok(()),
            Some(why) => {
                self.changes.pop();
                Err(why)
            }
        }
    }
}

/// Keeps the changes of the maintenance under way and of the finished
/// changes the master has not shown yet; `Timestamp`s are the server clock's.
#[derive(Default)]
pub(crate) struct Changes {
    by_key: BTreeMap<String, Change>,
}

impl Changes {
    pub(crate) fn start(&mut self, change: Change) {
        self.by_key.entry(change.key.clone()).or_insert(change);
    }

    pub(crate) fn finish(&mut self, key: &str, now: Timestamp) {
        if let Some(change) = self.by_key.get_mut(key) {
            change.finished_at_ms.get_or_insert(now.as_millis());
        }
    }

    pub(crate) fn drop_change(&mut self, key: &str) {
        self.by_key.remove(key);
    }

    /// Forgets the finished changes the master now shows (or that are old),
    /// and plans again the running ones planned before the master knew
    /// their volume's size.
    pub(crate) fn settle(&mut self, topology: &Topology, now: Timestamp) {
        for change in self.by_key.values_mut().filter(|c| !c.sized && c.finished_at_ms.is_none()) {
            if let Some(again) = Change::plan(change.key.clone(), &change.job_type, &change.at, topology) {
                if again.sized {
                    *change = again;
                }
            }
        }
        self.by_key.retain(|_, c| match c.finished_at_ms {
            None => true,
            Some(at) => now.as_millis() - at < UNREPORTED_AT_MOST_MS && !c.shown_by(topology),
        });
    }

    pub(crate) fn all(&self) -> Vec<Change> {
        self.by_key.values().cloned().collect()
    }
}

/// Feeds the view: the master's topology (asked at most every 2 s) and the
/// changes of the cluster job types' tasks, followed through the engine's
/// events and checked against its held attempts every 2 s.
#[derive(Default)]
pub(crate) struct Tracker {
    changes: std::sync::Mutex<Changes>,
    /// The specs of jobs with a task of a changing job type (`None`: none),
    /// for the jobs with held attempts.
    specs: std::sync::Mutex<HashMap<JobId, Option<Arc<crate::model::JobSpec>>>>,
    /// Tracked tasks by (job, index), for the engine's events.
    keys: std::sync::Mutex<HashMap<(JobId, u32), String>>,
    last: tokio::sync::Mutex<Option<(Arc<Topology>, tokio::time::Instant)>>,
}

/// Job types whose tasks change what the disks hold.
const CHANGING: [&str; 4] = ["vacuum", "erasure_coding", "volume_balance", "ec_balance"];

/// Where a task acts, from its parameters (JSON text) and labels.
pub(crate) fn where_of(parameters: &str, labels: &BTreeMap<String, String>) -> Option<Where> {
    let parameters: serde_json::Map<String, serde_json::Value> = serde_json::from_str(parameters).unwrap_or_default();
    where_of_json(&parameters, labels)
}

/// Where a task or a proposal acts, from its parameters and labels.
pub(crate) fn where_of_json(
    parameters: &serde_json::Map<String, serde_json::Value>,
    labels: &BTreeMap<String, String>,
) -> Option<Where> {
    let params = parameters
        .get("task_params_pb")
        .and_then(|v| v.get("$bytes"))
        .and_then(serde_json::Value::as_str)
        .and_then(crate::wire::decode_hex)
        .and_then(|bytes| <TaskParams as prost::Message>::decode(bytes.as_slice()).ok());
    let loose = |key: &str| -> Option<String> {
        match parameters.get(key) {
            Some(serde_json::Value::String(s)) => Some(s.clone()),
            Some(serde_json::Value::Number(n)) => Some(n.to_string()),
            _ => labels.get(key).cloned(),
        }
    };
    Where::of(params.as_ref(), &loose)
}

/// Whether tasks of this job type change what the disks hold.
pub(crate) fn changes_disks(job_type: &str) -> bool {
    CHANGING.contains(&job_type)
}

impl Tracker {
    /// The master's topology: asked now when `fresh`, else asked again
    /// when older than 2 s; the last one known when the master cannot be
    /// reached, with the error.
    pub(crate) async fn topology(&self, masters: &Masters, fresh: bool) -> (Option<Arc<Topology>>, Option<String>) {
        let mut last = self.last.lock().await;
        if let Some((topology, at)) = last.as_ref().filter(|_| !fresh) {
            if at.elapsed() < std::time::Duration::from_secs(2) {
                return (Some(topology.clone()), None);
            }
        }
        match super::master::volume_list(masters).await {
            Ok(list) => {
                let topology = Arc::new(Topology::from_master(&list));
                *last = Some((topology.clone(), tokio::time::Instant::now()));
                (Some(topology), None)
            }
            Err(e) => (last.as_ref().map(|(t, _)| t.clone()), Some(format!("{e:#}"))),
        }
    }

    pub(crate) fn changes(&self) -> Vec<Change> {
        self.changes.lock().expect("capacity lock").all()
    }

    /// A job's spec when it holds a task of a changing job type (asked of
    /// the engine once per job: most jobs hold none).
    async fn spec_of(&self, engine: &EngineHandle, job: JobId) -> Option<Arc<crate::model::JobSpec>> {
        if let Some(known) = self.specs.lock().expect("capacity lock").get(&job) {
            return known.clone();
        }
        let spec = engine.task_at(job, 0).await.ok().flatten().map(|(spec, _, _)| spec);
        let spec = spec.filter(|s| s.tasks.iter().any(|t| changes_disks(&t.job_type)));
        self.specs.lock().expect("capacity lock").insert(job, spec.clone());
        spec
    }

    /// Starts following task `idx` of a job if it is of a changing job type
    /// and not yet followed.
    async fn follow(&self, engine: &EngineHandle, masters: &Masters, job: JobId, idx: usize) {
        if self.keys.lock().expect("capacity lock").contains_key(&(job, idx as u32)) {
            return;
        }
        let Some(spec) = self.spec_of(engine, job).await else { return };
        let Some(task) = spec.tasks.get(idx).filter(|t| changes_disks(&t.job_type)) else { return };
        let Some(at) = where_of(&task.parameters, &task.labels) else { return };
        let (Some(topology), _) = self.topology(masters, false).await else { return };
        let key = format!("{job}/{}", task.id);
        let Some(change) = Change::plan(key.clone(), &task.job_type, &at, &topology) else { return };
        self.keys.lock().expect("capacity lock").insert((job, idx as u32), key);
        self.changes.lock().expect("capacity lock").start(change);
    }

    /// Whether a job may hold a changing task (unknown jobs may).
    fn may_change(&self, job: JobId) -> bool {
        self.specs.lock().expect("capacity lock").get(&job).is_none_or(Option::is_some)
    }

    /// A followed task ended: a success is kept until the master shows it.
    fn ended(&self, job: JobId, idx: u32, succeeded: bool, now: Timestamp) {
        let Some(key) = self.keys.lock().expect("capacity lock").remove(&(job, idx)) else { return };
        let mut changes = self.changes.lock().expect("capacity lock");
        if succeeded {
            changes.finish(&key, now);
        } else {
            changes.drop_change(&key);
        }
    }

    /// Brings the followed tasks in line with the attempts the engine holds
    /// (in case events were missed), forgets the specs of jobs that hold
    /// none, and the finished changes the master now shows.
    async fn resync(&self, engine: &EngineHandle, masters: &Masters, clock: &dyn Clock) {
        let Ok(held) = engine.attempts().await else { return };
        let mut live = HashSet::new();
        for attempt in &held {
            let Some(spec) = self.spec_of(engine, attempt.job).await else { continue };
            let Some(idx) = spec.tasks.iter().position(|t| *t.id == *attempt.task_id) else { continue };
            if changes_disks(&spec.tasks[idx].job_type) {
                live.insert((attempt.job, idx as u32));
                self.follow(engine, masters, attempt.job, idx).await;
            }
        }
        let holding: HashSet<JobId> = held.iter().map(|a| a.job).collect();
        self.specs.lock().expect("capacity lock").retain(|job, _| holding.contains(job));
        let now = clock.now();
        let gone: Vec<(JobId, u32)> =
            self.keys.lock().expect("capacity lock").keys().filter(|k| !live.contains(k)).copied().collect();
        for (job, idx) in gone {
            let state = engine.task_at(job, idx as usize).await.ok().flatten().map(|(_, _, r)| r.state());
            self.ended(job, idx, state == Some(crate::model::TaskState::Succeeded), now);
        }
        if let (Some(topology), _) = self.topology(masters, false).await {
            self.changes.lock().expect("capacity lock").settle(&topology, now);
        }
    }
}

/// Follows the engine's events and resyncs every 2 s, while masters are given.
pub(crate) async fn follow(tracker: Arc<Tracker>, masters: Arc<Masters>, engine: EngineHandle, clock: Arc<dyn Clock>) {
    use crate::engine::Event;
    use crate::model::TaskState;
    let mut events = engine.subscribe();
    let mut tick = tokio::time::interval(std::time::Duration::from_secs(2));
    loop {
        tokio::select! {
            _ = tick.tick() => tracker.resync(&engine, &masters, &*clock).await,
            event = events.recv() => match event {
                Ok(Event::Task { job, idx, state, at, .. }) => match state {
                    TaskState::Assigned | TaskState::Running if tracker.may_change(job) => {
                        tracker.follow(&engine, &masters, job, idx as usize).await;
                    }
                    TaskState::Succeeded => tracker.ended(job, idx, true, at),
                    _ => tracker.ended(job, idx, false, at),
                },
                Ok(Event::Job { .. }) => {}
                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => tracker.resync(&engine, &masters, &*clock).await,
                Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn disk(server: &str, max: i64, volumes: &[(u32, u64, u64)], shards: &[(u32, u32)]) -> Disk {
        let volumes: BTreeMap<u32, VolumeHere> = volumes
            .iter()
            .map(|(id, size, deleted)| (*id, VolumeHere { size: *size, deleted_bytes: *deleted, compact_revision: 0 }))
            .collect();
        let shards: BTreeMap<u32, (u32, u64)> = shards.iter().map(|(id, bits)| (*id, (*bits, 0))).collect();
        let used = volumes.len() as i64 + (shards.values().map(|(b, _)| b.count_ones() as i64).sum::<i64>() + 9) / 10;
        Disk {
            server: server.into(),
            disk_type: "hdd".into(),
            max_volumes: max,
            free_slots: max - used,
            volumes,
            shards,
            ..Disk::default()
        }
    }

    fn encode(volume: u32, source: &str, targets: &[(&str, &[u32])]) -> Where {
        Where {
            volume,
            sources: vec![(source.into(), None, Vec::new())],
            targets: targets.iter().map(|(s, ids)| (s.to_string(), None, ids.to_vec())).collect(),
        }
    }

    fn topology() -> Topology {
        Topology {
            disks: vec![
                disk("a:8080", 10, &[(1, 1000, 0), (2, 1000, 400)], &[]),
                disk("b:8080", 10, &[], &[]),
                disk("c:8080", 1, &[], &[]),
            ],
            volume_size_limit: 1000,
        }
    }

    #[test]
    fn an_encode_under_way_holds_its_shards_on_the_targets_and_frees_the_source_only_once_done() {
        let t = topology();
        let at = encode(1, "a:8080", &[("b:8080", &[0, 1, 2, 3, 4, 5, 6]), ("c:8080", &[7, 8, 9, 10, 11, 12, 13])]);
        let mut change = Change::plan("j/ec".into(), "erasure_coding", &at, &t).unwrap();
        let v = view(&t, std::slice::from_ref(&change));
        let (a, b, c) = (&v[0], &v[1], &v[2]);
        assert_eq!((a.free_slots, a.free_slots_after, a.pending_volumes), (8, 8, 0), "nothing freed while it runs");
        assert!(a.pending_bytes > 1000, "the shards are made beside the volume: {a:?}");
        assert_eq!((b.pending_shards, b.free_slots_after), (7, 9));
        assert_eq!((c.pending_shards, c.free_slots_after), (7, 0));
        assert_eq!(c.work, vec!["j/ec: erasure coding of volume 1".to_string()]);
        // Done, not yet shown: the volume leaves its source.
        change.finished_at_ms = Some(5);
        let v = view(&t, std::slice::from_ref(&change));
        assert_eq!((v[0].pending_volumes, v[0].free_slots_after), (-1, 9));
        assert!(v[2].work[0].ends_with("done, not yet reported"));
        // The master shows it once the volume is gone as a regular volume.
        assert!(!change.shown_by(&t));
        let mut after = t.clone();
        after.disks[0].volumes.remove(&1);
        assert!(change.shown_by(&after));
    }

    #[test]
    fn what_the_master_already_shows_is_not_counted_twice() {
        let mut t = topology();
        let at = encode(1, "a:8080", &[("b:8080", &[0, 1, 2, 3, 4, 5, 6]), ("c:8080", &[7, 8, 9, 10, 11, 12, 13])]);
        let mut change = Change::plan("j/ec".into(), "erasure_coding", &at, &t).unwrap();
        // Three of c's shards have arrived and the master shows them.
        t.disks[2].shards.insert(1, ((1 << 7) | (1 << 8) | (1 << 9), 0));
        t.disks[2].free_slots = 0;
        let v = view(&t, std::slice::from_ref(&change));
        assert_eq!((v[2].ec_shards, v[2].pending_shards, v[2].free_slots_after), (3, 4, 0));
        // Done, and the master no longer lists the volume on its source.
        change.finished_at_ms = Some(1);
        t.disks[0].volumes.remove(&1);
        t.disks[0].free_slots = 9;
        let v = view(&t, std::slice::from_ref(&change));
        assert_eq!((v[0].pending_volumes, v[0].free_slots_after), (0, 9));
    }

    #[test]
    fn a_vacuum_holds_a_copy_of_the_live_data_and_is_shown_by_a_new_compaction_revision() {
        let t = topology();
        let at = Where { volume: 2, ..Where::default() };
        let change = Change::plan("j/v".into(), "vacuum", &at, &t).unwrap();
        let v = view(&t, std::slice::from_ref(&change));
        assert_eq!((v[0].pending_bytes, v[0].free_slots_after), (600, 8));
        assert_eq!(change.once_done[0].bytes, -400);
        let mut after = t.clone();
        after.disks[0].volumes.get_mut(&2).unwrap().compact_revision = 1;
        assert!(!change.shown_by(&t) && change.shown_by(&after));
        assert_eq!(Change::plan("j/x".into(), "s3_lifecycle", &at, &t), None);
    }

    #[test]
    fn a_second_proposal_onto_a_disk_the_first_fills_is_set_aside() {
        let t = topology();
        let first = encode(1, "a:8080", &[("b:8080", &[0, 1, 2, 3, 4, 5, 6]), ("c:8080", &[7, 8, 9, 10, 11, 12, 13])]);
        let second = encode(2, "a:8080", &[("b:8080", &[0, 1, 2, 3, 4, 5, 6]), ("c:8080", &[7, 8, 9, 10, 11, 12, 13])]);
        let elsewhere = encode(2, "a:8080", &[("b:8080", &[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13])]);
        let mut placement = Placement::new(&t, Vec::new());
        assert_eq!(placement.place(Change::plan("p1".into(), "erasure_coding", &first, &t).unwrap()), Ok(()));
        let refused = placement.place(Change::plan("p2".into(), "erasure_coding", &second, &t).unwrap()).unwrap_err();
        assert!(refused.starts_with("c:8080 disk 0 would have -1 free volume slots"), "{refused}");
        assert!(refused.contains("p1: erasure coding of volume 1"), "{refused}");
        assert_eq!(placement.place(Change::plan("p3".into(), "erasure_coding", &elsewhere, &t).unwrap()), Ok(()));
    }

    #[test]
    fn finished_changes_are_kept_until_the_master_shows_them_or_for_five_minutes() {
        let t = topology();
        let at = encode(1, "a:8080", &[("b:8080", &[0])]);
        let mut changes = Changes::default();
        changes.start(Change::plan("j/ec".into(), "erasure_coding", &at, &t).unwrap());
        let finished = |changes: &Changes| changes.all().iter().map(|c| c.finished_at_ms).collect::<Vec<_>>();
        changes.settle(&t, Timestamp(0));
        assert_eq!(finished(&changes), [None]);
        changes.finish("j/ec", Timestamp(1000));
        changes.settle(&t, Timestamp(2000));
        assert_eq!(finished(&changes), [Some(1000)]);
        changes.settle(&t, Timestamp(1000 + UNREPORTED_AT_MOST_MS));
        assert!(changes.all().is_empty());
    }

    #[test]
    fn server_addresses_match_with_or_without_a_grpc_port() {
        assert!(same_server("127.0.0.1:8080", "127.0.0.1:8080.18080"));
        assert!(same_server(" 127.0.0.1:8080", "127.0.0.1:8080"));
        assert!(!same_server("127.0.0.1:8080", "127.0.0.1:8081"));
    }

    #[test]
    fn where_a_task_acts_comes_from_task_params_else_from_loose_parameters() {
        let params = TaskParams {
            volume_id: 7,
            sources: vec![crate::proto::worker::TaskSource { node: "a:8080".into(), disk_id: 1, ..Default::default() }],
            targets: vec![crate::proto::worker::TaskTarget {
                node: "b:8080".into(),
                shard_ids: vec![0, 1],
                ..Default::default()
            }],
            ..Default::default()
        };
        let none = |_: &str| None;
        let at = Where::of(Some(&params), &none).unwrap();
        assert_eq!(at.volume, 7);
        assert_eq!(at.sources, vec![("a:8080".to_string(), Some(1), vec![])]);
        assert_eq!(at.targets, vec![("b:8080".to_string(), Some(0), vec![0, 1])]);
        let loose = |k: &str| match k {
            "volume_id" => Some("9".to_string()),
            "server" => Some("a:8080".to_string()),
            _ => None,
        };
        let at = Where::of(None, &loose).unwrap();
        assert_eq!((at.volume, at.sources.len(), at.targets.len()), (9, 1, 0));
        assert_eq!(Where::of(None, &none), None);
    }
}
