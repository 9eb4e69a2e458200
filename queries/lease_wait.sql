-- name: LeaseWaitRegister :one
-- Registers (or refreshes) AcquireWait's waiter @waiter of lease @name for
-- @lifetime, so that a release of the lease notifies
-- (migrations/00013_lease_waiter.sql); returns when the registration ends
-- by the database clock.
SELECT pgquota.lease_wait_register(@name::text, @waiter::text, @lifetime::interval)::timestamptz AS until;

-- name: LeaseWaitUnregister :exec
-- Removes waiter @waiter's registration for lease @name.
-- The statement is pgquota.lease_wait_unregister (migrations/00022_app_role_lockdown.sql),
-- SECURITY DEFINER: the calling role needs EXECUTE on it, no table privilege.
SELECT pgquota.lease_wait_unregister(@name::text, @waiter::text);
