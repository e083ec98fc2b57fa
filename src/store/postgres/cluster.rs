//! The cluster side of the PostgreSQL store: instances and their
//! heartbeats, deactivation of silent ones, job ownership, detection slots
//! and leases. Every time is the database's `now()`; every change an
//! instance makes passes `jobcenter.fence`.

use std::collections::HashMap;
use std::time::Duration;

use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::Row;
use uuid::Uuid;

use super::news::NEWS_CHANNEL;
use super::{decode_job, read_transaction, PgStore};
use crate::model::{HandlerId, JobId, JobRecord};
use crate::store::cluster::{
    allot, Beat, Cluster, Grant, Instance, Introduction, Membership, PermitNews, PermitRequest, Role, RunClaim,
    SharedSession, Whereabouts,
};
use crate::store::{Error, StoredJob};

/// The columns `instance` reads, in its order.
const INSTANCE_COLUMNS: &str = "id, role, grpc_address, http_address, \
     (extract(epoch FROM started_at) * 1000)::int8, (extract(epoch FROM heartbeat) * 1000)::int8, \
     (extract(epoch FROM now() - heartbeat) * 1000)::int8, paused, jobs_led, workers, detectors, detections, handlers, \
     status = 'active'";

/// Jobs led by an instance that is no longer active, however it went
/// (deactivated now or earlier, its row removed), are free to claim.
const FREE_ORPHANED_JOBS: &str = "UPDATE jobcenter.jobs SET owner = NULL WHERE active AND owner IS NOT NULL \
     AND owner NOT IN (SELECT id FROM jobcenter.instances WHERE status = 'active')";

/// How long a deactivated instance's row stays visible before it is removed.
const KEEP_DEACTIVATED: &str = "10 minutes";

fn instance(row: &Row) -> Instance {
    let role: &str = row.get(1);
    let handlers: Vec<Uuid> = row.get(12);
    Instance {
        id: HandlerId(row.get(0)),
        role: if role == "run" { Role::Run } else { Role::Server },
        grpc_address: row.get(2),
        http_address: row.get(3),
        started_at_ms: row.get(4),
        heartbeat_ms: row.get(5),
        heartbeat_age_ms: row.get(6),
        paused: row.get(7),
        jobs_led: usize::try_from(row.get::<_, i32>(8)).unwrap_or(0),
        workers: usize::try_from(row.get::<_, i32>(9)).unwrap_or(0),
        detectors: row.get(10),
        detections: row.get(11),
        handlers: handlers.into_iter().map(HandlerId).collect(),
        active: row.get(13),
    }
}

fn count(n: usize) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}

impl PgStore {
    fn me_or_refuse(&self) -> Result<Uuid, Error> {
        self.me.get().copied().ok_or_else(|| Error::Io("this process has not registered as an admin instance".into()))
    }
}

impl Cluster for PgStore {
    fn register(&self, introduction: &Introduction) -> Result<HandlerId, Error> {
        let id = Uuid::new_v4();
        self.block_on(async {
            let mut client = self.reader().await?;
            let transaction = client.transaction().await.map_err(|e| self.error(&e))?;
            // An active instance on this very address is this server's previous
            // run (two processes cannot listen on one address): its jobs pass to
            // this run now, and are loaded at its start as after any restart,
            // rather than freed after the lag threshold.
            let previous: Vec<Uuid> = transaction
                .query(
                    "UPDATE jobcenter.instances SET status = 'deactivated' \
                     WHERE status = 'active' AND grpc_address = $1 AND http_address = $2 RETURNING id",
                    &[&introduction.grpc_address, &introduction.http_address],
                )
                .await
                .map_err(|e| self.error(&e))?
                .iter()
                .map(|row| row.get(0))
                .collect();
            transaction
                .execute("UPDATE jobcenter.jobs SET owner = $1 WHERE active AND owner = ANY($2)", &[&id, &previous])
                .await
                .map_err(|e| self.error(&e))?;
            transaction
                .execute(
                    "INSERT INTO jobcenter.instances (id, role, grpc_address, http_address) VALUES ($1, $2, $3, $4)",
                    &[&id, &introduction.role.as_str(), &introduction.grpc_address, &introduction.http_address],
                )
                .await
                .map_err(|e| self.error(&e))?;
            transaction.commit().await.map_err(|e| self.error(&e))
        })?;
        self.me.set(id).map_err(|_| Error::Io("this process registered as an admin instance twice".into()))?;
        let (tell, news) = tokio::sync::watch::channel(false);
        let runtime = self.runtime.as_ref().expect("the runtime lives as long as the store");
        runtime.spawn(super::news::listen(self.target.config.clone(), self.target.tls.clone(), id, tell));
        let _ = self.permit_news.set(news);
        Ok(HandlerId(id))
    }

