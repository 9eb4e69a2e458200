-- Guarded tables admit only their own lease, a presented token cannot be
-- forged with a session setting, and a holder's own writes no longer starve
-- its renewals.
--
-- 1. Binding. A guarded resource (a row of pgquota.fence_guard_resource)
--    is bound, when the guard is attached, to exactly one source of tokens:
--      * a lease (column lease; NULL means the lease named like the
--        resource, which is what every guard attached before this migration
--        is bound to: the rows are filled in with it);
--      * a semaphore (column semaphore): a token of any slot of it that is
--        held now, checked against the slot's lease row only, so every
--        current slot holder writes and none raises a mark that locks the
--        others out (a stale slot is refused by its lease row: expired,
--        PQ002, or taken over with a larger token, PQ001);
--      * external (column external): tokens of another lock service,
--        checked against the resource's highest token seen; no lease may be
--        named.
--    pgquota.fence_admit (fenced rows, fenced grants), pgquota.present_token
--    and the guard refuse a token presented for a bound resource with any
--    other lease (or any lease at all for an external one) with SQLSTATE
--    PQ004 and move no mark:
--      PQ004 token of another lease: the resource is bound to another lease
--            or semaphore (or takes external tokens only).
--            DETAIL {"resource": text, "lease": text|null, "token": bigint,
--                    "bound": text|null, "binding": "lease"|"semaphore"|"external"}.
--    A fenced write or presentation naming no lease on a lease-bound
--    resource is checked against the bound lease. A resource without a row
--    (fenced rows only, no guard) is unbound: the lease named is checked,
--    as before.
--
-- 2. Proof of presentation. pgquota.present_token still keeps what it
--    admitted in the transaction-scoped setting pgquota.fence_tokens
--    ({"resource": {"token": n, "lease": text|null, "proof": hex}}), which
--    works behind a transaction-mode pooler; but the guard no longer trusts
--    the setting: each entry carries a keyed hash (SHA-256, key in
--    pgquota.fence_secret) over the resource, token, lease and
--    pg_current_xact_id(). Only pgquota.fence_present computes it, after
--    admitting the token; pgquota.fence_proof_valid checks it. Both are
--    SECURITY DEFINER with a pinned search_path, and the key table and the
--    minting function pgquota.fence_proof are revoked from PUBLIC and from
--    pgquota_app, so a client can neither read the key nor mint a proof, and
--    a proof is worth nothing in another transaction. A token set by hand
--    is refused with PQ003.
--
-- 3. Lock modes. Writers lock the lease row FOR KEY SHARE (it was FOR
--    SHARE). A renewal (UPDATE of renewed_at, expires_at) and a release take
--    FOR NO KEY UPDATE, which does not conflict with KEY SHARE: a holder's
--    renewals no longer wait behind its own writers. The unique index
--    lease_name_token below makes token a key column (the manual, 13.3.2:
--    key columns are those of a non-partial unique index usable by a
--    foreign key), so an acquire that changes the token (its ON CONFLICT DO
--    UPDATE) and a slot takeover lock the row FOR UPDATE, which conflicts
--    with KEY SHARE: a successor still waits for every in-flight write of
--    the old token, and the old token admits nothing once it committed.
--
-- 4. present_token checks its arguments (22023): resource and lease 1 to
--    255 bytes, no control characters; the message never echoes them.

-- +goose Up
ALTER TABLE pgquota.fence_guard_resource
    ADD COLUMN lease     text,
    ADD COLUMN semaphore text;
UPDATE pgquota.fence_guard_resource SET lease = resource WHERE NOT external;
ALTER TABLE pgquota.fence_guard_resource
    ADD CONSTRAINT fence_guard_resource_one_binding
        CHECK (num_nonnulls(lease, semaphore) + external::int <= 1),
    ADD CONSTRAINT fence_guard_resource_lease_length
        CHECK (octet_length(lease) BETWEEN 1 AND 255),
    ADD CONSTRAINT fence_guard_resource_semaphore_length
        CHECK (octet_length(semaphore) BETWEEN 1 AND 240);

-- token becomes a key column (see 3. above). (name, token) is unique since
-- name is: building it cannot fail.
CREATE UNIQUE INDEX lease_name_token ON pgquota.lease (name, token);

