-- name: LeaseAcquire :many
-- Takes the lease @name for @holder's acquisition attempt @attempt for
-- @ttl, in ONE statement, when the lease row is absent or
-- expired by the database clock; or, when the row is still held by the
-- same attempt (a retry after a lost reply), returns it unchanged.
--
--   * The NOT EXISTS pre-check reads the statement's snapshot. It only
--     spares a held lease from proposing an insert, which would take a
--     token from the sequence for nothing. It is not the guard.
--   * The guard is the WHERE clause of ON CONFLICT DO UPDATE: PostgreSQL
--     evaluates it on the newest committed version of the row, after
--     waiting for a concurrent acquirer (a speculative insert) or for a
--     fenced write that holds the row FOR SHARE. Only when it holds is a
--     new token taken (next_lease_token inside the SET), so concurrent
--     acquirers of a free lease get exactly one winner.
--   * Tokens come from pgquota.next_lease_token(): (epoch << 40) + a value
--     of one sequence, the epoch growing with the WAL timeline, so tokens
--     strictly increase across all acquisitions, deleted rows, crashes and
--     promotions of a standby (migrations/00007_token_epoch.sql). A
--     proposed insert that turns into the conflict path takes a value it
--     does not use: a gap, which is allowed.
--   * pgquota.durable_commit() makes the commit wait for the WAL flush even
--     under synchronous_commit = off, so a reported acquire survives a crash
--     and its token is never issued again. Renew and release call it too,
--     fenced writes through pgquota.fence_admit.
--   * A proposed insert takes its token before the insert meets a conflict,
--     so it first takes a transaction-level advisory lock on the name
--     (released at commit: no session state). Without it, another
--     acquisition of the name could come in between, its row be deleted
--     (a cleanup of expired leases), and the insert land with a token older
--     than that acquisition's. The lock is only taken when an insert is
--     proposed, that is when the lease looked free.
--
--   * The lease's name is also a fence resource: taking the lease with
--     token T raises that resource's highest token seen (pgquota.fence) to
--     T in the same statement, so from the moment the lease is taken no
--     write carrying an older token lands on the resource (a fenced row, or
--     a table whose guard uses that resource), even before the new holder
--     writes anything (the guarantee that a stale holder never writes). The lease row is locked
--     before the fence row, the order pgquota.fence_admit uses too.
--
--   * Every time written (acquired_at, renewed_at, expires_at) and db_now
--     are read from the database clock after the statement's last wait, so
--     a lease taken after a wait (for a fenced write's FOR SHARE lock on
--     the row, or for another acquirer's advisory lock) lasts @ttl from
--     when it was taken, not from when the statement began, and is never
--     reported held with an expiry already past. An insert reads its time
--     (inserted_at) in its target list after the token, that is after the
--     advisory lock; ON CONFLICT DO UPDATE reads its own (taken_at) in its
--     WHERE and SET, which PostgreSQL evaluates after it has locked the
--     conflicting row. Each is one reading (a CTE, read once) shared by the
--     columns, so expires_at - renewed_at is exactly @ttl. db_now is read
--     in RETURNING, after the write. (c.at, read at the start, only serves
--     the NOT EXISTS pre-check and the fence row's updated_at.)
--
-- The first row (taken) is the lease after the call. When the lease was not
-- taken, a second form of the answer comes back: taken = false and the
-- current row read with a fresh snapshot (none when the row vanished
-- meanwhile: try again).
-- The statement is pgquota.lease_acquire (migrations/00022_app_role_lockdown.sql),
-- SECURITY DEFINER: the calling role needs EXECUTE on it, no table privilege.
SELECT r.taken::boolean AS taken,
       r.name::text AS name,
       r.holder::text AS holder,
       r.attempt::text AS attempt,
       r.token::bigint AS token,
       r.acquired_at::timestamptz AS acquired_at,
       r.renewed_at::timestamptz AS renewed_at,
       r.expires_at::timestamptz AS expires_at,
       r.db_now::timestamptz AS db_now
FROM pgquota.lease_acquire(@ttl::interval, @name::text, @holder::text, @attempt::text) r;

-- name: LeaseRenew :one
-- Extends the lease to @ttl from the database clock, only
-- while it is held with @token: a deposed holder can never extend its
-- successor's lease, and an expired lease stays expired. The token is kept.
--
-- The clock is read after the row lock is taken. The locked CTE locks the
-- row first (FOR NO KEY UPDATE, the lock the UPDATE itself takes, waiting
-- for a fenced write's FOR SHARE or any other lock), and c reads
-- pgquota.clock() from locked's row, so only once the lock is held. A value
-- read before the wait would be stale: PostgreSQL re-evaluates an UPDATE's
-- WHERE and SET only when the row was changed meanwhile (EvalPlanQual, the
-- manual, 13.2.1), not after a wait for a lock that changed nothing, and a
-- FROM subquery read at the start is never re-read. The expiry check
-- (l.expires_at > c.at) and the new expiry both use that one reading, which
-- also comes back as db_now. prev_expires_at is the expiry the renewal
-- found once it held the lock (the newest row version, as FOR NO KEY UPDATE
-- returns it after a wait): prev_expires_at - db_now is the time the lease
-- had left when the renewal landed (the keepalive margin metric).
-- The statement is pgquota.lease_renew (migrations/00022_app_role_lockdown.sql),
-- SECURITY DEFINER: the calling role needs EXECUTE on it, no table privilege.
SELECT r.name::text AS name,
       r.holder::text AS holder,
       r.attempt::text AS attempt,
       r.token::bigint AS token,
       r.acquired_at::timestamptz AS acquired_at,
       r.renewed_at::timestamptz AS renewed_at,
       r.expires_at::timestamptz AS expires_at,
       r.db_now::timestamptz AS db_now,
       r.prev_expires_at::timestamptz AS prev_expires_at
FROM pgquota.lease_renew(@name::text, @token::bigint, @ttl::interval) r;

-- name: LeaseRelease :one
-- Ends the lease held with @token now, conditioned on the token so that a
-- deposed holder cannot end its successor's lease. The row is kept, expired,
-- so the last holder and token stay visible; releasing twice is harmless.
-- pgquota.lease_notify_waiters wakes waiters (AcquireWait) listening on
-- channel pgquota_lease when the transaction commits, the payload being the
-- lease name, but only when a waiter is registered for the lease: NOTIFY
-- takes a database-wide lock at commit, which serialised every release
-- behind the WAL flush of the one before (migrations/00013_lease_waiter.sql
-- says why no wake-up is lost).
-- The statement is pgquota.lease_release (migrations/00022_app_role_lockdown.sql),
-- SECURITY DEFINER: the calling role needs EXECUTE on it, no table privilege.
SELECT r.name::text AS name,
       r.holder::text AS holder,
       r.attempt::text AS attempt,
       r.token::bigint AS token,
       r.acquired_at::timestamptz AS acquired_at,
       r.renewed_at::timestamptz AS renewed_at,
       r.expires_at::timestamptz AS expires_at,
       r.db_now::timestamptz AS db_now,
       r.notified::boolean AS notified
FROM pgquota.lease_release(@name::text, @token::bigint) r;

-- name: LeaseGet :one
SELECT l.name, l.holder, l.attempt, l.token, l.acquired_at, l.renewed_at, l.expires_at, c.at AS db_now
FROM pgquota.lease l, (SELECT pgquota.clock() AS at) c
WHERE l.name = @name::text;
