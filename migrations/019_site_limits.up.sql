-- What of a partner's server only `intake check` measures (the daemon's
-- measurement at its first dial does not: it would cost a fleet's start
-- a transfer per partner), kept with the profile so `intake status`
-- shows it and the daemon respects it: the largest READ answered, the
-- handles one session may hold, the sftp subsystems one SSH connection
-- starts (each up to its probe's cap), and when they were measured; NULL
-- until a check measured them on the row's site (the daemon keeps them
-- while the site stays the same). And each offered extension intake
-- used once that answered with an error (posix-rename onto an existing
-- name, fsync, statvfs): measured by both; a row measured before these
-- columns existed has NULLs there and is measured again.
ALTER TABLE intake_site_profile
    ADD COLUMN max_read             integer,
    ADD COLUMN handles              integer,
    ADD COLUMN channels             integer,
    ADD COLUMN limits_measured_at   timestamptz,
    ADD COLUMN posix_rename_fails   boolean,
    ADD COLUMN fsync_fails          boolean,
    ADD COLUMN statvfs_fails        boolean;
