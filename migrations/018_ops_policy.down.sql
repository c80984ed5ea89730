DROP TABLE intake_ops_policy;
