ALTER TABLE intake_site_profile
    DROP COLUMN max_read,
    DROP COLUMN handles,
    DROP COLUMN channels,
    DROP COLUMN limits_measured_at,
    DROP COLUMN posix_rename_fails,
    DROP COLUMN fsync_fails,
    DROP COLUMN statvfs_fails;
