-- name: QuotaOverrideSet :one
-- Sets a member's own limit. No row comes back, and nothing is written, when
-- the quota does not exist: the caller learns it without a foreign key
-- violation, which would abort the caller's transaction in SetMemberLimitTx.
INSERT INTO pgquota.quota_override (quota_name, member, limit_value)
SELECT q.name, @member::text, @limit_value::bigint
FROM pgquota.quota q
WHERE q.name = @quota_name::text
  AND (set_config('synchronous_commit', CASE current_setting('synchronous_commit') WHEN 'off' THEN 'on' ELSE current_setting('synchronous_commit') END, true) <> '')
ON CONFLICT (quota_name, member) DO UPDATE
SET limit_value = excluded.limit_value,
    updated_at  = pgquota.clock()
RETURNING quota_name, member, limit_value, updated_at;

-- name: QuotaOverrideDelete :execrows
DELETE FROM pgquota.quota_override
WHERE quota_name = @quota_name::text AND member = @member::text
  AND (set_config('synchronous_commit', CASE current_setting('synchronous_commit') WHEN 'off' THEN 'on' ELSE current_setting('synchronous_commit') END, true) <> '');

-- name: QuotaOverrideList :many
SELECT quota_name, member, limit_value, updated_at
FROM pgquota.quota_override
WHERE quota_name = @quota_name::text
ORDER BY member;