    fn me(&self) -> Option<HandlerId> {
        self.me.get().copied().map(HandlerId)
    }

    fn heartbeat(&self, beat: &Beat, lag: Duration) -> Result<Membership, Error> {
        let me = self.me_or_refuse()?;
        let handlers: Vec<Uuid> = beat.handlers.iter().map(|h| h.0).collect();
        let (jobs_led, workers, lag_s) = (count(beat.jobs_led), count(beat.workers), lag.as_secs_f64());
        let remove_gone = |table: &str| {
            format!(
                "DELETE FROM jobcenter.{table} WHERE holder NOT IN \
                 (SELECT id FROM jobcenter.instances WHERE status = 'active')"
            )
        };
        let (leases, permits, wants) = (remove_gone("leases"), remove_gone("permits"), remove_gone("permit_wants"));
        let forget = format!(
            "DELETE FROM jobcenter.instances WHERE status = 'deactivated' AND heartbeat < now() - interval '{KEEP_DEACTIVATED}'"
        );
        let instances_query =
            format!("SELECT {INSTANCE_COLUMNS} FROM jobcenter.instances WHERE status = 'active' ORDER BY id");
        self.block_on(async {
            let mut client = self.reader().await?;
            let transaction = client.transaction().await.map_err(|e| self.error(&e))?;
            // Every statement goes out at once and runs in order (a
            // pipeline, each statement typed so that none waits for its own
            // preparation): a heartbeat costs about one round trip to the
            // database besides its transaction's, however far it is.
            let fence_params: [(&(dyn ToSql + Sync), Type); 1] = [(&me, Type::UUID)];
            let beat_params: [(&(dyn ToSql + Sync), Type); 6] = [
                (&me, Type::UUID),
                (&jobs_led, Type::INT4),
                (&workers, Type::INT4),
                (&beat.detectors, Type::TEXT_ARRAY),
                (&beat.detections, Type::TEXT_ARRAY),
                (&handlers, Type::UUID_ARRAY),
            ];
            let lag_params: [(&(dyn ToSql + Sync), Type); 2] = [(&lag_s, Type::FLOAT8), (&beat.may_judge, Type::BOOL)];
            let (fence, mine, deactivated, freed, leases, permits, wants, forgotten, instances, counts) = tokio::join!(
                biased;
                // The heartbeat is a write like any other: fenced.
                transaction.execute_typed("SELECT jobcenter.fence($1)", &fence_params),
                transaction.query_typed_opt(
                    "UPDATE jobcenter.instances SET heartbeat = now(), jobs_led = $2, workers = $3, \
                     detectors = $4, detections = $5, handlers = $6 \
                     WHERE id = $1 AND status = 'active' RETURNING (extract(epoch FROM now()) * 1000)::int8",
                    &beat_params,
                ),
                // Only an instance that has reached the database without a
                // break for the lag judges others silent (`Beat::may_judge`).
                // A silent instance whose row a write of its own still locks
                // (the fence's share lock, in a transaction its connection
                // left open when the network failed) is skipped, not waited
                // for: the write may still land, and the server ends that
                // session within seconds (`connect::SESSION_SETUP`); the next
                // heartbeat deactivates it then. Waiting would stall this
                // heartbeat, and make this instance look silent too.
                transaction.query_typed(
                    "UPDATE jobcenter.instances SET status = 'deactivated' WHERE id IN \
                     (SELECT id FROM jobcenter.instances WHERE $2 AND status = 'active' \
                     AND heartbeat < now() - make_interval(secs => $1) FOR UPDATE SKIP LOCKED) RETURNING id",
                    &lag_params,
                ),
                transaction.execute_typed(FREE_ORPHANED_JOBS, &[]),
                // A lease, a permit slot or a want of an instance that is
                // gone is free at once (a slot so held is free to take anyway).
                transaction.execute_typed(&leases, &[]),
                transaction.execute_typed(&permits, &[]),
                transaction.execute_typed(&wants, &[]),
                transaction.execute_typed(&forget, &[]),
                transaction.query_typed(&instances_query, &[]),
                transaction.query_typed_one(
                    "SELECT count(*), count(*) FILTER (WHERE owner IS NULL) FROM jobcenter.jobs WHERE active",
                    &[],
                ),
            );
            fence.map_err(|e| self.error(&e))?;
            let Some(mine) = mine.map_err(|e| self.error(&e))? else {
                return Err(Error::Fenced { instance: me.to_string() });
            };
            let deactivated = deactivated.map_err(|e| self.error(&e))?;
            if !deactivated.is_empty() {
                // The slots they held are free: news to every instance, this one too.
                transaction.execute(TELL, &[&NEWS_CHANNEL, &""]).await.map_err(|e| self.error(&e))?;
            }
            for done in [freed, leases, permits, wants, forgotten] {
                done.map_err(|e| self.error(&e))?;
            }
            let (instances, counts) = (instances.map_err(|e| self.error(&e))?, counts.map_err(|e| self.error(&e))?);
            let now_ms: i64 = mine.get(0);
            transaction.commit().await.map_err(|e| self.error(&e))?;
            Ok(Membership {
                now_ms,
                instances: instances.iter().map(instance).collect(),
                deactivated: deactivated.iter().map(|row| HandlerId(row.get(0))).collect(),
                active_jobs: usize::try_from(counts.get::<_, i64>(0)).unwrap_or(0),
                unowned_jobs: usize::try_from(counts.get::<_, i64>(1)).unwrap_or(0),
            })
        })
    }

