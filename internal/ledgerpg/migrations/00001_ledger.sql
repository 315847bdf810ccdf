-- The durable ledger: what `budgetgen ledger sync` copies out of the rate
-- limit service's ledger (internal/ledger), kept for chargeback and reports
-- of months past. One row per ledger rule, window and principal, and one per
-- rule and window for the window's denial totals. Values only grow: a sync
-- keeps the larger of the stored and the read value, so a store that lost
-- data never lowers a recorded row, and running a sync twice changes nothing.

-- +goose Up
CREATE TABLE ledger_usage (
    -- The ledger's names: the rule (a budget map's bucket under domain
    -- "budget", or an Envoy Gateway rule <ns>/<policy>/rule/<i>), the
    -- window (its ID: 20261019, h2026101914, w20261019, m202610) and the
    -- principal as encoded in the ledger ("" for a shared bucket).
    domain          text        NOT NULL,
    rule            text        NOT NULL,
    window_label    text        NOT NULL,
    principal       text        NOT NULL,
    -- The principal for people, the window as instants in the service's
    -- zone, and the budget the rule belongs to.
    principal_name  text        NOT NULL,
    window_kind     text        NOT NULL CHECK (window_kind IN ('hour', 'day', 'week', 'month')),
    window_start    timestamptz NOT NULL,
    window_end      timestamptz NOT NULL CHECK (window_end > window_start),
    budget_set      text        NOT NULL DEFAULT '',
    budget          text        NOT NULL,
    gateway         text        NOT NULL DEFAULT '',
    -- What units counts: tokens, thousands of tokens (caps past uint32), or
    -- 1/10,000 of the pricing currency (money caps). NULL: the principal
    -- has denials but no usage in the window.
    measure         text        NOT NULL CHECK (measure IN ('tokens', 'ktokens', 'cost')),
    units           bigint      CHECK (units >= 0),
    tokens          bigint      GENERATED ALWAYS AS (CASE measure WHEN 'tokens' THEN units WHEN 'ktokens' THEN units * 1000 END) STORED,
    cost            numeric(24, 4) GENERATED ALWAYS AS (CASE measure WHEN 'cost' THEN units / 10000.0 END) STORED,
    -- Over-limit answers of this principal: would-be 429s (shadow), real
    -- ones (enforce), and of either those due to reservations alone.
    shadow_denials  bigint      NOT NULL DEFAULT 0 CHECK (shadow_denials >= 0),
    enforce_denials bigint      NOT NULL DEFAULT 0 CHECK (enforce_denials >= 0),
    reserve_denials bigint      NOT NULL DEFAULT 0 CHECK (reserve_denials >= 0),
    synced_at       timestamptz NOT NULL,
    PRIMARY KEY (domain, rule, window_label, principal)
);

-- Reads of a report: every rule of some windows.
CREATE INDEX ledger_usage_window ON ledger_usage (window_label);
-- Per team (principal) over time, and per budget and month.
CREATE INDEX ledger_usage_principal ON ledger_usage (principal_name, window_kind, window_start);
CREATE INDEX ledger_usage_budget_window ON ledger_usage (budget, window_kind, window_start);

CREATE TABLE ledger_windows (
    domain          text        NOT NULL,
    rule            text        NOT NULL,
    window_label    text        NOT NULL,
    window_kind     text        NOT NULL CHECK (window_kind IN ('hour', 'day', 'week', 'month')),
    window_start    timestamptz NOT NULL,
    window_end      timestamptz NOT NULL CHECK (window_end > window_start),
    budget_set      text        NOT NULL DEFAULT '',
    budget          text        NOT NULL,
    gateway         text        NOT NULL DEFAULT '',
    measure         text        NOT NULL CHECK (measure IN ('tokens', 'ktokens', 'cost')),
    -- The window's totals: every denial, including those the service
    -- could not attribute to a principal.
    shadow_denials  bigint      NOT NULL DEFAULT 0 CHECK (shadow_denials >= 0),
    enforce_denials bigint      NOT NULL DEFAULT 0 CHECK (enforce_denials >= 0),
    reserve_denials bigint      NOT NULL DEFAULT 0 CHECK (reserve_denials >= 0),
    synced_at       timestamptz NOT NULL,
    PRIMARY KEY (domain, rule, window_label)
);

CREATE INDEX ledger_windows_window ON ledger_windows (window_label);
CREATE INDEX ledger_windows_budget_window ON ledger_windows (budget, window_kind, window_start);

-- +goose Down
DROP TABLE ledger_windows;
DROP TABLE ledger_usage;
