-- Live replicas: a worker whose last_seen is older than its lease is gone,
-- and its orphaned claims (files in processing/<worker>/ without a row) may
-- be adopted by the reconciler.
CREATE TABLE intake_worker (
    worker_id   text        PRIMARY KEY,
    hostname    text        NOT NULL,
    pid         integer     NOT NULL,
    lease       interval    NOT NULL,
    started_at  timestamptz NOT NULL DEFAULT now(),
    last_seen   timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX file_intake_lease ON file_intake (lease_until)
    WHERE state IN ('claimed', 'spooled', 'applying', 'applied', 'outcome_unknown');