    fn claim(&self, up_to: usize, handlers: &[HandlerId]) -> Result<Vec<StoredJob>, Error> {
        let me = self.me_or_refuse()?;
        let handlers: Vec<Uuid> = handlers.iter().map(|h| h.0).collect();
        self.block_on(async {
            let mut client = self.reader().await?;
            let transaction = client.transaction().await.map_err(|e| self.error(&e))?;
            transaction.execute("SELECT jobcenter.fence($1)", &[&me]).await.map_err(|e| self.error(&e))?;
            // Jobs whose attempts run on workers connected here come first,
            // whatever the share: their workers report here.
            let mut rows = transaction
                .query(
                    "WITH picked AS (SELECT j.id FROM jobcenter.jobs j WHERE j.active AND j.owner IS NULL \
                     AND EXISTS (SELECT 1 FROM jobcenter.tasks t WHERE t.job_id = j.id \
                     AND t.handler = ANY($2) AND t.state IN ('assigned', 'running')) \
                     FOR UPDATE SKIP LOCKED) \
                     UPDATE jobcenter.jobs SET owner = $1 FROM picked WHERE jobs.id = picked.id RETURNING jobs.record",
                    &[&me, &handlers],
                )
                .await
                .map_err(|e| self.error(&e))?;
            let more = up_to.saturating_sub(rows.len());
            if more > 0 {
                let limit = i64::try_from(more).unwrap_or(i64::MAX);
                rows.extend(
                    transaction
                        .query(
                            "WITH picked AS (SELECT id FROM jobcenter.jobs WHERE active AND owner IS NULL \
                             ORDER BY id LIMIT $2 FOR UPDATE SKIP LOCKED) \
                             UPDATE jobcenter.jobs SET owner = $1 FROM picked WHERE jobs.id = picked.id \
                             RETURNING jobs.record",
                            &[&me, &limit],
                        )
                        .await
                        .map_err(|e| self.error(&e))?,
                );
            }
            let records = rows.iter().map(|row| decode_job(row.get(0))).collect::<Result<Vec<JobRecord>, Error>>()?;
            let jobs = self.read_jobs(&transaction, records).await?;
            transaction.commit().await.map_err(|e| self.error(&e))?;
            Ok(jobs)
        })
    }

