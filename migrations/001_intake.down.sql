DROP TABLE intake_row_issue;
DROP TABLE intake_chunk;
DROP TABLE intake_batch;
DROP TABLE file_intake;
