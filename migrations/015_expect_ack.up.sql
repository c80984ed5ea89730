-- Ops acknowledge a late delivery window (`intake expect ack`): who, when
-- and why. An acknowledged window is no longer counted as open
-- (intake_feed_late{partner,feed}, `intake status`, the IntakeFeedLate
-- alert); it stays in the table, and a file that arrives late for it
-- still closes it. The three columns are set together, once.
ALTER TABLE intake_feed_late
    ADD COLUMN acked_at   timestamptz,
    ADD COLUMN acked_by   text,
    ADD COLUMN ack_reason text,
    ADD CONSTRAINT intake_feed_late_acked_check CHECK ((acked_at IS NULL) = (acked_by IS NULL) AND (acked_at IS NULL) = (ack_reason IS NULL));
