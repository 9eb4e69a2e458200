-- name: FencedRowWrite :one
-- Writes one fenced row in ONE statement. pgquota.fence_admit runs first
-- (the row to insert is computed from it) and raises PQ001 for a stale
-- token, or PQ002 when @lease is given and not held with @token; otherwise
-- it has raised the resource's high-water mark to @token and holds that
-- row locked until commit, so the upsert below cannot interleave with
-- another fenced writer of the resource. The row's own fence_token guard
-- is a backstop.
-- The statement is pgquota.fenced_row_write (migrations/00022_app_role_lockdown.sql),
-- SECURITY DEFINER: the calling role needs EXECUTE on it, no table privilege.
SELECT * FROM pgquota.fenced_row_write(@resource::text, @key::text, @value::text, @token::bigint, sqlc.narg('lease')::text);

-- name: FencedRowGet :one
SELECT resource, key, value, fence_token, updated_at
FROM pgquota.fenced_row
WHERE resource = @resource::text AND key = @key::text;

-- name: FencedRowList :many
SELECT resource, key, value, fence_token, updated_at
FROM pgquota.fenced_row
WHERE resource = @resource::text
ORDER BY key;
