DROP TABLE IF EXISTS intake_outbox_delivery;
DROP TABLE IF EXISTS intake_outbox;
DROP INDEX IF EXISTS file_intake_feed_claimed;
DROP TABLE IF EXISTS intake_feed_late;
DROP TABLE IF EXISTS intake_feed_expect;
