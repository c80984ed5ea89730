-- The rest of a partner's server profile, measured with rename_overwrites
-- in a scratch directory intake owns on the site (partners.Profile): the
-- SFTP extensions offered, whether an empty directory persists, the step
-- of the modification times a client sets (0: a time set is not kept),
-- whether names are compared without case, whether REALPATH answers. A
-- row measured before these columns existed has NULLs there and is
-- measured again.
ALTER TABLE intake_site_profile
    ADD COLUMN posix_rename       boolean,
    ADD COLUMN hardlink           boolean,
    ADD COLUMN fsync              boolean,
    ADD COLUMN statvfs            boolean,
    ADD COLUMN empty_dir_persists boolean,
    ADD COLUMN mtime_step_ms      integer,
    ADD COLUMN case_insensitive   boolean,
    ADD COLUMN realpath           boolean;
