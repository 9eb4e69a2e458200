-- Batched grants that decide on the counter version they locked, and one
-- fresh snapshot for a code claim that got nothing.

-- +goose Up

-- pgquota.usage_grant_batch grants a batch of requests: the body of
-- queries/usage_batch.sql (UsageGrantBatch), which documents its arguments.
-- Counter i is quota p_quota_names[i] of member p_members[i] (each pair at
-- most once); its requests are elements p_firsts[i] .. p_firsts[i] +
-- p_counts[i] - 1 of p_amounts (units) and p_limits (the call's limit, -1
-- for none), decided one after another in array order by
-- pgquota.greedy_take, as if each were a UsageGrant run in that order.
--
-- It returns one row per counter whose quota exists (none for the others):
-- the limit of requests that gave none (implicit_limit, NULL when there is
-- none), the window that holds the database clock's instant (read once for
-- the whole call), and either written = true with the counter before and
-- after this call's write (the caller replays each request's outcome from
-- used_before), or written = false when no request of the batch fitted,
-- with used_before = used_after = the counter read with a fresh snapshot.
--
-- Why it is exact (every guard on the row being written, READ COMMITTED,
-- the PostgreSQL manual, section 13.2.1):
--   * cur locks, in key order, each existing counter whose value has room
--     for at least one request. A locking read that meets a row changed by
--     a concurrent transaction waits for it and re-checks its WHERE clause
--     against the newest committed version, and RETURNS that version; the
--     row stays locked until this transaction ends. So cur.used is the
--     counter's current value, and no later change can slip in.
--   * upd writes exactly the rows cur locked, joined on their key only. Its
--     scan finds the version in the statement's snapshot; when that is not
--     the newest, the update re-evaluates SET on the newest version (the
--     one cur locked). Nothing that can change (used) is compared in a
--     join or WHERE clause: a comparison of the locked value with the
--     snapshot's would drop the row before the update ever re-reads it,
--     which is how the statement this function replaces wrote nothing after
--     every lock wait. used_before is cur.used: the version written.
--   * ins creates the counters missing from the snapshot, in key order.
--     When a concurrent transaction inserted one meanwhile, ON CONFLICT DO
--     NOTHING waits for it and writes nothing (before PostgreSQL 18,
--     RETURNING cannot show the value an ON CONFLICT DO UPDATE started
--     from, and the replay needs it). Those counters go round again in
--     this function: the next statement takes a new snapshot, which holds
--     the committed row, so cur locks it. Under REPEATABLE READ or
--     SERIALIZABLE the conflict fails with SQLSTATE 40001 instead (the
--     whole call rolls back; pgquota retries it where it owns the
--     transaction), so the loop cannot spin there either.
--   * A counter whose value has no room is not locked, like UsageGrant's
--     UPDATE whose WHERE clause fails; its fresh value is reported.
-- The loop ends when every counter is decided: a counter goes round again
-- only when another transaction created it during this statement, and the
-- next round sees it (only a concurrent DELETE of counter rows could send
-- it round once more).
--
-- #variable_conflict use_column: the OUT columns share names with table
-- columns; every query below qualifies its columns anyway.
-- +goose StatementBegin
CREATE FUNCTION pgquota.usage_grant_batch(
    p_quota_names text[], p_members text[], p_firsts integer[], p_counts integer[],
    p_amounts bigint[], p_limits bigint[]
) RETURNS TABLE (
    counter_index      integer,
    implicit_limit     bigint,
    window_start       timestamptz,
    window_end         timestamptz,
    written            boolean,
    used_before        bigint,
    used_after         bigint
)
    LANGUAGE plpgsql VOLATILE
    AS $$
#variable_conflict use_column
DECLARE
    v_at    timestamptz := pgquota.clock();
    v_todo  integer[] := array(SELECT generate_series(1, coalesce(cardinality(p_quota_names), 0)));
    v_again integer[];
    r       record;
