-- name: FenceGet :one
-- The highest fencing token seen for a resource.
SELECT resource, max_token, updated_at
FROM pgquota.fence
WHERE resource = @resource::text;

-- name: FencePresentToken :one
-- Presents @token for @resource in the caller's transaction (see
-- pgquota.present_token in migrations/00006_fence_guard.sql): validated
-- against the lease @lease (default: the lease named like the resource)
-- unless the resource's guard was attached for external tokens, raised into
-- the resource's highest token seen, and kept in the transaction-scoped
-- setting the guard's triggers read.
SELECT pgquota.present_token(@resource::text, @token::bigint, sqlc.narg('lease')::text)::bigint AS token;