    fn claim_detection(&self, job_type: &str, interval: Duration, slot: i64) -> Result<bool, Error> {
        let me = self.me_or_refuse()?;
        let interval_ms = i64::try_from(interval.as_millis()).unwrap_or(i64::MAX).max(1);
        self.block_on(async {
            let client = self.reader().await?;
            let row = client
                .query_opt(
                    "INSERT INTO jobcenter.detections (job_type, slot, instance) \
                     SELECT $1::text, $2::int8, $3::uuid WHERE jobcenter.fence($3::uuid) \
                     AND floor(extract(epoch FROM clock_timestamp()) * 1000 / $4::int8)::int8 = $2 \
                     ON CONFLICT DO NOTHING RETURNING slot",
                    &[&job_type, &slot, &me, &interval_ms],
                )
                .await
                .map_err(|e| self.error(&e))?;
            if row.is_some() && slot % 256 == 0 {
                let _ = client
                    .execute("DELETE FROM jobcenter.detections WHERE claimed_at < now() - interval '1 day'", &[])
                    .await;
            }
            Ok(row.is_some())
        })
    }

    fn lease(&self, name: &str, ttl: Duration) -> Result<bool, Error> {
        let me = self.me_or_refuse()?;
        self.block_on(async {
            let client = self.reader().await?;
            let row = client
                .query_opt(
                    "INSERT INTO jobcenter.leases (name, holder, expires) \
                     SELECT $1::text, $2::uuid, now() + make_interval(secs => $3::float8) WHERE jobcenter.fence($2::uuid) \
                     ON CONFLICT (name) DO UPDATE SET holder = excluded.holder, expires = excluded.expires \
                     WHERE leases.holder = excluded.holder OR leases.expires < now() RETURNING holder",
                    &[&name, &me, &ttl.as_secs_f64()],
                )
                .await
                .map_err(|e| self.error(&e))?;
            Ok(row.is_some())
        })
    }

    fn open_session(&self, id: &[u8], session: &SharedSession, lifetime: Duration) -> Result<(), Error> {
        let seconds = lifetime.as_secs_f64();
        self.block_on(async {
            let client = self.reader().await?;
            client
                .execute(
                    "DELETE FROM jobcenter.sessions WHERE opened_at < now() - make_interval(secs => $1)",
                    &[&seconds],
                )
                .await
                .map_err(|e| self.error(&e))?;
            client
                .execute(
                    "INSERT INTO jobcenter.sessions (id, csrf, caller) VALUES ($1, $2, $3)",
                    &[&id, &session.csrf, &session.caller],
                )
                .await
                .map_err(|e| self.error(&e))?;
            Ok(())
        })
    }

    fn session(&self, id: &[u8], lifetime: Duration) -> Result<Option<SharedSession>, Error> {
        let seconds = lifetime.as_secs_f64();
        self.block_on(async {
            let client = self.reader().await?;
            let row = client
                .query_opt(
                    "SELECT csrf, caller FROM jobcenter.sessions \
                     WHERE id = $1 AND opened_at >= now() - make_interval(secs => $2)",
                    &[&id, &seconds],
                )
                .await
                .map_err(|e| self.error(&e))?;
            Ok(row.map(|row| SharedSession { csrf: row.get(0), caller: row.get(1) }))
        })
    }

    fn close_session(&self, id: &[u8]) -> Result<Option<SharedSession>, Error> {
        self.block_on(async {
            let client = self.reader().await?;
            let row = client
                .query_opt("DELETE FROM jobcenter.sessions WHERE id = $1 RETURNING csrf, caller", &[&id])
                .await
                .map_err(|e| self.error(&e))?;
            Ok(row.map(|row| SharedSession { csrf: row.get(0), caller: row.get(1) }))
        })
    }

