ALTER TABLE intake_site_profile DROP COLUMN rename_restamps_mtime;
