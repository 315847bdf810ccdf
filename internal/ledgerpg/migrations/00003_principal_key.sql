-- A principal as long as a request's values make it: one value may be up to
-- 8 KiB (key.MaxValueBytes) before the ledger names it by its digest, and a
-- principal of several values is longer, but a B-tree index entry holds at
-- most 2704 bytes ("index row size ... exceeds btree version 4 maximum
-- 2704"). The primary key and the per-team index held the principal itself,
-- so such a row failed the sync's one transaction, every budget's copy with
-- it. The key now holds the principal's SHA-256 (computed by the same
-- expression here and in the sync's upsert, internal/ledgerpg/sync.go), and
-- the per-team index is a hash index, which stores a hash of any length of
-- value and serves the equality a per-team query asks for.
--
-- The upgrade rewrites ledger_usage once, under an exclusive lock.

-- +goose Up
ALTER TABLE ledger_usage ADD COLUMN principal_key bytea;
UPDATE ledger_usage SET principal_key = sha256(convert_to(principal, 'UTF8'));
ALTER TABLE ledger_usage
    ALTER COLUMN principal_key SET NOT NULL,
    DROP CONSTRAINT ledger_usage_pkey,
    ADD CONSTRAINT ledger_usage_pkey PRIMARY KEY (domain, rule, window_label, principal_key);
DROP INDEX ledger_usage_principal;
CREATE INDEX ledger_usage_principal ON ledger_usage USING hash (principal_name);

-- +goose Down
-- Fails while a principal is longer than a B-tree entry holds.
DROP INDEX ledger_usage_principal;
CREATE INDEX ledger_usage_principal ON ledger_usage (principal_name, window_kind, window_start);
ALTER TABLE ledger_usage
    DROP CONSTRAINT ledger_usage_pkey,
    ADD CONSTRAINT ledger_usage_pkey PRIMARY KEY (domain, rule, window_label, principal),
    DROP COLUMN principal_key;
