-- Side effects outside the database: the grant ledger (idempotency keys and
-- compensation by grant id) and the transactional outbox.

-- +goose Up

-- One row per keyed operation (a grant, revoke or voucher claim that carried
-- an idempotency key): the key, unique per scope, and the request it was
-- first used for (its fingerprint: operation, target, member, amount and the
-- limit given in the call). grant_id is the operation's id for compensation
-- and for outbox events.
--
-- A keyed statement inserts this row first, with ON CONFLICT DO NOTHING, and
-- its counter change selects FROM that insert's RETURNING: the unique index
-- is the arbiter that lets exactly one copy of a request through (see
-- queries/ledger.sql). The outcome cannot be written into this same row by
-- the same statement (a statement cannot update a row it inserted), so it
-- goes into ledger_outcome, inserted by the same statement.
CREATE TABLE pgquota.ledger (
    grant_id        bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    scope           text        NOT NULL,
    idempotency_key text        NOT NULL,
    operation       text        NOT NULL,
    target          text        NOT NULL,
    member          text        NOT NULL,
    amount          bigint      NOT NULL,
    request_limit   bigint,
    created_at      timestamptz NOT NULL,
    CONSTRAINT ledger_key UNIQUE (scope, idempotency_key),
    CONSTRAINT ledger_operation CHECK (operation IN ('grant', 'revoke', 'claim')),
    CONSTRAINT ledger_scope_length CHECK (octet_length(scope) BETWEEN 1 AND 255),
    CONSTRAINT ledger_key_length CHECK (octet_length(idempotency_key) BETWEEN 1 AND 255),
    CONSTRAINT ledger_amount_positive CHECK (amount >= 1)
);

-- Reaping deletes the oldest rows first.
CREATE INDEX ledger_created_at ON pgquota.ledger (created_at);

-- The outcome of a keyed operation, written by the statement that inserted
-- its ledger row, so that both commit or roll back together with the counter
-- change. Which columns are meaningful depends on the operation:
--   grant:  granted, used (the counter after the call), limit_value, window;
--   revoke: revoked (units given back), used, window (granted is true);
--   claim:  granted (a voucher is held), used (pool counter, counted pools),
--           limit_value (the campaign's total), seq or code, repeat,
--           claimed_at.
-- The compensated* columns record the one compensating revoke of a grant
-- (RevokeGrant): units given back, the counter after, and when.
CREATE TABLE pgquota.ledger_outcome (
    grant_id         bigint      NOT NULL PRIMARY KEY REFERENCES pgquota.ledger (grant_id) ON DELETE CASCADE,
    granted          boolean     NOT NULL,
    used             bigint      NOT NULL DEFAULT 0,
    limit_value      bigint      NOT NULL DEFAULT 0,
    revoked          bigint      NOT NULL DEFAULT 0,
    window_start     timestamptz,
    window_end       timestamptz,
    seq              bigint      NOT NULL DEFAULT 0,
    code             text        NOT NULL DEFAULT '',
    repeat           boolean     NOT NULL DEFAULT false,
    claimed_at       timestamptz,
    decided_at       timestamptz NOT NULL,
    compensated      bigint,
    compensated_used bigint,
    compensated_at   timestamptz,
    CONSTRAINT ledger_outcome_compensation_complete CHECK (
        (compensated IS NULL) = (compensated_at IS NULL)
        AND (compensated IS NULL) = (compensated_used IS NULL)),
    CONSTRAINT ledger_outcome_compensated_nonnegative CHECK (compensated >= 0)
);

-- A keyed operation with its outcome, as `pgquota ledger show` prints it.
CREATE VIEW pgquota.ledger_entry AS
SELECT l.grant_id, l.scope, l.idempotency_key, l.operation, l.target, l.member,
       l.amount, l.request_limit, l.created_at,
       o.granted, o.used, o.limit_value, o.revoked, o.window_start, o.window_end,
       o.seq, o.code, o.repeat, o.claimed_at, o.decided_at,
       o.compensated, o.compensated_used, o.compensated_at
FROM pgquota.ledger l
JOIN pgquota.ledger_outcome o ON o.grant_id = l.grant_id;

-- pgquota.ledger_key_fresh returns the grant id stored for an idempotency
-- key, read with a fresh snapshot (0 when there is none). A keyed statement
-- calls it only when its own ledger insert did nothing: the key was taken by
-- a transaction that committed while the statement ran (ON CONFLICT DO
-- NOTHING waited for it), which the statement's own snapshot cannot see.
-- See pgquota.usage_used_fresh for why a VOLATILE function sees it.
-- +goose StatementBegin
CREATE FUNCTION pgquota.ledger_key_fresh(p_scope text, p_key text) RETURNS bigint
    LANGUAGE plpgsql VOLATILE
    AS $$
BEGIN
    RETURN coalesce((
        SELECT l.grant_id FROM pgquota.ledger l
        WHERE l.scope = p_scope AND l.idempotency_key = p_key
    ), 0);
END
$$;
-- +goose StatementEnd

-- The transactional outbox: an event written in the same transaction as the
-- work it reports (typically a grant), delivered at least once by a relay.
-- id is the stable event id consumers dedupe on. A relay claims pending rows
-- whose next_attempt_at has come with FOR UPDATE SKIP LOCKED and keeps them
-- locked while its handler runs, so two relays never deliver one row at the
-- same time. There is no id cursor: a row whose transaction commits late
-- (with a lower id than rows already delivered) is pending when it becomes
-- visible, and the next claim takes it.
CREATE TABLE pgquota.outbox (
    id                bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    topic             text        NOT NULL,
    payload           bytea       NOT NULL,
    grant_id          bigint,
    idempotency_scope text,
    idempotency_key   text,
    fencing_token     bigint,
    state             text        NOT NULL DEFAULT 'pending',
    attempts          integer     NOT NULL DEFAULT 0,
    next_attempt_at   timestamptz NOT NULL,
    last_error        text,
    created_at        timestamptz NOT NULL,
    finished_at       timestamptz,
    CONSTRAINT outbox_topic_length CHECK (octet_length(topic) BETWEEN 1 AND 255),
    CONSTRAINT outbox_state CHECK (state IN ('pending', 'delivered', 'dead')),
    CONSTRAINT outbox_attempts_nonnegative CHECK (attempts >= 0),
    CONSTRAINT outbox_finished CHECK ((state = 'pending') = (finished_at IS NULL))
);

-- The relay's claim: pending rows in id order.
CREATE INDEX outbox_pending ON pgquota.outbox (id) WHERE state = 'pending';
-- Reaping finished (delivered or dead) rows.
CREATE INDEX outbox_finished_at ON pgquota.outbox (finished_at) WHERE state <> 'pending';

-- +goose Down
DROP TABLE pgquota.outbox;
DROP FUNCTION pgquota.ledger_key_fresh(text, text);
DROP VIEW pgquota.ledger_entry;
DROP TABLE pgquota.ledger_outcome;
DROP TABLE pgquota.ledger;
