-- Fence guard, second form: every statement on a guarded application table
-- (INSERT, UPDATE, DELETE, TRUNCATE) lands only when its transaction has
-- presented a current fencing token for the table's resource, whatever
-- columns the statement sets. The first form (pgquota.fence_guard in
-- 00003_lease.sql) read the token from the row being written, so an UPDATE
-- leaving the token column alone passed with the old row's token, DELETE and
-- TRUNCATE were not guarded, and an invented token far above any issued was
-- accepted and raised the mark past the real holder. Triggers of the first
-- form keep working as they did until the guard is attached again
-- (quota.Client.AttachFenceGuard or `pgquota fence guard`), which replaces
-- them with the triggers below.
--
-- A writer presents its token once per transaction:
--
--   BEGIN;
--   SELECT pgquota.present_token('public.reports', 42);
--   UPDATE public.reports SET val = 'x' WHERE id = 1;
--   COMMIT;
--
-- pgquota.present_token validates the token (pgquota.fence_admit: for a
-- lease-backed resource the lease must be held with the token by the
-- database clock, and its row stays locked FOR SHARE until the transaction
-- ends, so no takeover can slip in before commit; the resource's highest
-- token seen is raised to the token and that row stays locked too) and keeps
-- it in the transaction-scoped setting pgquota.fence_tokens, a JSON object
-- {"resource": token, ...} (several resources may be presented in one
-- transaction). The setting lives only in the transaction (set_config(...,
-- true)), so it works behind a transaction-mode pooler and never leaks into
-- the next transaction on the connection.
--
-- The guard's triggers read that setting for the table's resource, check
-- that the token is still the highest seen for the resource (it is, for a
-- token presented in this transaction: the high-water row is locked by it),
-- and on INSERT and UPDATE stamp it into the row's token column.
--
-- Rejections, in class PQ (see 00003_lease.sql for PQ001 and PQ002):
--   PQ001 stale fencing token: present_token got a token below the highest
--         seen for the resource (or below the token of the lease named), or
--         the token presented in this transaction is below it.
--         DETAIL {"resource": text, "token": bigint, "highest": bigint}.
--   PQ002 lease not held: present_token got a token the lease is not held
--         with (expired, released, never issued: a token above any the lease
--         sequence issued lands here). DETAIL {"lease": text, "token": bigint}.
--   PQ003 no fencing token presented: a statement on a guarded table in a
--         transaction that presented no token for the table's resource, or
--         one that did not come through pgquota.present_token (a token above
--         the resource's highest admitted, set by hand).
--         DETAIL {"resource": text, "table": text, "operation": text,
--         "token": bigint|null, "highest": bigint}.
--   22023 present_token got a NULL or empty resource, or a token below 1.

-- +goose Up
-- The resources of guarded tables and where their tokens come from: external
-- is false for tokens of pgquota leases (present_token checks the lease) and
-- true for tokens from another lock service, an etcd revision or a ZooKeeper
-- zxid (present_token checks them against the highest seen only). A resource
-- without a row is lease-backed.
CREATE TABLE pgquota.fence_guard_resource (
    resource    text        NOT NULL PRIMARY KEY,
    external    boolean     NOT NULL,
    attached_at timestamptz NOT NULL,
    CONSTRAINT fence_guard_resource_length CHECK (octet_length(resource) BETWEEN 1 AND 255)
);

-- pgquota.present_token presents fencing token p_token for resource
-- p_resource in the current transaction, or raises (PQ001, PQ002, 22023).
-- For a lease-backed resource the lease p_lease (default: the lease named
-- like the resource) must be held with p_token; for an external resource
-- p_lease, when given, is checked too. Presenting again in the same
-- transaction with the same or a higher token is admitted. Returns p_token.
-- +goose StatementBegin
CREATE FUNCTION pgquota.present_token(p_resource text, p_token bigint, p_lease text DEFAULT NULL) RETURNS bigint
    LANGUAGE plpgsql VOLATILE
    AS $$
DECLARE
    v_external boolean;
    v_tokens   jsonb;
BEGIN
    IF p_resource IS NULL OR p_resource = '' THEN
        RAISE EXCEPTION USING
            ERRCODE = '22023',
            MESSAGE = 'pgquota: present_token: the resource must not be empty';
    END IF;
    IF p_token IS NULL OR p_token < 1 THEN
        RAISE EXCEPTION USING
            ERRCODE = '22023',
            MESSAGE = format('pgquota: present_token: a fencing token is at least 1, got %s for resource %s',
                             coalesce(p_token::text, 'NULL'), p_resource);
    END IF;
    SELECT g.external INTO v_external FROM pgquota.fence_guard_resource g WHERE g.resource = p_resource;
    IF v_external THEN
        PERFORM pgquota.fence_admit(p_resource, p_token, p_lease);
    ELSE
        PERFORM pgquota.fence_admit(p_resource, p_token, coalesce(p_lease, p_resource));
    END IF;
    v_tokens := coalesce(nullif(current_setting('pgquota.fence_tokens', true), ''), '{}')::jsonb;
    PERFORM set_config('pgquota.fence_tokens', (v_tokens || jsonb_build_object(p_resource, p_token))::text, true);
    IF NOT coalesce(v_external, false) THEN
        -- The lease the guard checks each statement against (see
        -- pgquota.fence_guard_presented).
        v_tokens := coalesce(nullif(current_setting('pgquota.fence_leases', true), ''), '{}')::jsonb;
        PERFORM set_config('pgquota.fence_leases',
                           (v_tokens || jsonb_build_object(p_resource, coalesce(p_lease, p_resource)))::text, true);
    END IF;
    RETURN p_token;
END
$$;
-- +goose StatementEnd

-- pgquota.fence_guard_presented is the guard's trigger function: BEFORE
-- INSERT OR UPDATE OR DELETE FOR EACH ROW (trigger pgquota_fence_guard) and
-- BEFORE TRUNCATE FOR EACH STATEMENT (trigger pgquota_fence_guard_truncate).
-- Arguments: the token column's name and the table's resource. It takes the
-- token the transaction presented for the resource, requires it to equal the
-- resource's highest token seen (below: PQ001; none, or above, so not
-- admitted by present_token: PQ003), and stamps it into the token column of
-- an inserted or updated row. The query on pgquota.fence takes a fresh
-- snapshot (VOLATILE), so a token overtaken since it was presented is seen.
-- The settings are only a record of what present_token admitted, and a
-- session can set them by hand; so for a lease-backed resource every
-- statement also checks, as a fenced write does, that the lease (the one
-- present_token recorded in pgquota.fence_leases, by default the lease named
-- like the resource) is held with the token by the database clock, locking
-- its row FOR SHARE until the transaction ends (PQ002 when it is not): a
-- token set by hand passes only when it is the current holder's own, and a
-- lease that expired or was released since it was presented admits nothing
-- more. A token below 1 is never admitted (PQ003).
-- +goose StatementBegin
CREATE FUNCTION pgquota.fence_guard_presented() RETURNS trigger
    LANGUAGE plpgsql VOLATILE
    AS $$
