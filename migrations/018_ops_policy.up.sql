-- The rules of the ops roles' decisions that the database enforces, one
-- row. four_eyes: an approval by the login role (session_user) that
-- released the file from quarantine or requested it as a replay is
-- refused (a row-level security policy of `intake grants` reads it). Only
-- the tables' owner changes it: `intake grants` sets it from the config's
-- ops.four_eyes (or --four-eyes), applied as the owner.
CREATE TABLE intake_ops_policy (
    one        boolean PRIMARY KEY DEFAULT true CHECK (one),
    four_eyes  boolean NOT NULL DEFAULT false
);
INSERT INTO intake_ops_policy DEFAULT VALUES;
