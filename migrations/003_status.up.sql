-- What `intake status` and /readyz report without asking the sites.

-- The outcome of each worker's last poll of each partner.
CREATE TABLE intake_partner_poll (
    partner_id      text        NOT NULL,
    worker_id       text        NOT NULL,
    last_ok_at      timestamptz,
    last_error_at   timestamptz,
    last_error      text,
    ready_files     integer     NOT NULL DEFAULT 0,
    oldest_ready_at timestamptz,
    PRIMARY KEY (partner_id, worker_id)
);

-- The findings of the last completed reconciler run (replaced each run).
CREATE TABLE intake_finding (
    partner_id  text        NOT NULL,
    kind        text        NOT NULL,
    intake_id   bigint,
    path        text,
    action      text        NOT NULL,
    needs_human boolean     NOT NULL,
    detail      text,
    run_at      timestamptz NOT NULL
);
CREATE INDEX intake_finding_partner ON intake_finding (partner_id);

-- When the reconciler last completed a run over each partner.
CREATE TABLE intake_reconcile_run (
    partner_id  text        PRIMARY KEY,
    run_at      timestamptz NOT NULL,
    findings    integer     NOT NULL
);
