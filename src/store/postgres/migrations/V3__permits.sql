-- Permits: counted rights shared by the admin instances of a cluster. A job
-- type's global execution limit L is L slots under the key 'type:<job type>';
-- an instance dispatches that type's tasks only up to the slots it holds.
-- A slot held by an instance that is no longer active is free to take.
CREATE TABLE jobcenter.permits (
    key text NOT NULL,
    slot integer NOT NULL,
    holder uuid NOT NULL,
    PRIMARY KEY (key, slot)
);

-- How many slots of a key each instance wants now, for a fair split.
CREATE TABLE jobcenter.permit_wants (
    key text NOT NULL,
    holder uuid NOT NULL,
    want integer NOT NULL,
    PRIMARY KEY (key, holder)
);
