-- name: FenceGet :one
-- The highest fencing token seen for a resource.
SELECT resource, max_token, updated_at
FROM pgquota.fence
WHERE resource = @resource::text;
