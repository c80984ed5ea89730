ALTER TABLE intake_site_profile DROP COLUMN max_read_bytes, DROP COLUMN max_handles;
