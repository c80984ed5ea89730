-- receipt_pending: the latest decision on the file (a discard) is not yet
-- published to the partner. receipt_path still names the receipt the
-- earlier decision published (the hold's), wherever the reports dir was
-- then, and the publication replaces it. A discard recorded before this
-- column cleared receipt_path instead.
ALTER TABLE file_intake ADD COLUMN receipt_pending boolean NOT NULL DEFAULT false;
UPDATE file_intake SET receipt_pending = true WHERE state = 'discarded' AND receipt_path IS NULL;
