-- Several admin instances on one database. Every time here is the
-- database's own clock (now()), never an instance's.

-- One row per live instance; a new id at every start.
CREATE TABLE jobcenter.instances (
    id uuid PRIMARY KEY,
    role text NOT NULL,                       -- 'server' leads jobs; 'run' leads only its own
    grpc_address text NOT NULL,
    http_address text NOT NULL,
    started_at timestamptz NOT NULL DEFAULT now(),
    heartbeat timestamptz NOT NULL DEFAULT now(),
    status text NOT NULL DEFAULT 'active',    -- 'active' or 'deactivated'
    paused boolean NOT NULL DEFAULT false,    -- its scheduler loop
    jobs_led integer NOT NULL DEFAULT 0,
    workers integer NOT NULL DEFAULT 0,
    detectors text[] NOT NULL DEFAULT '{}',   -- job types a worker connected here can detect
    detections text[] NOT NULL DEFAULT '{}',  -- job types it detected last
    handlers uuid[] NOT NULL DEFAULT '{}'     -- workers connected to it
);

-- The instance leading a job; NULL while nobody does (released, or its
-- leader was deactivated): live instances claim those.
ALTER TABLE jobcenter.jobs ADD COLUMN owner uuid;
CREATE INDEX jobs_by_owner ON jobcenter.jobs (owner, id) WHERE active;

-- One detection per job type and interval, cluster-wide.
CREATE TABLE jobcenter.detections (
    job_type text NOT NULL,
    slot bigint NOT NULL,
    instance uuid NOT NULL,
    claimed_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (job_type, slot)
);

-- Named leases (the recovery sweep): one holder at a time, until it expires.
CREATE TABLE jobcenter.leases (
    name text PRIMARY KEY,
    holder uuid NOT NULL,
    expires timestamptz NOT NULL
);

-- The fence every write of an instance passes: refused once the instance
-- is deactivated. The row lock it takes (FOR SHARE) makes a deactivation
-- wait for writes in flight, so no write lands after it. A NULL id is a
-- tool working alone (export, import, benchmarks) and is not fenced.
CREATE FUNCTION jobcenter.fence(me uuid) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    IF me IS NULL THEN
        RETURN true;
    END IF;
    PERFORM 1 FROM jobcenter.instances WHERE id = me AND status = 'active' FOR SHARE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'admin instance % is deactivated', me USING ERRCODE = 'JCF01';
    END IF;
    RETURN true;
END
$$;
