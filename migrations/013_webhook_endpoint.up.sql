-- Webhook deliveries name their endpoint by id, and by nothing else: a
-- row holding a URL and the name of the environment variable whose secret
-- signs would let anyone able to insert a row have every replica post to
-- any URL, signed with any secret in its environment. The delivery service
-- takes the URL and the secrets of endpoint_id from the config in force
-- when it sends; a delivery whose endpoint_id the config does not know is
-- not sent (marked dead with that reason).
--
-- Rows recorded with a URL are matched to their endpoint by URL: an endpoint
-- configured without an id has the id "url-" and the first 16 hex digits
-- of its URL's sha256 (partners.DerivedNotifyID), which is what the
-- backfill writes. url and secret_env are dropped: nothing may read them
-- for sending, and `intake notify dead` shows the configured endpoint.
ALTER TABLE intake_outbox_delivery ADD COLUMN endpoint_id text;
UPDATE intake_outbox_delivery
    SET endpoint_id = 'url-' || pg_catalog.left(pg_catalog.encode(pg_catalog.sha256(pg_catalog.convert_to(url, 'UTF8')), 'hex'), 16);
ALTER TABLE intake_outbox_delivery ALTER COLUMN endpoint_id SET NOT NULL;
ALTER TABLE intake_outbox_delivery DROP CONSTRAINT intake_outbox_delivery_pkey;
ALTER TABLE intake_outbox_delivery ADD PRIMARY KEY (event_id, endpoint_id);
ALTER TABLE intake_outbox_delivery DROP COLUMN url, DROP COLUMN secret_env;
