-- Refuses while a delivery is pending: an older intake would post it to
-- the URL on its row, which this version no longer records (let the
-- pending deliveries be delivered or die first).
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM intake_outbox_delivery WHERE state = 'pending') THEN
        RAISE EXCEPTION 'webhook deliveries are pending: let them be delivered or dead before migrating down';
    END IF;
END $$;
-- Delivered and dead deliveries keep their endpoint's id in place of the URL.
ALTER TABLE intake_outbox_delivery ADD COLUMN url text, ADD COLUMN secret_env text NOT NULL DEFAULT '';
UPDATE intake_outbox_delivery SET url = 'endpoint:' || endpoint_id;
ALTER TABLE intake_outbox_delivery ALTER COLUMN url SET NOT NULL, ALTER COLUMN secret_env DROP DEFAULT;
ALTER TABLE intake_outbox_delivery DROP CONSTRAINT intake_outbox_delivery_pkey;
ALTER TABLE intake_outbox_delivery ADD PRIMARY KEY (event_id, url);
ALTER TABLE intake_outbox_delivery DROP COLUMN endpoint_id;