    fn instances(&self) -> Result<Vec<Instance>, Error> {
        self.block_on(async {
            let client = self.reader().await?;
            let rows = client
                .query(
                    &format!("SELECT {INSTANCE_COLUMNS} FROM jobcenter.instances ORDER BY status, started_at, id"),
                    &[],
                )
                .await
                .map_err(|e| self.error(&e))?;
            Ok(rows
                .iter()
                .map(instance)
                .map(|mut one| {
                    if !one.active {
                        one.jobs_led = 0;
                        one.workers = 0;
                        one.handlers.clear();
                        one.detections.clear();
                        one.detectors.clear();
                    }
                    one
                })
                .collect())
        })
    }

    fn set_paused(&self, instance: Option<HandlerId>, paused: bool) -> Result<usize, Error> {
        let instance = instance.map(|i| i.0);
        self.block_on(async {
            let client = self.reader().await?;
            let changed = client
                .execute(
                    "UPDATE jobcenter.instances SET paused = $2 WHERE status = 'active' AND ($1::uuid IS NULL OR id = $1)",
                    &[&instance, &paused],
                )
                .await
                .map_err(|e| self.error(&e))?;
            Ok(usize::try_from(changed).unwrap_or(usize::MAX))
        })
    }

    fn whereabouts(&self, job: JobId) -> Result<Option<Whereabouts>, Error> {
        self.block_on(async {
            let mut client = self.reader().await?;
            let transaction = read_transaction(&mut client).await.map_err(|e| self.error(&e))?;
            let Some(row) = transaction
                .query_opt("SELECT record, owner FROM jobcenter.jobs WHERE id = $1", &[&job.0])
                .await
                .map_err(|e| self.error(&e))?
            else {
                return Ok(None);
            };
            let record = decode_job(row.get(0))?;
            let owner: Option<Uuid> = row.get(1);
            let owner = match owner {
                Some(owner) => transaction
                    .query_opt(
                        &format!(
                            "SELECT {INSTANCE_COLUMNS} FROM jobcenter.instances WHERE id = $1 AND status = 'active'"
                        ),
                        &[&owner],
                    )
                    .await
                    .map_err(|e| self.error(&e))?
                    .as_ref()
                    .map(instance),
                None => None,
            };
            Ok(Some(Whereabouts { state: record.state, owner }))
        })
    }

    fn leave(&self) -> Result<(), Error> {
        let me = self.me_or_refuse()?;
        self.block_on(async {
            let mut client = self.reader().await?;
            let transaction = client.transaction().await.map_err(|e| self.error(&e))?;
            transaction
                .execute("UPDATE jobcenter.jobs SET owner = NULL WHERE owner = $1", &[&me])
                .await
                .map_err(|e| self.error(&e))?;
            transaction
                .execute("DELETE FROM jobcenter.permits WHERE holder = $1", &[&me])
                .await
                .map_err(|e| self.error(&e))?;
            transaction
                .execute("DELETE FROM jobcenter.permit_wants WHERE holder = $1", &[&me])
                .await
                .map_err(|e| self.error(&e))?;
            transaction
                .execute("DELETE FROM jobcenter.instances WHERE id = $1", &[&me])
                .await
                .map_err(|e| self.error(&e))?;
            transaction.commit().await.map_err(|e| self.error(&e))
        })
    }

    fn permit_news(&self) -> Option<PermitNews> {
        self.permit_news.get().cloned()
    }

    fn permits(&self, requests: &[PermitRequest]) -> Result<Vec<Grant>, Error> {
        let me = self.me_or_refuse()?;
        let mut memory = self.permit_memory.lock().expect("the permit memory is not poisoned");
        let settled = self.block_on(settle_permits(self, me, requests, &mut memory));
        if settled.is_err() {
            // What a failed settlement did is not known: ask the database next time.
            memory.clear();
        }
        settled
    }

