DROP TABLE IF EXISTS intake_claim_id;
