DROP TABLE intake_reconcile_run; DROP TABLE intake_finding; DROP TABLE intake_partner_poll;
