-- name: QuotaOverrideSet :one
-- Sets a member's own limit. No row comes back, and nothing is written, when
-- the quota does not exist: the caller learns it without a foreign key
-- violation, which would abort the caller's transaction in SetMemberLimitTx.
-- The statement is pgquota.quota_override_set (migrations/00022_app_role_lockdown.sql),
-- SECURITY DEFINER: the calling role needs EXECUTE on it, no table privilege.
SELECT * FROM pgquota.quota_override_set(@member::text, @limit_value::bigint, @quota_name::text);

-- name: QuotaOverrideDelete :one
-- The statement is pgquota.quota_override_delete (migrations/00022_app_role_lockdown.sql),
-- SECURITY DEFINER: the calling role needs EXECUTE on it, no table privilege.
SELECT pgquota.quota_override_delete(@quota_name::text, @member::text)::bigint AS rows;

-- name: QuotaOverrideList :many
SELECT quota_name, member, limit_value, updated_at
FROM pgquota.quota_override
WHERE quota_name = @quota_name::text
ORDER BY member;