    fn claim_schedule_run(&self, schedule: &str, slot: i64) -> Result<RunClaim, Error> {
        let me = self.me_or_refuse()?;
        self.block_on(async {
            let client = self.reader().await?;
            // A claim of this instance's own, or of one no longer active, is
            // taken (again); a fresh row is told apart by its xmax.
            let row = client
                .query_opt(
                    "INSERT INTO jobcenter.schedule_runs (schedule, slot, instance) \
                     SELECT $1::text, $2::int8, $3::uuid WHERE jobcenter.fence($3::uuid) \
                     ON CONFLICT (schedule, slot) DO UPDATE SET instance = excluded.instance, claimed_at = now() \
                     WHERE schedule_runs.instance = excluded.instance OR NOT EXISTS \
                     (SELECT 1 FROM jobcenter.instances i WHERE i.id = schedule_runs.instance AND i.status = 'active') \
                     RETURNING xmax = 0",
                    &[&schedule, &slot, &me],
                )
                .await
                .map_err(|e| self.error(&e))?;
            let claim = match row {
                None => RunClaim::Held,
                Some(row) if row.get::<_, bool>(0) => RunClaim::Fresh,
                Some(_) => RunClaim::TakenOver,
            };
            if claim == RunClaim::Fresh {
                let _ = client
                    .execute("DELETE FROM jobcenter.schedule_runs WHERE claimed_at < now() - interval '7 days'", &[])
                    .await;
            }
            Ok(claim)
        })
    }
}

/// What this instance last made of one permit key in the database: the want
/// it recorded and the capacity it trimmed its slots to. While the instance
/// is active nobody else writes its rows, so the memory stays true until a
/// settlement fails (then it is dropped).
#[derive(Clone, Copy, Debug)]
pub(super) struct Remembered {
    want: i32,
    capacity: i32,
    /// It waited for slots others hold (and said so).
    waiting: bool,
}

/// Permit news (`news::NEWS_CHANNEL`), from this instance (`$2`) or to all.
const TELL: &str = "SELECT pg_notify($1::text, $2::text)";

/// Records this instance's want of a key.
const WRITE_WANT: &str = "INSERT INTO jobcenter.permit_wants (key, holder, want) \
     SELECT $1::text, $2::uuid, $3::int4 WHERE jobcenter.fence($2::uuid) \
     ON CONFLICT (key, holder) DO UPDATE SET want = excluded.want";

/// A want of 0 is no row: the table holds what live instances want now.
const DROP_WANT: &str =
    "DELETE FROM jobcenter.permit_wants WHERE key = $1 AND holder = $2 AND jobcenter.fence($2::uuid)";

/// In one row: the fence, the turn (whoever waits when there is not enough
/// changes every 10 s of the database's clock), the slots this instance
/// holds, the slots under the capacity other live instances hold, and the
/// wants of the live instances.
const READ_SPLIT: &str = "SELECT (SELECT jobcenter.fence($2::uuid)), floor(extract(epoch FROM now()) / 10)::int8, \
       (SELECT count(*) FROM jobcenter.permits WHERE key = $1 AND holder = $2), \
       (SELECT count(*) FROM jobcenter.permits p JOIN jobcenter.instances i ON i.id = p.holder \
         AND i.status = 'active' WHERE p.key = $1 AND p.holder <> $2 AND p.slot < $3), \
       coalesce(array_agg(w.holder), '{}'), coalesce(array_agg(w.want), '{}') \
     FROM jobcenter.permit_wants w JOIN jobcenter.instances i ON i.id = w.holder AND i.status = 'active' \
     WHERE w.key = $1 AND w.want > 0";

/// Gives back the slots past the capacity or past what is kept.
const GIVE_BACK: &str = "DELETE FROM jobcenter.permits WHERE key = $1 AND holder = $2 AND (slot >= $3 OR slot IN \
     (SELECT slot FROM jobcenter.permits WHERE key = $1 AND holder = $2 AND slot < $3 ORDER BY slot OFFSET $4))";

/// Takes free slots: never taken, or held by an instance no longer active.
/// Each row written is a slot this instance did not hold.
const TAKE: &str = "INSERT INTO jobcenter.permits (key, slot, holder) \
     SELECT $1::text, s, $2::uuid FROM generate_series(0, $3::int4 - 1) s \
     WHERE jobcenter.fence($2::uuid) AND NOT EXISTS (SELECT 1 FROM jobcenter.permits p \
       JOIN jobcenter.instances i ON i.id = p.holder AND i.status = 'active' \
       WHERE p.key = $1 AND p.slot = s) \
     ORDER BY s LIMIT $4 \
     ON CONFLICT (key, slot) DO UPDATE SET holder = excluded.holder \
     WHERE permits.holder NOT IN (SELECT id FROM jobcenter.instances WHERE status = 'active')";

