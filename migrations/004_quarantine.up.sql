-- A record per held file and the ops decision on it.
CREATE TABLE intake_quarantine (
    intake_id       bigint      PRIMARY KEY REFERENCES file_intake (intake_id),
    partner_id      text        NOT NULL,
    reason          text        NOT NULL,
    batch_id        text,
    content_sha256  text,
    path            text,                    -- where the file is held on the partner's site
    held_at         timestamptz NOT NULL DEFAULT now(),
    state           text        NOT NULL DEFAULT 'open' CHECK (state IN ('open', 'released', 'discarded')),
    decided_at      timestamptz,
    decided_by      text,
    decision        text                     -- the reason the actor gave
);
CREATE INDEX intake_quarantine_open ON intake_quarantine (partner_id) WHERE state = 'open';

-- Every ops action: who, when, what, why.
CREATE TABLE intake_audit (
    audit_id    bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at          timestamptz NOT NULL DEFAULT now(),
    actor       text        NOT NULL,
    action      text        NOT NULL,
    partner_id  text        NOT NULL,
    intake_id   bigint,
    reason      text        NOT NULL,
    detail      text
);
CREATE INDEX intake_audit_partner ON intake_audit (partner_id, at);

-- A released file carries what the decision overrides; a replay names the
-- intake whose bytes it applies again.
ALTER TABLE file_intake ADD COLUMN release_override text, ADD COLUMN replay_of bigint REFERENCES file_intake (intake_id);
