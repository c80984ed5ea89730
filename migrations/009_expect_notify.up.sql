-- Expected deliveries (issue 15 item 3). docs/design.md "Expected
-- deliveries" defines the windows.
--
-- intake_feed_expect: per feed with an expect: block, how far its windows
-- have been decided. since is when intake first evaluated the feed (no
-- window scheduled before it is judged); last_scheduled is the scheduled
-- time of the last window decided (calendar days included); last_deadline
-- the deadline of the last decided window that expected a delivery (files
-- claimed after it count for the next window). The row is locked by the
-- evaluation of the feed, so replicas decide each window once.
CREATE TABLE intake_feed_expect (
    partner_id      text        NOT NULL,
    feed            text        NOT NULL,
    since           timestamptz NOT NULL,
    last_scheduled  timestamptz NOT NULL,
    last_deadline   timestamptz NOT NULL,
    evaluated_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (partner_id, feed)
);

-- One row per window that closed without an accepted file: written once
-- (INSERT ... ON CONFLICT DO NOTHING on the key), closed by the first
-- accepted file claimed after its deadline, which then counts for no
-- other window.
CREATE TABLE intake_feed_late (
    partner_id        text        NOT NULL,
    feed              text        NOT NULL,
    scheduled_at      timestamptz NOT NULL,
    deadline          timestamptz NOT NULL,
    raised_at         timestamptz NOT NULL DEFAULT now(),
    raised_by         text        NOT NULL,
    closed_intake_id  bigint      REFERENCES file_intake (intake_id),
    arrived_at        timestamptz,
    closed_at         timestamptz,
    PRIMARY KEY (partner_id, feed, scheduled_at),
    CONSTRAINT intake_feed_late_closed_check CHECK ((closed_intake_id IS NULL) = (arrived_at IS NULL))
);
CREATE UNIQUE INDEX intake_feed_late_closed_by ON intake_feed_late (closed_intake_id) WHERE closed_intake_id IS NOT NULL;
CREATE INDEX intake_feed_late_open ON intake_feed_late (partner_id, feed, scheduled_at) WHERE closed_intake_id IS NULL;
-- the evaluation reads a feed's files claimed after a time
CREATE INDEX file_intake_feed_claimed ON file_intake (partner_id, feed, claimed_at);

-- Notifications (issue 15 item 4): the outbox. An event is written in the
-- same transaction as the state change that causes it (intake/ledger);
-- payload holds ids, codes and counts, never cell values. The delivery
-- service (intake/notify) fans each event out to the endpoints subscribed
-- to it when it first sees it (fanned_out), then delivers each
-- (event, endpoint) at least once: claimed with FOR UPDATE SKIP LOCKED and
-- a lease, retried with backoff until it is delivered or its budget
-- (counted from budget_from) is spent, then marked dead and alerted.
CREATE TABLE intake_outbox (
    event_id    bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    partner_id  text        NOT NULL,
    event       text        NOT NULL,
    payload     jsonb       NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    fanned_out  boolean     NOT NULL DEFAULT false
);
CREATE INDEX intake_outbox_unfanned ON intake_outbox (event_id) WHERE NOT fanned_out;

CREATE TABLE intake_outbox_delivery (
    event_id         bigint      NOT NULL REFERENCES intake_outbox (event_id) ON DELETE CASCADE,
    url              text        NOT NULL,
    secret_env       text        NOT NULL,
    state            text        NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'delivered', 'dead')),
    attempts         integer     NOT NULL DEFAULT 0,
    budget_from      timestamptz NOT NULL DEFAULT now(),
    next_attempt_at  timestamptz NOT NULL DEFAULT now(),
    lease_until      timestamptz,
    leased_by        text,
    last_status      integer,
    last_error       text,
    delivered_at     timestamptz,
    dead_at          timestamptz,
    PRIMARY KEY (event_id, url)
);
CREATE INDEX intake_outbox_delivery_due ON intake_outbox_delivery (next_attempt_at) WHERE state = 'pending';
CREATE INDEX intake_outbox_delivery_dead ON intake_outbox_delivery (dead_at) WHERE state = 'dead';