-- The key of the proofs of presentation: 32 random bytes (gen_random_uuid
-- draws from the server's strong random source).
CREATE TABLE pgquota.fence_secret (
    id     boolean NOT NULL PRIMARY KEY DEFAULT true,
    secret bytea   NOT NULL,
    CONSTRAINT fence_secret_one_row CHECK (id),
    CONSTRAINT fence_secret_length CHECK (octet_length(secret) = 32)
);
INSERT INTO pgquota.fence_secret (secret)
SELECT sha256(convert_to(gen_random_uuid()::text || gen_random_uuid()::text || gen_random_uuid()::text
                         || clock_timestamp()::text, 'UTF8'));
REVOKE ALL ON pgquota.fence_secret FROM PUBLIC;

-- pgquota.fence_proof is the proof that this transaction presented p_token
-- for p_resource with p_lease: hex of SHA-256(k || SHA-256(k || m)), k the
-- key, m the JSON array [xid, token, lease, resource] (the nested form
-- resists length extension). Internal: only pgquota.fence_present and
-- pgquota.fence_proof_valid call it.
-- +goose StatementBegin
CREATE FUNCTION pgquota.fence_proof(p_resource text, p_token bigint, p_lease text) RETURNS text
    LANGUAGE sql VOLATILE SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
    AS $$
    SELECT encode(sha256(s.secret || sha256(s.secret || convert_to(
               json_build_array(pg_current_xact_id()::text, p_token, p_lease, p_resource)::text, 'UTF8'))), 'hex')
    FROM pgquota.fence_secret s
$$;
-- +goose StatementEnd
REVOKE ALL ON FUNCTION pgquota.fence_proof(text, bigint, text) FROM PUBLIC;

-- pgquota.fence_proof_valid reports whether p_proof is this transaction's
-- proof for (p_resource, p_token, p_lease). It reveals nothing else.
-- +goose StatementBegin
CREATE FUNCTION pgquota.fence_proof_valid(p_resource text, p_token bigint, p_lease text, p_proof text) RETURNS boolean
    LANGUAGE sql VOLATILE SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
    AS $$
    SELECT p_proof IS NOT NULL AND p_token IS NOT NULL AND p_resource IS NOT NULL
           AND p_proof = pgquota.fence_proof(p_resource, p_token, p_lease)
$$;
-- +goose StatementEnd

-- pgquota.fence_binding_error raises PQ004 for p_token presented with
-- p_lease on p_resource, bound to p_bound (a lease or semaphore name, NULL
-- for external) of kind p_binding.
-- +goose StatementBegin
CREATE FUNCTION pgquota.fence_binding_error(p_resource text, p_token bigint, p_lease text, p_binding text, p_bound text)
    RETURNS void
    LANGUAGE plpgsql VOLATILE
    AS $$
BEGIN
    RAISE EXCEPTION USING
        ERRCODE = 'PQ004',
        MESSAGE = CASE p_binding
            WHEN 'external' THEN format('pgquota: resource %s takes external tokens only: token %s of lease %s refused',
                                        p_resource, p_token, p_lease)
            WHEN 'semaphore' THEN format('pgquota: resource %s is bound to semaphore %s: token %s %s refused',
                                        p_resource, p_bound, p_token,
                                        CASE WHEN p_lease IS NULL THEN 'is not held by any of its slots, and was'
                                             ELSE format('of lease %s', p_lease) END)
            ELSE format('pgquota: resource %s is bound to lease %s: token %s of lease %s refused',
                        p_resource, p_bound, p_token, p_lease) END,
        DETAIL = json_build_object('resource', p_resource, 'lease', p_lease, 'token', p_token,
                                   'bound', p_bound, 'binding', p_binding)::text;
END
$$;
-- +goose StatementEnd

-- pgquota.fence_slot_lease returns the slot lease of semaphore p_semaphore
-- a token p_token presented with p_lease (NULL: find the slot held with
-- the token) is checked against, or raises PQ004 when p_lease is not a slot
-- of the semaphore. With p_lease NULL and no slot row holding the token
-- (stale, or a token of another lease), PQ004 too: the token is no current
-- slot's.
-- +goose StatementBegin
CREATE FUNCTION pgquota.fence_slot_lease(p_resource text, p_token bigint, p_lease text, p_semaphore text) RETURNS text
    LANGUAGE plpgsql VOLATILE
    AS $$
DECLARE
    v_lease text;
BEGIN
    IF p_lease IS NOT NULL THEN
        IF starts_with(p_lease, 'slot:' || p_semaphore || ':')
           AND substr(p_lease, octet_length('slot:' || p_semaphore || ':') + 1) ~ '^(0|[1-9][0-9]{0,3})$' THEN
            RETURN p_lease;
        END IF;
        PERFORM pgquota.fence_binding_error(p_resource, p_token, p_lease, 'semaphore', p_semaphore);
    END IF;
    SELECT l.name INTO v_lease
    FROM pgquota.semaphore s
    CROSS JOIN LATERAL generate_series(0, s.slots - 1) g(i)
    JOIN pgquota.lease l ON l.name = pgquota.slot_lease_name(s.name, g.i)
    WHERE s.name = p_semaphore AND l.token = p_token;
    IF v_lease IS NULL THEN
        PERFORM pgquota.fence_binding_error(p_resource, p_token, NULL, 'semaphore', p_semaphore);
    END IF;
    RETURN v_lease;
END
$$;
-- +goose StatementEnd

-- pgquota.fence_lease_held checks that lease p_lease is held with p_token
-- by the database clock and locks its row FOR KEY SHARE until the
-- transaction ends (an acquire or takeover, which changes the key column
-- token, waits; renewals do not), or raises PQ001 (the lease was acquired
-- since with a larger token) or PQ002 (not held with it). p_what, when
-- not NULL, is appended to the message (the guarded statement).
-- +goose StatementBegin
CREATE FUNCTION pgquota.fence_lease_held(p_resource text, p_token bigint, p_lease text, p_what text) RETURNS void
    LANGUAGE plpgsql VOLATILE
    AS $$
DECLARE
    v_lease_token bigint;
    v_highest     bigint;
BEGIN
    PERFORM 1 FROM pgquota.lease l
    WHERE l.name = p_lease AND l.token = p_token AND l.expires_at > pgquota.clock()
    FOR KEY SHARE;
    IF FOUND THEN
        RETURN;
    END IF;
    SELECT l.token INTO v_lease_token FROM pgquota.lease l WHERE l.name = p_lease;
    IF v_lease_token > p_token THEN
        SELECT f.max_token INTO v_highest FROM pgquota.fence f WHERE f.resource = p_resource;
        v_highest := greatest(v_lease_token, v_highest);
        RAISE EXCEPTION USING
            ERRCODE = 'PQ001',
            MESSAGE = format('pgquota: stale fencing token %s for resource %s: lease %s was acquired since with token %s%s',
                             p_token, p_resource, p_lease, v_lease_token, coalesce(' (' || p_what || ')', '')),
            DETAIL  = json_build_object('resource', p_resource, 'token', p_token, 'highest', v_highest)::text;
    END IF;
    RAISE EXCEPTION USING
        ERRCODE = 'PQ002',
        MESSAGE = format('pgquota: lease %s is not held with token %s (expired, released or never acquired with it)%s',
                         p_lease, p_token, coalesce(': ' || p_what || ' refused', '')),
        DETAIL  = json_build_object('lease', p_lease, 'token', p_token)::text;
END
$$;
-- +goose StatementEnd

-- pgquota.fence_admit as in 00007_token_epoch.sql, bound (see 1. above):
-- on a lease-bound resource p_lease must be the bound lease or NULL (then
-- the bound lease is checked); on a semaphore-bound one a slot of the
-- semaphore held with p_token, and no mark is raised (the slot's lease row
-- alone fences: every current holder writes); on an external one no lease
-- may be named. Refusals of the binding raise PQ004 before anything is
-- written. The lease row is locked FOR KEY SHARE (see 3. above).
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION pgquota.fence_admit(p_resource text, p_token bigint, p_lease text) RETURNS boolean
    LANGUAGE plpgsql VOLATILE
    AS $$
DECLARE
    v_g       pgquota.fence_guard_resource;
    v_lease   text := p_lease;
    v_highest bigint;
BEGIN
    PERFORM pgquota.durable_commit();
    IF p_token IS NULL THEN
        SELECT f.max_token INTO v_highest FROM pgquota.fence f WHERE f.resource = p_resource;
        RAISE EXCEPTION USING
            ERRCODE = 'PQ001',
            MESSAGE = format('pgquota: stale fencing token: a write to resource %s carries no token', p_resource),
            DETAIL  = json_build_object('resource', p_resource, 'token', NULL, 'highest', coalesce(v_highest, 0))::text;
    END IF;
    SELECT g.* INTO v_g FROM pgquota.fence_guard_resource g WHERE g.resource = p_resource;
    IF FOUND THEN
        IF v_g.external THEN
            IF p_lease IS NOT NULL THEN
                PERFORM pgquota.fence_binding_error(p_resource, p_token, p_lease, 'external', NULL);
            END IF;
        ELSIF v_g.semaphore IS NOT NULL THEN
            v_lease := pgquota.fence_slot_lease(p_resource, p_token, p_lease, v_g.semaphore);
            PERFORM pgquota.fence_lease_held(p_resource, p_token, v_lease, NULL);
            RETURN true;
        ELSE
            IF p_lease IS NOT NULL AND p_lease <> coalesce(v_g.lease, p_resource) THEN
                PERFORM pgquota.fence_binding_error(p_resource, p_token, p_lease, 'lease', coalesce(v_g.lease, p_resource));
            END IF;
            v_lease := coalesce(v_g.lease, p_resource);
        END IF;
    END IF;
    IF v_lease IS NOT NULL THEN
        PERFORM pgquota.fence_lease_held(p_resource, p_token, v_lease, NULL);
    END IF;
    INSERT INTO pgquota.fence AS f (resource, max_token, updated_at)
    VALUES (p_resource, p_token, pgquota.clock())
    ON CONFLICT (resource) DO UPDATE
    SET max_token = excluded.max_token,
        updated_at = excluded.updated_at
    WHERE f.max_token <= excluded.max_token;
    IF NOT FOUND THEN
        SELECT f.max_token INTO v_highest FROM pgquota.fence f WHERE f.resource = p_resource;
        RAISE EXCEPTION USING
            ERRCODE = 'PQ001',
            MESSAGE = format('pgquota: stale fencing token %s for resource %s: highest token seen is %s',
                             p_token, p_resource, v_highest),
            DETAIL  = json_build_object('resource', p_resource, 'token', p_token, 'highest', v_highest)::text;
    END IF;
    RETURN true;
END
$$;
-- +goose StatementEnd

-- pgquota.fence_present admits p_token for p_resource (pgquota.fence_admit,
-- with the lease the binding says) and returns [lease, proof]: the lease
-- the token was checked against (NULL for an external resource) and this
-- transaction's proof for it. SECURITY DEFINER: it reads the key; it mints
-- a proof only for a token it has just admitted, so calling it directly is
-- no more than calling pgquota.present_token.
-- +goose StatementBegin
CREATE FUNCTION pgquota.fence_present(p_resource text, p_token bigint, p_lease text) RETURNS text[]
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
    AS $$
DECLARE
    v_g     pgquota.fence_guard_resource;
    v_lease text := p_lease;
BEGIN
    PERFORM pgquota.fence_admit(p_resource, p_token, p_lease);
    SELECT g.* INTO v_g FROM pgquota.fence_guard_resource g WHERE g.resource = p_resource;
    IF NOT FOUND THEN
        v_lease := coalesce(p_lease, p_resource);
    ELSIF v_g.semaphore IS NOT NULL THEN
        v_lease := pgquota.fence_slot_lease(p_resource, p_token, p_lease, v_g.semaphore);
    ELSIF NOT v_g.external THEN
        v_lease := coalesce(v_g.lease, p_resource);
    END IF;
    RETURN ARRAY[v_lease, pgquota.fence_proof(p_resource, p_token, v_lease)];
END
$$;
-- +goose StatementEnd

-- pgquota.present_token as in 00006_fence_guard.sql, bound and with a proof
-- (see 1., 2. and 4. above). Returns p_token.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION pgquota.present_token(p_resource text, p_token bigint, p_lease text DEFAULT NULL) RETURNS bigint
    LANGUAGE plpgsql VOLATILE
    AS $$
DECLARE
    v_got    text[];
    v_tokens jsonb;
BEGIN
    PERFORM pgquota.claim_check_name('present_token: p_resource', p_resource);
    IF p_lease IS NOT NULL THEN
        PERFORM pgquota.claim_check_name('present_token: p_lease', p_lease);
    END IF;
    IF p_token IS NULL OR p_token < 1 THEN
        RAISE EXCEPTION USING
            ERRCODE = '22023',
            MESSAGE = format('pgquota: present_token: p_token must be at least 1, got %s',
                             coalesce(p_token::text, 'NULL'));
    END IF;
    v_got := pgquota.fence_present(p_resource, p_token, p_lease);
    v_tokens := coalesce(nullif(current_setting('pgquota.fence_tokens', true), ''), '{}')::jsonb;
    IF jsonb_typeof(v_tokens) IS DISTINCT FROM 'object' THEN
        v_tokens := '{}';
    END IF;
    PERFORM set_config('pgquota.fence_tokens',
                       (v_tokens || jsonb_build_object(p_resource,
                           jsonb_build_object('token', p_token, 'lease', v_got[1], 'proof', v_got[2])))::text,
                       true);
    RETURN p_token;
END
$$;
-- +goose StatementEnd

-- pgquota.fence_guard_presented as in 00006_fence_guard.sql, except that
-- the presented token counts only with this transaction's proof (else
-- PQ003), and the binding is checked again at each statement (it may have
-- changed since the token was presented): a lease-bound table checks its
-- lease (FOR KEY SHARE) and that the token is the highest seen; a
-- semaphore-bound one only that the presenting slot is held with the token;
-- an external one that the token is the highest seen.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION pgquota.fence_guard_presented() RETURNS trigger
    LANGUAGE plpgsql VOLATILE
    AS $$
