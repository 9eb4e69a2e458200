-- Least privilege: the application role.
--
-- pgquota_app is a NOLOGIN group role holding what an application needs to
-- make every pgquota call, and nothing more: USAGE on the schema; SELECT,
-- INSERT, UPDATE and DELETE on its tables and views; USAGE and SELECT on its
-- sequences (lease tokens, identity columns); EXECUTE on its functions;
-- SELECT only on the version table. No DDL: migrations (and attaching a
-- fence guard to an application table, which needs that table's owner) run
-- as the schema's owner. The application logs in as its own role and is
-- made a member: GRANT pgquota_app TO app (`pgquota migrate grant-app
-- --role app` does it).
--
-- Roles are cluster-wide: pgquota_app is shared by every database of the
-- server that runs these migrations, but its privileges are granted per
-- database. It is created here when missing; a migrator that may not create
-- roles (no CREATEROLE) gets a WARNING and no grants, and once an
-- administrator has run CREATE ROLE pgquota_app NOLOGIN, `pgquota migrate
-- grant-app` (pgquota.grant_app()) grants them.
--
-- Default privileges keep the role current: tables, sequences and functions
-- that later migrations create in schema pgquota are granted to pgquota_app
-- as they are created (ALTER DEFAULT PRIVILEGES covers the objects the role
-- running it creates: run every migration as the same owner, or re-run
-- `pgquota migrate grant-app` after migrating as another).

-- +goose Up

-- pgquota.grant_app grants role p_role everything pgquota_app holds, on
-- every object of schema pgquota now and on the ones created later by the
-- role calling it (default privileges). Idempotent.
-- +goose StatementBegin
CREATE FUNCTION pgquota.grant_app(p_role name DEFAULT 'pgquota_app') RETURNS void
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

-- +goose StatementBegin
DO $$
DECLARE
    v_exists boolean := to_regrole('pgquota_app') IS NOT NULL;
BEGIN
    IF NOT v_exists THEN
        BEGIN
            CREATE ROLE pgquota_app NOLOGIN;
            v_exists := true;
        EXCEPTION
            -- Created meanwhile by a migration of another database.
            WHEN duplicate_object OR unique_violation THEN
                v_exists := true;
            WHEN insufficient_privilege THEN
                RAISE WARNING USING
                    MESSAGE = format('pgquota: role pgquota_app does not exist and role %s may not create it: '
                                     'no application role was granted pgquota''s objects', current_user),
                    HINT = 'As a role with CREATEROLE run CREATE ROLE pgquota_app NOLOGIN, '
                           'then as the owner of schema pgquota run pgquota migrate grant-app.';
        END;
    END IF;
    IF v_exists THEN
        PERFORM pgquota.grant_app('pgquota_app');
    END IF;
END
$$;
-- +goose StatementEnd

-- +goose Down
-- The role itself stays: other databases of the server may use it (drop it
-- with DROP ROLE pgquota_app once none does).
-- +goose StatementBegin
DO $$
BEGIN
    IF to_regrole('pgquota_app') IS NOT NULL THEN
        ALTER DEFAULT PRIVILEGES IN SCHEMA pgquota REVOKE ALL ON TABLES FROM pgquota_app;
        ALTER DEFAULT PRIVILEGES IN SCHEMA pgquota REVOKE ALL ON SEQUENCES FROM pgquota_app;
        ALTER DEFAULT PRIVILEGES IN SCHEMA pgquota REVOKE ALL ON FUNCTIONS FROM pgquota_app;
        REVOKE ALL ON ALL TABLES IN SCHEMA pgquota FROM pgquota_app;
        REVOKE ALL ON ALL SEQUENCES IN SCHEMA pgquota FROM pgquota_app;
        REVOKE ALL ON ALL FUNCTIONS IN SCHEMA pgquota FROM pgquota_app;
        REVOKE ALL ON SCHEMA pgquota FROM pgquota_app;
    END IF;
END
$$;
-- +goose StatementEnd
DROP FUNCTION pgquota.grant_app(name);
