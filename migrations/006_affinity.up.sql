-- Partner affinity: the partners each replica serves, so that among the
-- live replicas serving a partner one is picked to poll it (rendezvous
-- hashing, see intake/affinity.go); and when a replica last stopped after
-- draining (NULL while it runs, or after a crash or an unfinished drain),
-- which tells its next start that no claim of it can be left without a
-- row.
ALTER TABLE intake_worker ADD COLUMN partners text[] NOT NULL DEFAULT '{}',
    ADD COLUMN drained_at timestamptz;
