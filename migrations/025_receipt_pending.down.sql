UPDATE file_intake SET receipt_path = NULL WHERE receipt_pending;
ALTER TABLE file_intake DROP COLUMN IF EXISTS receipt_pending;
