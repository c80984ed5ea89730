ALTER TABLE intake_feed_late
    DROP CONSTRAINT intake_feed_late_acked_check,
    DROP COLUMN ack_reason,
    DROP COLUMN acked_by,
    DROP COLUMN acked_at;
