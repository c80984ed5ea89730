DROP INDEX file_intake_lease; DROP TABLE intake_worker;
