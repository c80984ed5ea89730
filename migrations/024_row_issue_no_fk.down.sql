ALTER TABLE intake_row_issue ADD CONSTRAINT intake_row_issue_intake_id_fkey FOREIGN KEY (intake_id) REFERENCES file_intake (intake_id);