DECLARE
    v_resource text;
    v_table    text;
    v_setting  text;
    v_token    bigint;
    v_highest  bigint;
    v_external boolean;
    v_lease    text;
BEGIN
    IF TG_NARGS <> 2 THEN
        RAISE EXCEPTION 'pgquota.fence_guard_presented needs 2 arguments (token column, resource), got %', TG_NARGS;
    END IF;
    v_resource := TG_ARGV[1];
    v_table := format('%I.%I', TG_TABLE_SCHEMA, TG_TABLE_NAME);
    v_setting := nullif(current_setting('pgquota.fence_tokens', true), '');
    IF v_setting IS NOT NULL THEN
        v_token := (v_setting::jsonb ->> v_resource)::bigint;
    END IF;
    SELECT f.max_token INTO v_highest FROM pgquota.fence f WHERE f.resource = v_resource;
    v_highest := coalesce(v_highest, 0);
    IF v_token IS NULL THEN
        RAISE EXCEPTION USING
            ERRCODE = 'PQ003',
            MESSAGE = format('pgquota: no fencing token presented for resource %s: %s on %s needs SELECT pgquota.present_token(%L, <token>) earlier in the same transaction',
                             v_resource, TG_OP, v_table, v_resource),
            DETAIL  = json_build_object('resource', v_resource, 'table', v_table, 'operation', TG_OP,
                                        'token', NULL, 'highest', v_highest)::text;
    END IF;
    IF v_token < v_highest THEN
        RAISE EXCEPTION USING
            ERRCODE = 'PQ001',
            MESSAGE = format('pgquota: stale fencing token %s for resource %s: highest token seen is %s (%s on %s)',
                             v_token, v_resource, v_highest, TG_OP, v_table),
            DETAIL  = json_build_object('resource', v_resource, 'token', v_token, 'highest', v_highest)::text;
    END IF;
    IF v_token > v_highest OR v_token < 1 THEN
        RAISE EXCEPTION USING
            ERRCODE = 'PQ003',
            MESSAGE = format('pgquota: fencing token %s for resource %s was not presented with pgquota.present_token (the highest admitted is %s): %s on %s refused',
                             v_token, v_resource, v_highest, TG_OP, v_table),
            DETAIL  = json_build_object('resource', v_resource, 'table', v_table, 'operation', TG_OP,
                                        'token', v_token, 'highest', v_highest)::text;
    END IF;
    SELECT g.external INTO v_external FROM pgquota.fence_guard_resource g WHERE g.resource = v_resource;
    IF NOT coalesce(v_external, false) THEN
        v_setting := nullif(current_setting('pgquota.fence_leases', true), '');
        IF v_setting IS NOT NULL THEN
            v_lease := v_setting::jsonb ->> v_resource;
        END IF;
        v_lease := coalesce(v_lease, v_resource);
        PERFORM 1 FROM pgquota.lease l
        WHERE l.name = v_lease AND l.token = v_token AND l.expires_at > pgquota.clock()
        FOR SHARE;
        IF NOT FOUND THEN
            RAISE EXCEPTION USING
                ERRCODE = 'PQ002',
                MESSAGE = format('pgquota: lease %s is not held with token %s (expired, released or never acquired with it): %s on %s refused',
                                 v_lease, v_token, TG_OP, v_table),
                DETAIL  = json_build_object('lease', v_lease, 'token', v_token)::text;
        END IF;
    END IF;
    IF TG_LEVEL = 'STATEMENT' THEN
        RETURN NULL;
    END IF;
    IF TG_OP = 'DELETE' THEN
        RETURN OLD;
    END IF;
    RETURN jsonb_populate_record(NEW, jsonb_build_object(TG_ARGV[0], v_token));
END
$$;
-- +goose StatementEnd

-- +goose Down
DROP FUNCTION pgquota.fence_guard_presented();
DROP FUNCTION pgquota.present_token(text, bigint, text);
DROP TABLE pgquota.fence_guard_resource;
