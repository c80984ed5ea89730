-- Whether the partner's server keeps a file's modification time across a
-- RENAME (partners.Profile.RenameRestampsMTime): a gateway whose RENAME is
-- a copy stamps the copy's time, and a claimed file is then known by its
-- size. NULL: measured before this was; the profile is measured again.
ALTER TABLE intake_site_profile ADD COLUMN rename_restamps_mtime boolean;
