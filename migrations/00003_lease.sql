-- Fenced lock: leases that issue fencing tokens, the highest token seen per
-- resource, a generic fenced-row table, and a guard trigger for
-- application tables (Kleppmann 2016, "How to do distributed locking").
--
-- Rejections raise two pgquota-specific SQLSTATEs, in class PQ (no
-- PostgreSQL class uses it):
--   PQ001 stale fencing token: the token is below the highest token seen
--         for the resource (or below the token of the lease the write is
--         checked against). DETAIL is a JSON object
--         {"resource": text, "token": bigint|null, "highest": bigint}.
--   PQ002 lease not held: the write names a lease that is not held with
--         the token (expired, released, or never acquired with it).
--         DETAIL is a JSON object {"lease": text, "token": bigint}.

-- +goose Up
-- Every lease token comes from this one sequence: tokens strictly increase
-- across every acquisition of every lease, also across releases and deleted
-- lease rows, and never wrap (NO CYCLE: nextval fails rather than restart).
-- Gaps are allowed and happen (a value taken by an acquire that lost a race).
CREATE SEQUENCE pgquota.lease_token AS bigint MINVALUE 1 START WITH 1 NO CYCLE;

-- One row per lease name. A lease is held while expires_at > pgquota.clock()
-- (the database clock, read inside each statement). attempt identifies the
-- acquisition attempt that took it, so that the same attempt retried after
-- a lost reply gets the same lease and token back. token stays the same for
-- the whole lease: renewals move expires_at only.
CREATE TABLE pgquota.lease (
    name        text        NOT NULL PRIMARY KEY,
    holder      text        NOT NULL,
    attempt     text        NOT NULL,
    token       bigint      NOT NULL,
    acquired_at timestamptz NOT NULL,
    renewed_at  timestamptz NOT NULL,
    expires_at  timestamptz NOT NULL,
    CONSTRAINT lease_name_length CHECK (octet_length(name) BETWEEN 1 AND 255),
    CONSTRAINT lease_holder_length CHECK (octet_length(holder) BETWEEN 1 AND 255),
    CONSTRAINT lease_attempt_length CHECK (octet_length(attempt) BETWEEN 1 AND 255),
    CONSTRAINT lease_token_positive CHECK (token > 0)
);

-- The highest fencing token seen per resource: the storage side of the
-- fence. Every fenced write (pgquota.fence_admit) raises it or is rejected.
-- Tokens may come from pgquota leases or from an external lock service
-- (an etcd revision, a ZooKeeper zxid).
CREATE TABLE pgquota.fence (
    resource   text        NOT NULL PRIMARY KEY,
    max_token  bigint      NOT NULL,
    updated_at timestamptz NOT NULL,
    CONSTRAINT fence_resource_length CHECK (octet_length(resource) BETWEEN 1 AND 255)
);

-- Generic fenced rows: values keyed by (resource, key), each written with
-- the fencing token of its writer.
CREATE TABLE pgquota.fenced_row (
    resource    text        NOT NULL,
    key         text        NOT NULL,
    value       text        NOT NULL,
    fence_token bigint      NOT NULL,
    updated_at  timestamptz NOT NULL,
    PRIMARY KEY (resource, key),
    CONSTRAINT fenced_row_resource_length CHECK (octet_length(resource) BETWEEN 1 AND 255),
    CONSTRAINT fenced_row_key_length CHECK (octet_length(key) BETWEEN 1 AND 255)
);

-- pgquota.lease_fresh returns a lease row read with a fresh snapshot (see
-- pgquota.usage_used_fresh): acquire calls it only when it did not take the
-- lease, to report who holds it, including a holder that committed while
-- the acquire statement ran. Never a guard.
-- +goose StatementBegin
CREATE FUNCTION pgquota.lease_fresh(p_name text)
    RETURNS SETOF pgquota.lease
    LANGUAGE plpgsql VOLATILE
    AS $$
BEGIN
    RETURN QUERY SELECT * FROM pgquota.lease WHERE name = p_name;
END
$$;
-- +goose StatementEnd

-- pgquota.fence_admit admits a write carrying fencing token p_token on
-- resource p_resource, or raises. It returns true, or raises PQ001 (stale
-- token) or PQ002 (lease not held); call it in the statement that writes.
--
--   * When p_lease is not NULL, the lease of that name must be held with
--     p_token by the database clock. The lease row is locked FOR SHARE, so
--     no acquire can take the lease over (its upsert needs a row lock that
--     conflicts) until the writing transaction ends: a steal cannot slip in
--     between the check and the write. A lease taken over by a newer token
--     is reported as a stale token.
--   * Then the resource's high-water row is raised to p_token by an upsert
--     whose guard max_token <= p_token sits in the WHERE clause of the row
--     being updated: under READ COMMITTED PostgreSQL re-checks it against
--     the newest committed version after waiting for a concurrent writer
--     (the manual, section 13.2.1), and the row stays locked until commit,
--     so fenced writes of one resource serialize on it. Equal tokens are
--     admitted: the holder of a token may write as often as it likes.
--
-- Every query in a VOLATILE plpgsql function takes a fresh snapshot, so the
-- values reported on a rejection are current.
-- +goose StatementBegin
CREATE FUNCTION pgquota.fence_admit(p_resource text, p_token bigint, p_lease text) RETURNS boolean
    LANGUAGE plpgsql VOLATILE
    AS $$
DECLARE
    v_lease_token bigint;
    v_highest     bigint;
BEGIN
    IF p_token IS NULL THEN
        SELECT f.max_token INTO v_highest FROM pgquota.fence f WHERE f.resource = p_resource;
        RAISE EXCEPTION USING
            ERRCODE = 'PQ001',
            MESSAGE = format('pgquota: stale fencing token: a write to resource %s carries no token', p_resource),
            DETAIL  = json_build_object('resource', p_resource, 'token', NULL, 'highest', coalesce(v_highest, 0))::text;
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

-- pgquota.fence_guard is a BEFORE INSERT OR UPDATE row trigger that an
-- application attaches to its own table (quota.Client.AttachFenceGuard, or
-- `pgquota fence guard`), so the database rejects stale writes even from
-- code that bypasses pgquota. Arguments: the token column's name and the
-- resource name whose high-water mark the table shares. A row whose token
-- is NULL or below the highest token seen for the resource is rejected
-- with SQLSTATE PQ001 (see pgquota.fence_admit), whose message names the
-- resource and both tokens. DELETE is not guarded: a deleted row carries no
-- token. The token column must hold a value castable to bigint.
-- +goose StatementBegin
CREATE FUNCTION pgquota.fence_guard() RETURNS trigger
    LANGUAGE plpgsql VOLATILE
    AS $$
DECLARE
    v_token bigint;
BEGIN
    IF TG_NARGS <> 2 THEN
        RAISE EXCEPTION 'pgquota.fence_guard needs 2 arguments (token column, resource), got %', TG_NARGS;
    END IF;
    v_token := (to_jsonb(NEW) ->> TG_ARGV[0])::bigint;
    PERFORM pgquota.fence_admit(TG_ARGV[1], v_token, NULL);
    RETURN NEW;
END
$$;
-- +goose StatementEnd

-- +goose Down
DROP FUNCTION pgquota.fence_guard();
DROP FUNCTION pgquota.fence_admit(text, bigint, text);
DROP FUNCTION pgquota.lease_fresh(text);
DROP TABLE pgquota.fenced_row;
DROP TABLE pgquota.fence;
DROP TABLE pgquota.lease;
DROP SEQUENCE pgquota.lease_token;
