-- Quotas: definitions, per-member limit overrides and usage counters per window.
--
-- The schema itself is created by pgquota's migrator before goose runs, because
-- goose keeps its version table (pgquota.goose_db_version) inside it. The
-- statement below is repeated so that sqlc, which reads these files as the
-- schema, knows about it.

-- +goose Up
CREATE SCHEMA IF NOT EXISTS pgquota;

-- pgquota.clock is the one clock every expiry and window boundary is read
-- from: the database's clock_timestamp(), which keeps moving inside a long
-- transaction (now() would freeze at the transaction's start).
-- +goose StatementBegin
CREATE FUNCTION pgquota.clock() RETURNS timestamptz
    LANGUAGE sql VOLATILE PARALLEL SAFE
    AS $$ SELECT clock_timestamp() $$;
-- +goose StatementEnd

-- pgquota.local_instant returns the first instant at which the wall clock
-- in the IANA time zone tz shows local. For a wall time that does not exist
-- (skipped by a spring-forward change) it returns the instant the clock
-- jumps past it, as "local AT TIME ZONE tz" does. For a wall time that
-- happens twice (a fall-back change) it returns the first of the two, where
-- "local AT TIME ZONE tz" returns the second: in America/Havana the clock
-- goes back from 01:00 to 00:00, so local midnight happens twice and a day
-- must start at the first one. The earlier candidate uses the UTC offset in
-- force three hours before the later one (before any change of up to three
-- hours), and is taken only when the wall clock really shows local then.
-- +goose StatementBegin
CREATE FUNCTION pgquota.local_instant(local timestamp, tz text) RETURNS timestamptz
    LANGUAGE sql STABLE PARALLEL SAFE
    AS $$
    SELECT CASE
        WHEN (local - (((local AT TIME ZONE tz) - interval '3 hours') AT TIME ZONE tz
                      - ((local AT TIME ZONE tz) - interval '3 hours') AT TIME ZONE 'UTC')) AT TIME ZONE 'UTC'
             < (local AT TIME ZONE tz)
         AND ((local - (((local AT TIME ZONE tz) - interval '3 hours') AT TIME ZONE tz
                       - ((local AT TIME ZONE tz) - interval '3 hours') AT TIME ZONE 'UTC')) AT TIME ZONE 'UTC')
             AT TIME ZONE tz = local
        THEN (local - (((local AT TIME ZONE tz) - interval '3 hours') AT TIME ZONE tz
                      - ((local AT TIME ZONE tz) - interval '3 hours') AT TIME ZONE 'UTC')) AT TIME ZONE 'UTC'
        ELSE local AT TIME ZONE tz
    END
$$;
-- +goose StatementEnd

-- pgquota.window_start returns the start of the window of kind unit that
-- contains the instant at, in the IANA time zone tz. Day, week (ISO, starting
-- Monday) and month windows start at local midnight (its first occurrence,
-- see pgquota.local_instant), so a day window is 23 or 25 hours long on a
-- daylight-saving change day. Hour windows are cut at the local hour but
-- measured in absolute time, so the repeated hour of a fall-back night is two
-- distinct one-hour windows. (In the one zone whose clock changes by half an
-- hour, Australia/Lord_Howe, the hour windows next to a change overlap by
-- half an hour.) 'none' is a lifetime window: -infinity to infinity.
-- +goose StatementBegin
CREATE FUNCTION pgquota.window_start(unit text, tz text, at timestamptz) RETURNS timestamptz
    LANGUAGE sql STABLE PARALLEL SAFE
    AS $$
    SELECT CASE unit
        WHEN 'none' THEN '-infinity'::timestamptz
        WHEN 'hour' THEN at - ((at AT TIME ZONE tz) - date_trunc('hour', at AT TIME ZONE tz))
        ELSE pgquota.local_instant(date_trunc(unit, at AT TIME ZONE tz), tz)
    END
$$;
-- +goose StatementEnd

-- pgquota.window_end returns the exclusive end of the window that
-- pgquota.window_start(unit, tz, at) starts; the end of one window is the
-- start of the next.
-- +goose StatementBegin
CREATE FUNCTION pgquota.window_end(unit text, tz text, at timestamptz) RETURNS timestamptz
    LANGUAGE sql STABLE PARALLEL SAFE
    AS $$
    SELECT CASE unit
        WHEN 'none' THEN 'infinity'::timestamptz
        WHEN 'hour' THEN at - ((at AT TIME ZONE tz) - date_trunc('hour', at AT TIME ZONE tz)) + interval '1 hour'
        ELSE pgquota.local_instant(date_trunc(unit, at AT TIME ZONE tz) + ('1 ' || unit)::interval, tz)
    END
$$;
-- +goose StatementEnd

CREATE TABLE pgquota.quota (
    name          text        NOT NULL PRIMARY KEY,
    window_unit   text        NOT NULL,
    time_zone     text        NOT NULL DEFAULT 'UTC',
    default_limit bigint,
    created_at    timestamptz NOT NULL DEFAULT clock_timestamp(),
    updated_at    timestamptz NOT NULL DEFAULT clock_timestamp(),
    CONSTRAINT quota_name_length CHECK (octet_length(name) BETWEEN 1 AND 255),
    CONSTRAINT quota_window_unit CHECK (window_unit IN ('none', 'hour', 'day', 'week', 'month')),
    CONSTRAINT quota_time_zone_length CHECK (octet_length(time_zone) BETWEEN 1 AND 255),
    CONSTRAINT quota_default_limit_nonnegative CHECK (default_limit >= 0)
);

CREATE TABLE pgquota.quota_override (
    quota_name  text        NOT NULL REFERENCES pgquota.quota (name) ON DELETE CASCADE,
    member      text        NOT NULL,
    limit_value bigint      NOT NULL,
    updated_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (quota_name, member),
    CONSTRAINT quota_override_member_length CHECK (octet_length(member) BETWEEN 1 AND 255),
    CONSTRAINT quota_override_limit_nonnegative CHECK (limit_value >= 0)
);

-- One counter per (quota, member, window). The window's end is part of the key
-- so that redefining a quota's window (day to hour, say) starts fresh counters
-- instead of continuing one whose window starts at the same instant.
CREATE TABLE pgquota.usage (
    quota_name   text        NOT NULL REFERENCES pgquota.quota (name) ON DELETE CASCADE,
    member       text        NOT NULL,
    window_start timestamptz NOT NULL,
    window_end   timestamptz NOT NULL,
    used         bigint      NOT NULL,
    updated_at   timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (quota_name, member, window_start, window_end),
    CONSTRAINT usage_member_length CHECK (octet_length(member) BETWEEN 1 AND 255),
    CONSTRAINT usage_used_nonnegative CHECK (used >= 0),
    CONSTRAINT usage_window_order CHECK (window_start < window_end)
);

-- pgquota.usage_used_fresh returns the units used in one counter, read with a
-- fresh snapshot. A grant calls it only on a denial, so that the usage it
-- reports includes a concurrent grant that committed while the denied
-- statement ran: in READ COMMITTED a VOLATILE function takes a new snapshot
-- for each query it runs, while the calling statement keeps its own (the
-- PostgreSQL manual, "Function Volatility Categories"). It is never used as a
-- guard; every guard sits in the WHERE clause of the row being updated.
-- +goose StatementBegin
CREATE FUNCTION pgquota.usage_used_fresh(
    p_quota_name text, p_member text, p_window_start timestamptz, p_window_end timestamptz
) RETURNS bigint
    LANGUAGE plpgsql VOLATILE
    AS $$
BEGIN
    RETURN coalesce((
        SELECT u.used FROM pgquota.usage u
        WHERE u.quota_name = p_quota_name AND u.member = p_member
          AND u.window_start = p_window_start AND u.window_end = p_window_end
    ), 0);
END
$$;
-- +goose StatementEnd

-- +goose Down
DROP FUNCTION pgquota.usage_used_fresh(text, text, timestamptz, timestamptz);
DROP TABLE pgquota.usage;
DROP TABLE pgquota.quota_override;
DROP TABLE pgquota.quota;
DROP FUNCTION pgquota.window_end(text, text, timestamptz);
DROP FUNCTION pgquota.window_start(text, text, timestamptz);
DROP FUNCTION pgquota.local_instant(timestamp, text);
DROP FUNCTION pgquota.clock();
