-- The fence guard trigger (pgquota.fence_guard_presented, 00018) reads the
-- resource's highest admitted token through pgquota.fence_highest, a
-- SECURITY DEFINER function, instead of reading pgquota.fence itself as the
-- writer. Same value, same snapshot rules (a VOLATILE function's statement
-- takes a fresh snapshot at READ COMMITTED, as the trigger's own SELECT
-- did), so nothing changes on one server. On Citus it is what lets the
-- application role write a guarded table at all: pgquota.present_token
-- (SECURITY DEFINER) raises the mark in the fence's shard as the schema's
-- owner, and Citus refuses a read of that placement, in the same
-- transaction, as another user ("cannot perform query on placements that
-- were modified in this transaction by a different user"), so every
-- guarded write of the application role failed there.
--
-- The trigger still runs as the writer (00022's function_grant row has
-- definer false: it handles the application table's row and must never do
-- so with the owner's rights). fence_highest reveals the mark only, which
-- the roles that get it (pgquota_app, pgquota_relay: those that could
-- SELECT pgquota.fence) could read already.

-- +goose Up
-- +goose StatementBegin
CREATE FUNCTION pgquota.fence_highest(p_resource text) RETURNS bigint
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
    AS $$
DECLARE
    v_highest bigint;
BEGIN
    SELECT f.max_token INTO v_highest FROM pgquota.fence f WHERE f.resource = p_resource;
    RETURN coalesce(v_highest, 0);
END
$$;
-- +goose StatementEnd
REVOKE ALL ON FUNCTION pgquota.fence_highest(text) FROM PUBLIC;
INSERT INTO pgquota.function_grant (function, role) VALUES
    ('pgquota.fence_highest(text)', 'pgquota_app'),
    ('pgquota.fence_highest(text)', 'pgquota_relay');

-- +goose StatementBegin
DO $$
DECLARE
    def text := pg_catalog.pg_get_functiondef('pgquota.fence_guard_presented()'::regprocedure);
    old text := 'SELECT f.max_token INTO v_highest FROM pgquota.fence f WHERE f.resource = v_resource;';
BEGIN
    IF strpos(def, old) = 0 THEN
        RAISE EXCEPTION 'pgquota: pgquota.fence_guard_presented does not read pgquota.fence as expected';
    END IF;
    EXECUTE replace(def, old, 'v_highest := pgquota.fence_highest(v_resource);');
END
$$;
-- +goose StatementEnd

SELECT pgquota.grant_roles();

-- +goose Down
-- +goose StatementBegin
DO $$
DECLARE
    def text := pg_catalog.pg_get_functiondef('pgquota.fence_guard_presented()'::regprocedure);
BEGIN
    EXECUTE replace(def, 'v_highest := pgquota.fence_highest(v_resource);',
                    'SELECT f.max_token INTO v_highest FROM pgquota.fence f WHERE f.resource = v_resource;');
END
$$;
-- +goose StatementEnd
DELETE FROM pgquota.function_grant WHERE function = 'pgquota.fence_highest(text)';
DROP FUNCTION pgquota.fence_highest(text);
