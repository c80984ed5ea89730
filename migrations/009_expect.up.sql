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