DECLARE
    v_resource text;
    v_table    text;
    v_what     text;
    v_entry    jsonb;
    v_token    bigint;
    v_lease    text;
    v_highest  bigint;
    v_g        pgquota.fence_guard_resource;
BEGIN
    IF TG_NARGS <> 2 THEN
        RAISE EXCEPTION 'pgquota.fence_guard_presented needs 2 arguments (token column, resource), got %', TG_NARGS;
    END IF;
    v_resource := TG_ARGV[1];
    v_table := format('%I.%I', TG_TABLE_SCHEMA, TG_TABLE_NAME);
    v_what := format('%s on %s', TG_OP, v_table);
    BEGIN
        v_entry := nullif(current_setting('pgquota.fence_tokens', true), '')::jsonb -> v_resource;
        IF jsonb_typeof(v_entry) = 'object' THEN
            v_token := (v_entry ->> 'token')::bigint;
            v_lease := v_entry ->> 'lease';
        ELSIF jsonb_typeof(v_entry) IN ('number', 'string') THEN
            -- The form of 00006, set by hand: no proof.
            v_token := (v_entry #>> '{}')::bigint;
        END IF;
    EXCEPTION WHEN OTHERS THEN
        v_entry := NULL; v_token := NULL; -- a setting written by hand that does not parse
    END;
    SELECT f.max_token INTO v_highest FROM pgquota.fence f WHERE f.resource = v_resource;
    v_highest := coalesce(v_highest, 0);
    IF v_token IS NULL THEN
        RAISE EXCEPTION USING
            ERRCODE = 'PQ003',
            MESSAGE = format('pgquota: no fencing token presented for resource %s: %s needs SELECT pgquota.present_token(%L, <token>) earlier in the same transaction',
                             v_resource, v_what, v_resource),
            DETAIL  = json_build_object('resource', v_resource, 'table', v_table, 'operation', TG_OP,
                                        'token', NULL, 'highest', v_highest)::text;
    END IF;
    IF NOT pgquota.fence_proof_valid(v_resource, v_token, v_lease, v_entry ->> 'proof') THEN
        RAISE EXCEPTION USING
            ERRCODE = 'PQ003',
            MESSAGE = format('pgquota: fencing token %s for resource %s was not presented with pgquota.present_token in this transaction: %s refused',
                             v_token, v_resource, v_what),
            DETAIL  = json_build_object('resource', v_resource, 'table', v_table, 'operation', TG_OP,
                                        'token', v_token, 'highest', v_highest)::text;
    END IF;
    SELECT g.* INTO v_g FROM pgquota.fence_guard_resource g WHERE g.resource = v_resource;
    IF v_g.semaphore IS NOT NULL THEN
        IF v_lease IS NULL OR NOT starts_with(v_lease, 'slot:' || v_g.semaphore || ':') THEN
            PERFORM pgquota.fence_binding_error(v_resource, v_token, v_lease, 'semaphore', v_g.semaphore);
        END IF;
        PERFORM pgquota.fence_lease_held(v_resource, v_token, v_lease, v_what);
    ELSE
        IF v_token < v_highest THEN
            RAISE EXCEPTION USING
                ERRCODE = 'PQ001',
                MESSAGE = format('pgquota: stale fencing token %s for resource %s: highest token seen is %s (%s)',
                                 v_token, v_resource, v_highest, v_what),
                DETAIL  = json_build_object('resource', v_resource, 'token', v_token, 'highest', v_highest)::text;
        END IF;
        IF v_token > v_highest THEN
            -- Admitted, then the mark was lowered (by hand) or its row
            -- deleted: nothing vouches for the token any more.
            RAISE EXCEPTION USING
                ERRCODE = 'PQ003',
                MESSAGE = format('pgquota: fencing token %s for resource %s is above the highest admitted (%s): %s refused',
                                 v_token, v_resource, v_highest, v_what),
                DETAIL  = json_build_object('resource', v_resource, 'table', v_table, 'operation', TG_OP,
                                            'token', v_token, 'highest', v_highest)::text;
        END IF;
        IF v_g.external THEN
            IF v_lease IS NOT NULL THEN
                PERFORM pgquota.fence_binding_error(v_resource, v_token, v_lease, 'external', NULL);
            END IF;
        ELSE
            IF v_lease IS DISTINCT FROM coalesce(v_g.lease, v_resource) THEN
                PERFORM pgquota.fence_binding_error(v_resource, v_token, v_lease, 'lease', coalesce(v_g.lease, v_resource));
            END IF;
            PERFORM pgquota.fence_lease_held(v_resource, v_token, v_lease, v_what);
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


-- pgquota.fence_guards lists every table guarded by
-- pgquota.fence_guard_presented (partitions' cloned triggers aside) with
-- whether its guard fires for ordinary writes, and why not:
--   * a trigger disabled (ALTER TABLE ... DISABLE TRIGGER, tgenabled D) or
--     made to fire only in replica sessions (ENABLE REPLICA TRIGGER, R);
--   * a trigger missing (the row trigger, or the TRUNCATE one);
--   * a trigger that fires in origin sessions only (the default, O) while
--     a role or database is set to session_replication_role = replica
--     (ALTER ROLE/DATABASE ... SET): its sessions bypass the guard.
--     ENABLE ALWAYS TRIGGER (A) fires in every session, logical
--     replication's apply workers included.
-- A session that sets session_replication_role = replica itself (a
-- superuser, a role granted SET on it) bypasses an O trigger too; that
-- cannot be seen from here. Columns: table_name (quoted), resource, fires,
-- problem (NULL when it fires).
-- +goose StatementBegin
CREATE FUNCTION pgquota.fence_guards()
    RETURNS TABLE (table_name text, resource text, fires boolean, problem text)
    LANGUAGE sql STABLE
    AS $$
    WITH t AS (
        SELECT c.oid AS relid, format('%I.%I', n.nspname, c.relname) AS table_name,
               max(tr.tgenabled::text) FILTER (WHERE tr.tgname = 'pgquota_fence_guard') AS row_enabled,
               max(tr.tgenabled::text) FILTER (WHERE tr.tgname = 'pgquota_fence_guard_truncate') AS trunc_enabled,
               max(g.resource) AS resource
        FROM pg_catalog.pg_trigger tr
        JOIN pg_catalog.pg_class c ON c.oid = tr.tgrelid
        JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
        LEFT JOIN pgquota.fence_guard_resource g
               ON position('\x00'::bytea || convert_to(g.resource, 'UTF8') || '\x00'::bytea IN '\x00'::bytea || tr.tgargs) > 0
        WHERE tr.tgfoid = 'pgquota.fence_guard_presented()'::regprocedure AND tr.tgparentid = 0
        GROUP BY c.oid, n.nspname, c.relname
    ), replica AS (
        SELECT string_agg(CASE WHEN s.setrole <> 0 THEN 'role ' || quote_ident(r.rolname) ELSE 'database ' || quote_ident(d.datname) END,
                          ', ' ORDER BY r.rolname, d.datname) AS who
        FROM pg_catalog.pg_db_role_setting s
        LEFT JOIN pg_catalog.pg_roles r ON r.oid = s.setrole
        LEFT JOIN pg_catalog.pg_database d ON d.oid = s.setdatabase
        WHERE 'session_replication_role=replica' = ANY (s.setconfig)
          AND (s.setdatabase = 0 OR s.setdatabase = (SELECT oid FROM pg_catalog.pg_database WHERE datname = current_database()))
    ), p AS (
        SELECT t.table_name, t.resource,
               concat_ws('; ',
                   CASE WHEN t.row_enabled IS NULL THEN 'trigger pgquota_fence_guard is missing: INSERT, UPDATE and DELETE are not guarded'
                        WHEN t.row_enabled = 'D' THEN 'trigger pgquota_fence_guard is disabled (DISABLE TRIGGER): INSERT, UPDATE and DELETE are not guarded'
                        WHEN t.row_enabled = 'R' THEN 'trigger pgquota_fence_guard fires only in replica sessions (ENABLE REPLICA TRIGGER): INSERT, UPDATE and DELETE are not guarded' END,
                   CASE WHEN t.trunc_enabled IS NULL THEN 'trigger pgquota_fence_guard_truncate is missing: TRUNCATE is not guarded'
                        WHEN t.trunc_enabled = 'D' THEN 'trigger pgquota_fence_guard_truncate is disabled (DISABLE TRIGGER): TRUNCATE is not guarded'
                        WHEN t.trunc_enabled = 'R' THEN 'trigger pgquota_fence_guard_truncate fires only in replica sessions (ENABLE REPLICA TRIGGER): TRUNCATE is not guarded' END,
                   CASE WHEN (t.row_enabled = 'O' OR t.trunc_enabled = 'O') AND replica.who IS NOT NULL
                        THEN 'session_replication_role = replica is set for ' || replica.who
                             || ', whose sessions bypass the guard (ENABLE ALWAYS TRIGGER to guard them)' END) AS problem
        FROM t, replica
    )
    SELECT p.table_name, p.resource, p.problem = '', nullif(p.problem, '')
    FROM p
    ORDER BY p.table_name
$$;
-- +goose StatementEnd

-- pgquota.grant_app as in 00010_app_role.sql, and it keeps the key and the
-- minting function from the role (`pgquota migrate grant-app` re-run).
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION pgquota.grant_app(p_role name DEFAULT 'pgquota_app') RETURNS void
    LANGUAGE plpgsql VOLATILE
    AS $$
BEGIN
    EXECUTE format('GRANT USAGE ON SCHEMA pgquota TO %I', p_role);
    EXECUTE format('GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA pgquota TO %I', p_role);
    EXECUTE format('GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA pgquota TO %I', p_role);
    EXECUTE format('GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA pgquota TO %I', p_role);
    EXECUTE format('ALTER DEFAULT PRIVILEGES IN SCHEMA pgquota GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO %I', p_role);
    EXECUTE format('ALTER DEFAULT PRIVILEGES IN SCHEMA pgquota GRANT USAGE, SELECT ON SEQUENCES TO %I', p_role);
    EXECUTE format('ALTER DEFAULT PRIVILEGES IN SCHEMA pgquota GRANT EXECUTE ON FUNCTIONS TO %I', p_role);
    -- The version table is read (CheckSchema, migrate status), never written.
    IF to_regclass('pgquota.pgquota_migrations') IS NOT NULL THEN
        EXECUTE format('REVOKE INSERT, UPDATE, DELETE ON pgquota.pgquota_migrations FROM %I', p_role);
    END IF;
    -- The key of the proofs of presentation, and the function that mints
    -- them (00018_guard_binding.sql): never the application's.
    IF to_regclass('pgquota.fence_secret') IS NOT NULL THEN
        EXECUTE format('REVOKE ALL ON pgquota.fence_secret FROM %I', p_role);
        EXECUTE format('REVOKE ALL ON FUNCTION pgquota.fence_proof(text, bigint, text) FROM %I', p_role);
    END IF;
    -- Granting is the owner's business.
    EXECUTE format('REVOKE EXECUTE ON FUNCTION pgquota.grant_app(name) FROM PUBLIC, %I', p_role);
END
$$;
-- +goose StatementEnd

-- The application role: it calls the SECURITY DEFINER functions; it must
-- neither read the key nor mint a proof (default privileges of 00010 gave
-- it both as they were created).
-- +goose StatementBegin
DO $$
BEGIN
    IF to_regrole('pgquota_app') IS NOT NULL THEN
        REVOKE ALL ON pgquota.fence_secret FROM pgquota_app;
        REVOKE ALL ON FUNCTION pgquota.fence_proof(text, bigint, text) FROM pgquota_app;
    END IF;
END
$$;
-- +goose StatementEnd

-- +goose Down
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION pgquota.grant_app(p_role name DEFAULT 'pgquota_app') RETURNS void
    LANGUAGE plpgsql VOLATILE
    AS $$
BEGIN
    EXECUTE format('GRANT USAGE ON SCHEMA pgquota TO %I', p_role);
    EXECUTE format('GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA pgquota TO %I', p_role);
    EXECUTE format('GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA pgquota TO %I', p_role);
    EXECUTE format('GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA pgquota TO %I', p_role);
    EXECUTE format('ALTER DEFAULT PRIVILEGES IN SCHEMA pgquota GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO %I', p_role);
    EXECUTE format('ALTER DEFAULT PRIVILEGES IN SCHEMA pgquota GRANT USAGE, SELECT ON SEQUENCES TO %I', p_role);
    EXECUTE format('ALTER DEFAULT PRIVILEGES IN SCHEMA pgquota GRANT EXECUTE ON FUNCTIONS TO %I', p_role);
    -- The version table is read (CheckSchema, migrate status), never written.
    IF to_regclass('pgquota.pgquota_migrations') IS NOT NULL THEN
        EXECUTE format('REVOKE INSERT, UPDATE, DELETE ON pgquota.pgquota_migrations FROM %I', p_role);
    END IF;
    -- Granting is the owner's business.
    EXECUTE format('REVOKE EXECUTE ON FUNCTION pgquota.grant_app(name) FROM PUBLIC, %I', p_role);
END
$$;
-- +goose StatementEnd
-- Functions as 00006 and 00007 left them; the bindings' columns go (every
-- lease-backed guard is then checked against the lease named like its
-- resource again, or the lease a writer names).
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION pgquota.fence_guard_presented() RETURNS trigger
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
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION pgquota.present_token(p_resource text, p_token bigint, p_lease text DEFAULT NULL) RETURNS bigint
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
        v_tokens := coalesce(nullif(current_setting('pgquota.fence_leases', true), ''), '{}')::jsonb;
        PERFORM set_config('pgquota.fence_leases',
                           (v_tokens || jsonb_build_object(p_resource, coalesce(p_lease, p_resource)))::text, true);
    END IF;
    RETURN p_token;
END
$$;
-- +goose StatementEnd
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION pgquota.fence_admit(p_resource text, p_token bigint, p_lease text) RETURNS boolean
    LANGUAGE plpgsql VOLATILE
    AS $$
DECLARE
    v_lease_token bigint;
    v_highest     bigint;
BEGIN
    PERFORM pgquota.durable_commit();
    IF p_token IS NULL THEN
        SELECT f.max_token INTO v_highest FROM pgquota.fence f WHERE f.resource = p_resource;
        RAISE EXCEPTION USING
            ERRCODE = 'PQ001',
            MESSAGE = format('pgquota: stale fencing token: a write to resource %s carries no token', p_resource),
            DETAIL  = json_build_object('resource', p_resource, 'token', NULL, 'highest', coalesce(v_highest, 0))::text;
    END IF;
    IF p_lease IS NULL
       AND EXISTS (SELECT 1 FROM pgquota.fence_guard_resource g WHERE g.resource = p_resource AND NOT g.external)
       AND p_token > pgquota.lease_token_ceiling() THEN
        RAISE EXCEPTION USING
            ERRCODE = 'PQ002',
            MESSAGE = format('pgquota: fencing token %s for resource %s was never issued by a pgquota lease (the highest issued is at most %s): its guarded table takes lease tokens (attach the guard with --external for tokens of another lock service)',
                             p_token, p_resource, pgquota.lease_token_ceiling()),
            DETAIL  = json_build_object('lease', NULL, 'token', p_token)::text;
    END IF;
    IF p_lease IS NOT NULL THEN
        PERFORM 1 FROM pgquota.lease l
        WHERE l.name = p_lease AND l.token = p_token AND l.expires_at > pgquota.clock()
        FOR SHARE;
        IF NOT FOUND THEN
            SELECT l.token INTO v_lease_token FROM pgquota.lease l WHERE l.name = p_lease;
            IF v_lease_token > p_token THEN
                SELECT f.max_token INTO v_highest FROM pgquota.fence f WHERE f.resource = p_resource;
                v_highest := greatest(v_lease_token, v_highest);
                RAISE EXCEPTION USING
                    ERRCODE = 'PQ001',
                    MESSAGE = format('pgquota: stale fencing token %s for resource %s: lease %s was acquired since with token %s',
                                     p_token, p_resource, p_lease, v_lease_token),
                    DETAIL  = json_build_object('resource', p_resource, 'token', p_token, 'highest', v_highest)::text;
            END IF;
            RAISE EXCEPTION USING
                ERRCODE = 'PQ002',
                MESSAGE = format('pgquota: lease %s is not held with token %s (expired, released or never acquired with it)',
                                 p_lease, p_token),
                DETAIL  = json_build_object('lease', p_lease, 'token', p_token)::text;
        END IF;
    END IF;
    INSERT INTO pgquota.fence AS f (resource, max_token, updated_at)
    VALUES (p_resource, p_token, pgquota.clock())
    ON CONFLICT (resource) DO UPDATE
    SET max_token = excluded.max_token,
        updated_at = excluded.updated_at
    WHERE f.max_token <= excluded.max_token;
    IF NOT FOUND THEN
        SELECT f.max_token INTO v_highest FROM pgquota.fence f WHERE f.resource = p_resource;
        RAISE EXCEPTION USING
            ERRCODE = 'PQ001',
            MESSAGE = format('pgquota: stale fencing token %s for resource %s: highest token seen is %s',
                             p_token, p_resource, v_highest),
            DETAIL  = json_build_object('resource', p_resource, 'token', p_token, 'highest', v_highest)::text;
    END IF;
    RETURN true;
END
$$;
-- +goose StatementEnd
DROP FUNCTION pgquota.fence_guards();
DROP FUNCTION pgquota.fence_present(text, bigint, text);
DROP FUNCTION pgquota.fence_lease_held(text, bigint, text, text);
DROP FUNCTION pgquota.fence_slot_lease(text, bigint, text, text);
DROP FUNCTION pgquota.fence_binding_error(text, bigint, text, text, text);
DROP FUNCTION pgquota.fence_proof_valid(text, bigint, text, text);
DROP FUNCTION pgquota.fence_proof(text, bigint, text);
DROP TABLE pgquota.fence_secret;
DROP INDEX pgquota.lease_name_token;
ALTER TABLE pgquota.fence_guard_resource
    DROP CONSTRAINT fence_guard_resource_semaphore_length,
    DROP CONSTRAINT fence_guard_resource_lease_length,
    DROP CONSTRAINT fence_guard_resource_one_binding,
    DROP COLUMN semaphore,
    DROP COLUMN lease;
