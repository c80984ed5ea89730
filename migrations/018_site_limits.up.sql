-- Two limits of a partner's server, measured with the rest of its
-- profile: the most bytes one SFTP READ of 256 KiB was answered with (0:
-- not measured, the site allows no second channel), and how many handles
-- of one file it let one session hold open at once (up to 64: 64 means 64
-- or more). A row measured before these columns existed is measured
-- again.
ALTER TABLE intake_site_profile ADD COLUMN max_read_bytes integer, ADD COLUMN max_handles integer;
