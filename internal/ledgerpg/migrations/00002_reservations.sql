-- Reservations: a reserving budget's rule-window totals as the ledger keeps
-- them (internal/ledger's stats fields "holds", "held" and "expired"), next to
-- the window's denial totals. Like them, values only grow: a sync keeps the
-- larger of the stored and the read value. Rows synced before this migration
-- read 0 (nothing was measured then).

-- +goose Up
ALTER TABLE ledger_windows
    -- Checks admitted holding a reservation.
    ADD COLUMN holds         bigint NOT NULL DEFAULT 0 CHECK (holds >= 0),
    -- The sum of their reserve, and the part of it released because a hold
    -- expired before its request's charge came; in the rule's units, as
    -- ledger_usage.units (see measure).
    ADD COLUMN held_units    bigint NOT NULL DEFAULT 0 CHECK (held_units >= 0),
    ADD COLUMN expired_units bigint NOT NULL DEFAULT 0 CHECK (expired_units >= 0);

-- +goose Down
ALTER TABLE ledger_windows DROP COLUMN expired_units, DROP COLUMN held_units, DROP COLUMN holds;
