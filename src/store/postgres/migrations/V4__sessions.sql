-- Console sessions, shared by every instance of a cluster: a browser signed
-- in at one is served by any, and signing out at one ends it at all. The
-- key is the SHA-256 of the session's cookie, never the cookie itself.
CREATE TABLE jobcenter.sessions (
    id bytea PRIMARY KEY,
    csrf text NOT NULL,
    caller text NOT NULL,
    opened_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX sessions_opened_at ON jobcenter.sessions (opened_at);
