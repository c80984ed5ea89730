-- Readiness stable (issue 15): partners who cannot rename write straight
-- into ready/; a file is taken once its size and mtime have stayed the same
-- for stable_for. What each listing saw is remembered here, so a restart or
-- another replica does not start the clock again. Bounded: a poll keeps
-- only the entries its listing kept (the oldest max_files_per_poll
-- candidates) and forgets the rest; rows of a partner no poll has seen for
-- 7 days go too.
CREATE TABLE intake_ready_seen (
    partner_id           text        NOT NULL,
    name                 text        NOT NULL,
    size_bytes           bigint      NOT NULL,
    mtime                timestamptz NOT NULL,
    first_seen_unchanged timestamptz NOT NULL,
    last_seen            timestamptz NOT NULL,
    PRIMARY KEY (partner_id, name)
);

-- A claimed file that changed before its download ended goes back to
-- ready/ unapplied: its row ends put_back. listed_mtime is the mtime the
-- claim's listing showed.
ALTER TABLE file_intake ADD COLUMN listed_mtime timestamptz;
ALTER TABLE file_intake DROP CONSTRAINT file_intake_state_check;
ALTER TABLE file_intake ADD CONSTRAINT file_intake_state_check CHECK (state IN (
    'claimed', 'spooled', 'applying', 'applied', 'archived', 'duplicate',
    'quarantined', 'failed_terminal', 'outcome_unknown', 'discarded', 'put_back'));

-- claim: record (read-only sites): the claim lives only here. A listed file
-- (partner, name, size, mtime) is taken once; the intake row holds its
-- sha256. A file changed under the same name (another size or mtime) is a
-- new claim, judged by the batch rules. A put back deletes its claim.
-- last_seen is renewed (at most daily) by listings that still see the file;
-- a claim of a finished intake whose file no listing saw for 7 days is
-- forgotten (the file is gone; if the same bytes come back, the batch
-- rules make them a duplicate).
CREATE TABLE intake_record_claim (
    partner_id text        NOT NULL,
    name       text        NOT NULL,
    size_bytes bigint      NOT NULL,
    mtime      timestamptz NOT NULL,
    intake_id  bigint      NOT NULL UNIQUE,
    claimed_at timestamptz NOT NULL DEFAULT now(),
    last_seen  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (partner_id, name, size_bytes, mtime)
);
CREATE INDEX intake_record_claim_seen ON intake_record_claim (partner_id, last_seen);