/// One settlement (`Cluster::permits`). What the database already holds is
/// not written again: a key whose want and capacity are unchanged and whose
/// slots match the split costs one read (the wants of the live instances and
/// the slots held, which also checks the fence). What the others must act
/// on is news to them (`news::NEWS_CHANNEL`): that this instance now waits
/// for slots they hold, or wants less and gave slots back in a split where
/// others want more than they have.
async fn settle_permits(
    store: &PgStore,
    me: Uuid,
    requests: &[PermitRequest],
    memory: &mut HashMap<String, Remembered>,
) -> Result<Vec<Grant>, Error> {
    let client = store.reader().await?;
    let mut grants = Vec::with_capacity(requests.len());
    // Whether the others should hear of this settlement (told once, at its end).
    let mut tell = false;
    // Only the keys asked for now are remembered on.
    let mut remembered = HashMap::with_capacity(requests.len());
    for request in requests {
        let key = request.key.as_str();
        let capacity = i32::try_from(request.capacity).unwrap_or(i32::MAX);
        let want = i32::try_from(request.want.min(request.capacity)).unwrap_or(i32::MAX);
        let known = memory.remove(key);
        if known.map(|k| k.want) != Some(want) {
            let recorded = match want {
                0 => client.execute(DROP_WANT, &[&key, &me]).await,
                _ => client.execute(WRITE_WANT, &[&key, &me, &want]).await,
            };
            recorded.map_err(|e| store.error(&e))?;
        }
        let row = client.query_one(READ_SPLIT, &[&key, &me, &capacity]).await.map_err(|e| store.error(&e))?;
        let turn = u64::try_from(row.get::<_, i64>(1)).unwrap_or(0);
        let mut held = u32::try_from(row.get::<_, i64>(2)).unwrap_or(0);
        let theirs = u32::try_from(row.get::<_, i64>(3)).unwrap_or(0);
        let holders: Vec<Uuid> = row.get(4);
        let amounts: Vec<i32> = row.get(5);
        let wants: Vec<(Uuid, u32)> =
            holders.into_iter().zip(amounts).map(|(holder, n)| (holder, u32::try_from(n).unwrap_or(0))).collect();
        let target = allot(request.capacity, &wants, me, turn);
        let contested = wants.iter().map(|w| u64::from(w.1)).sum::<u64>() > u64::from(request.capacity);
        let keep = target.max(request.running).min(request.capacity);
        if held > keep || (held > 0 && known.map(|k| k.capacity) != Some(capacity)) {
            let given = client
                .execute(GIVE_BACK, &[&key, &me, &capacity, &i64::from(keep)])
                .await
                .map_err(|e| store.error(&e))?;
            held = held.saturating_sub(u32::try_from(given).unwrap_or(u32::MAX));
            if given > 0 && contested && known.is_some_and(|k| k.want > want) {
                // Given up by choice, where others want more than they have:
                // their shares grew. (Slots given back because another's
                // share grew are no news to it: it reads while it waits.)
                tell = true;
            }
        }
        // Slots free to take, unless another instance took them meanwhile.
        if held < target && held.saturating_add(theirs) < request.capacity {
            let taken = client
                .execute(TAKE, &[&key, &me, &capacity, &i64::from(target - held)])
                .await
                .map_err(|e| store.error(&e))?;
            held += u32::try_from(taken).unwrap_or(0);
        }
        // Waiting for slots others hold is said once: they give them back.
        let waiting = held < target;
        if waiting && !known.is_some_and(|k| k.waiting && k.want == want) {
            tell = true;
        }
        remembered.insert(request.key.clone(), Remembered { want, capacity, waiting });
        grants.push(Grant { held, target });
    }
    *memory = remembered;
    if tell {
        client.execute(TELL, &[&NEWS_CHANNEL, &me.to_string()]).await.map_err(|e| store.error(&e))?;
    }
    Ok(grants)
}
