-- A plan's changes, every one of them: one row per row of the file the
-- plan would create, update, refuse as a conflict or reject, and per
-- target row a snapshot would delete, written with the plan in its own
-- transaction while the file awaits approval (a re-plan replaces them;
-- the purge drops them once the file no longer waits), so the review
-- console pages and filters the whole plan in SQL. seq orders a plan's
-- changes: the file's line for a row of the file, past the last line for
-- a delete (line NULL), in key order. changed: for an update, {column:
-- [old, new]} as text. Values, like plan_sample's: shown only to a
-- reviewer.
CREATE TABLE intake_plan_change (
    intake_id bigint NOT NULL,
    seq bigint NOT NULL,
    line bigint,
    action text NOT NULL CHECK (action IN ('create', 'update', 'delete', 'conflict', 'rejected')),
    reason text,
    key text COLLATE "C" NOT NULL,
    changed jsonb,
    PRIMARY KEY (intake_id, seq)
);
-- a key's changes (exact) and a key prefix's (a range of the C-ordered
-- key), each in line order
CREATE INDEX intake_plan_change_key ON intake_plan_change (intake_id, key, seq);
-- one action's changes in line order, but updates': a plan's bulk is
-- updates, whose own filter reads the primary key in line order (a
-- statement names the action as a literal, so the planner may use this
-- partial index)
CREATE INDEX intake_plan_change_action ON intake_plan_change (intake_id, action, seq) WHERE action <> 'update';

-- One row per column an update changes (a key of its changed), so the
-- changes of one column page in line order through an index however few
-- or many rows change it. Written by the same statement as the changes.
CREATE TABLE intake_plan_change_column (
    intake_id bigint NOT NULL,
    col text NOT NULL,
    seq bigint NOT NULL,
    PRIMARY KEY (intake_id, col, seq)
);

-- The console's queues, newest held file first and oldest waiting plan
-- first, read in index order a page at a time (a filter on the partners
-- the console covers, not a sort of the whole queue).
CREATE INDEX intake_quarantine_open_held ON intake_quarantine (held_at DESC, intake_id DESC) WHERE state = 'open';
CREATE INDEX file_intake_awaiting ON file_intake (planned_at, intake_id) WHERE state = 'awaiting_approval';