BEGIN
    WHILE cardinality(v_todo) > 0 LOOP
        v_again := '{}';
        FOR r IN
            WITH grp AS (
                SELECT t.i,
                       p_quota_names[t.i] AS quota_name,
                       p_members[t.i] AS member,
                       p_amounts[p_firsts[t.i] : p_firsts[t.i] + p_counts[t.i] - 1] AS amounts,
                       p_limits[p_firsts[t.i] : p_firsts[t.i] + p_counts[t.i] - 1] AS limits
                FROM unnest(v_todo) AS t(i)
            ), gdef AS MATERIALIZED (
                SELECT g.i, g.quota_name, g.member, g.amounts, g.limits,
                       coalesce(o.limit_value, q.default_limit) AS implicit_limit,
                       pgquota.window_start(q.window_unit, q.time_zone, v_at) AS window_start,
                       pgquota.window_end(q.window_unit, q.time_zone, v_at) AS window_end
                FROM grp g
                JOIN pgquota.quota q ON q.name = g.quota_name
                LEFT JOIN pgquota.quota_override o ON o.quota_name = g.quota_name AND o.member = g.member
            ), snap AS MATERIALIZED (
                -- The counters in this statement's snapshot: which exist,
                -- and what a denial reports. Never a guard.
                SELECT g.i, u.used
                FROM gdef g
                JOIN pgquota.usage u ON u.quota_name = g.quota_name
                                    AND u.member = g.member
                                    AND u.window_start = g.window_start
                                    AND u.window_end = g.window_end
            ), cur AS (
                SELECT g.i, u.quota_name, u.member, u.window_start, u.window_end, u.used,
                       g.amounts, g.limits, g.implicit_limit
                FROM gdef g
                JOIN pgquota.usage u ON u.quota_name = g.quota_name
                                    AND u.member = g.member
                                    AND u.window_start = g.window_start
                                    AND u.window_end = g.window_end
                WHERE pgquota.greedy_take(u.used, g.amounts, g.limits, g.implicit_limit) > 0
                ORDER BY u.quota_name, u.member, u.window_start, u.window_end
                FOR NO KEY UPDATE OF u
            ), upd AS (
                UPDATE pgquota.usage u
                SET used = u.used + pgquota.greedy_take(u.used, c.amounts, c.limits, c.implicit_limit),
                    updated_at = v_at
                FROM cur c
                WHERE u.quota_name = c.quota_name
                  AND u.member = c.member
                  AND u.window_start = c.window_start
                  AND u.window_end = c.window_end
                RETURNING c.i, c.used AS used_before, u.used AS used_after
            ), ins AS (
                INSERT INTO pgquota.usage AS u (quota_name, member, window_start, window_end, used, updated_at)
                SELECT g.quota_name, g.member, g.window_start, g.window_end,
                       pgquota.greedy_take(0, g.amounts, g.limits, g.implicit_limit), v_at
                FROM gdef g
                WHERE pgquota.greedy_take(0, g.amounts, g.limits, g.implicit_limit) > 0
                  AND NOT EXISTS (SELECT 1 FROM snap s WHERE s.i = g.i)
                ORDER BY g.quota_name, g.member
                ON CONFLICT (quota_name, member, window_start, window_end) DO NOTHING
                RETURNING u.quota_name, u.member, u.used
            )
            SELECT g.i, g.implicit_limit, g.window_start, g.window_end,
                   upd.used_before AS upd_before, upd.used_after AS upd_after,
                   ins.used AS ins_used,
                   (upd.i IS NULL AND ins.used IS NULL AND s.i IS NULL
                    AND pgquota.greedy_take(0, g.amounts, g.limits, g.implicit_limit) > 0) AS again,
                   (CASE WHEN upd.i IS NULL AND ins.used IS NULL
                         THEN pgquota.usage_used_fresh(g.quota_name, g.member, g.window_start, g.window_end)
                    END) AS fresh_used
            FROM gdef g
            LEFT JOIN snap s ON s.i = g.i
            LEFT JOIN upd ON upd.i = g.i
            LEFT JOIN ins ON ins.quota_name = g.quota_name AND ins.member = g.member
        LOOP
            IF r.again THEN
                v_again := v_again || r.i;
                CONTINUE;
            END IF;
            counter_index := r.i;
            implicit_limit := r.implicit_limit;
            window_start := r.window_start;
            window_end := r.window_end;
            written := r.upd_before IS NOT NULL OR r.ins_used IS NOT NULL;
            used_before := coalesce(r.upd_before, CASE WHEN r.ins_used IS NOT NULL THEN 0 END, r.fresh_used);
            used_after := coalesce(r.upd_after, r.ins_used, r.fresh_used);
            RETURN NEXT;
        END LOOP;
        v_todo := v_again;
    END LOOP;
END
$$;
-- +goose StatementEnd

-- pgquota.voucher_code_state_fresh reads, with ONE fresh snapshot (see
-- pgquota.usage_used_fresh), the code a member holds in a campaign and
-- whether any unclaimed code is left. A code claim that handed out nothing
-- calls it to tell "you hold this code" from "codes are left but locked"
-- from "sold out". Both answers must come from the same snapshot: read one
-- after the other, a duplicate claim of the same member that commits the
-- last code between the two reads would be seen neither as the member's
-- code (read before) nor as an unclaimed one (read after), and the member
-- would be told the campaign is sold out. With one snapshot, that claim
-- either committed before it (the member's code) or not (the code is still
-- unclaimed: codes_left, try again). Never a guard.
-- +goose StatementBegin
CREATE FUNCTION pgquota.voucher_code_state_fresh(p_campaign text, p_member text)
    RETURNS TABLE (held_code text, held_since timestamptz, codes_left boolean)
    LANGUAGE plpgsql VOLATILE
    AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    SELECT c.code, c.claimed_at,
           EXISTS (SELECT 1 FROM pgquota.voucher_code v
                   WHERE v.campaign = p_campaign AND v.member IS NULL)
    FROM (SELECT 1) one
    LEFT JOIN pgquota.voucher_claim c ON c.campaign = p_campaign AND c.member = p_member;
END
$$;
-- +goose StatementEnd

-- +goose Down
DROP FUNCTION pgquota.voucher_code_state_fresh(text, text);
DROP FUNCTION pgquota.usage_grant_batch(text[], text[], integer[], integer[], bigint[], bigint[]);
