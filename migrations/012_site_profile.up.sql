-- What a partner's server does, measured by the daemon when it first
-- dials the partner (and again a day later): the claim and archive
-- protocol relies on RENAME refusing an existing target. site is the
-- partner's tree as the server resolves it (host key, account, root):
-- another site is measured afresh.
CREATE TABLE intake_site_profile (
    partner_id        text        PRIMARY KEY,
    site              text        NOT NULL,
    rename_overwrites boolean     NOT NULL,
    measured_at       timestamptz NOT NULL DEFAULT now()
);
