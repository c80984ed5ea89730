-- One row per observed file: each claim of bytes from a partner's ready/.
CREATE TABLE file_intake (
    intake_id       bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    partner_id      text        NOT NULL,
    feed            text        NOT NULL,
    remote_name     text        NOT NULL,          -- name as listed in ready/
    claimed_path    text        NOT NULL,          -- processing/<worker>/<name>
    listed_size     bigint      NOT NULL,
    manifest_name   text,                          -- manifest mode: the claimed <name>.complete
    expected_rows   bigint,                        -- manifest mode: rows the manifest states
    batch_id        text,
    content_sha256  text,
    size_bytes      bigint,
    state           text        NOT NULL,
    reason          text,                          -- reason code when quarantined/failed/duplicate
    worker_id       text        NOT NULL,
    fencing_token   bigint      NOT NULL DEFAULT 1,
    lease_until     timestamptz NOT NULL,
    rows_total      bigint,
    rows_applied    bigint      NOT NULL DEFAULT 0,
    rows_unchanged  bigint      NOT NULL DEFAULT 0,
    rows_rejected   bigint      NOT NULL DEFAULT 0,
    rows_conflict   bigint      NOT NULL DEFAULT 0,
    chunks_done     integer     NOT NULL DEFAULT 0,
    archive_path    text,
    receipt_path    text,
    rejects_path    text,
    claimed_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now(),
    finished_at     timestamptz,
    CONSTRAINT file_intake_state_check CHECK (state IN (
        'claimed', 'spooled', 'applying', 'applied', 'archived', 'duplicate',
        'quarantined', 'failed_terminal', 'outcome_unknown', 'discarded')),
    CONSTRAINT file_intake_totals_check CHECK (
        state NOT IN ('applied', 'archived') OR reason IS NOT NULL OR
        rows_applied + rows_unchanged + rows_rejected + rows_conflict = rows_total)
);

-- A file in processing/ is owned by at most one live row.
CREATE UNIQUE INDEX file_intake_live_path ON file_intake (partner_id, claimed_path)
    WHERE state IN ('claimed', 'spooled', 'applying', 'applied', 'outcome_unknown');
CREATE INDEX file_intake_partner_state ON file_intake (partner_id, state);
CREATE INDEX file_intake_batch ON file_intake (partner_id, batch_id);

-- The business key: the first intake to bind (partner, batch) owns it; its
-- hash never changes. Same batch + same hash = duplicate; other hash = conflict.
CREATE TABLE intake_batch (
    partner_id      text        NOT NULL,
    batch_id        text        NOT NULL,
    content_sha256  text        NOT NULL,
    intake_id       bigint      NOT NULL REFERENCES file_intake (intake_id),
    bound_at        timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (partner_id, batch_id)
);

-- The chunk ledger, written in the same transaction as the chunk's rows.
CREATE TABLE intake_chunk (
    intake_id       bigint      NOT NULL REFERENCES file_intake (intake_id),
    chunk_no        integer     NOT NULL,
    partner_id      text        NOT NULL,
    first_line      bigint      NOT NULL,
    last_line       bigint      NOT NULL,
    rows_applied    bigint      NOT NULL,
    rows_unchanged  bigint      NOT NULL,
    rows_conflict   bigint      NOT NULL,
    fencing_token   bigint      NOT NULL,
    committed_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (intake_id, chunk_no)
);

-- Rows that did not apply: line, column and reason code, never the value.
CREATE TABLE intake_row_issue (
    intake_id       bigint      NOT NULL REFERENCES file_intake (intake_id),
    partner_id      text        NOT NULL,
    line            bigint      NOT NULL,
    column_name     text,
    reason          text        NOT NULL,
    outcome         text        NOT NULL CHECK (outcome IN ('rejected', 'conflict')),
    created_at      timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX intake_row_issue_intake ON intake_row_issue (intake_id, line);
