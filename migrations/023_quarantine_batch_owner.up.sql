-- The intake whose binding of the batch a file held batch_conflict met
-- (the binding at the hold): `quarantine release --winner new` takes the
-- batch from that intake only, never from one that bound the batch after
-- the hold. NULL for other reasons, and for a conflict held before this
-- column (then from an intake older than the held file only).
ALTER TABLE intake_quarantine ADD COLUMN batch_owner bigint;
