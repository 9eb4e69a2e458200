-- name: QuotaOverrideSet :one
INSERT INTO pgquota.quota_override (quota_name, member, limit_value)
VALUES (@quota_name::text, @member::text, @limit_value::bigint)
ON CONFLICT (quota_name, member) DO UPDATE
SET limit_value = excluded.limit_value,
    updated_at  = pgquota.clock()
RETURNING quota_name, member, limit_value, updated_at;

-- name: QuotaOverrideDelete :execrows
DELETE FROM pgquota.quota_override
WHERE quota_name = @quota_name::text AND member = @member::text;

-- name: QuotaOverrideList :many
SELECT quota_name, member, limit_value, updated_at
FROM pgquota.quota_override
WHERE quota_name = @quota_name::text
ORDER BY member;
