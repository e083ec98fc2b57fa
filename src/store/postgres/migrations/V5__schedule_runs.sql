-- One run per schedule and slot (the instant its calendar names, in ms
-- since the epoch), cluster-wide: the instance that claimed it. An
-- instance that is no longer active loses its claims to any live one.
CREATE TABLE jobcenter.schedule_runs (
    schedule text NOT NULL,
    slot bigint NOT NULL,
    instance uuid NOT NULL,
    claimed_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (schedule, slot)
);
