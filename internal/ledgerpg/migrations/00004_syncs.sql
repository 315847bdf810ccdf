-- When each ledger was last copied: a sync reads the previous time before it
-- writes its own, in its one transaction. When the previous sync is older
-- than the ledger's retention, windows expired from the service's ledger
-- before any sync copied them, and the sync says so and fails instead of
-- succeeding over the loss (internal/ledgerpg/sync.go, ErrGap).

-- +goose Up
CREATE TABLE ledger_syncs (
    -- The ledger copied from, as `budgetgen ledger sync` names it (its
    -- Valkey addresses and key prefix, or its service's URL).
    source    text        PRIMARY KEY,
    -- The clock of the latest sync that committed.
    synced_at timestamptz NOT NULL
);

-- +goose Down
DROP TABLE ledger_syncs;
