-- jobcenter's tables. Records are stored as the same binary encoding the
-- embedded store uses; the columns beside them are for indexes and for
-- operators' own queries.

CREATE TABLE jobcenter.jobs (
    id uuid PRIMARY KEY,
    name text NOT NULL,
    state text NOT NULL,
    active boolean NOT NULL,
    fingerprint bytea NOT NULL,
    created_at bigint NOT NULL,
    updated_at bigint NOT NULL,
    record bytea NOT NULL
);
CREATE INDEX jobs_active ON jobcenter.jobs (id) WHERE active;
CREATE INDEX jobs_by_state ON jobcenter.jobs (state, id);
CREATE INDEX jobs_by_name ON jobcenter.jobs (name, id);

-- A job's spec in chunks of about 1 MiB; the header is the last chunk.
CREATE TABLE jobcenter.job_specs (
    job_id uuid NOT NULL,
    chunk bigint NOT NULL,
    data bytea NOT NULL,
    PRIMARY KEY (job_id, chunk)
);
ALTER TABLE jobcenter.job_specs ALTER COLUMN data SET STORAGE EXTERNAL;

-- A task with no row is in its initial state (ready without dependencies,
-- pending with).
CREATE TABLE jobcenter.tasks (
    job_id uuid NOT NULL,
    idx integer NOT NULL,
    state text NOT NULL,
    attempt integer NOT NULL,
    handler uuid,
    record bytea NOT NULL,
    PRIMARY KEY (job_id, idx)
) WITH (fillfactor = 80);

CREATE TABLE jobcenter.settings (
    key text PRIMARY KEY,
    value bytea NOT NULL
);
