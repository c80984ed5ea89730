DROP TABLE intake_site_profile;
