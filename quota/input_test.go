package quota_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/internal/pgtest"
	"github.com/pgquota/pgquota/migrations"
	"github.com/pgquota/pgquota/quota"
	"github.com/pgquota/pgquota/quota/voucher"
)

// snapshot returns a digest of every row of every table in the pgquota
// schema, so that a test can tell that a call wrote nothing at all: no row
// added, removed or changed. It reads as the owner: no other role may read
// pgquota.fence_secret.
func (b *testBundle) snapshot(t *testing.T) map[string]string {
	t.Helper()
	rows, err := b.owner.Query(b.ctx, `SELECT tablename FROM pg_tables WHERE schemaname = 'pgquota' ORDER BY 1`)
	require.NoError(t, err)
	tables, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Contains(t, tables, "usage")
	out := map[string]string{}
	for _, table := range tables {
		var digest string
		err := b.owner.QueryRow(b.ctx, `
			SELECT count(*) || ':' || coalesce(md5(string_agg(t::text, '|' ORDER BY t::text)), '')
			FROM pgquota.`+pgx.Identifier{table}.Sanitize()+` t`).Scan(&digest)
		require.NoError(t, err)
		out[table] = digest
	}
	return out
}

// Bad values for every identifier-like argument, and the reason each is bad.
var badNames = []struct{ name, value string }{
	{"empty", ""},
	{"256 bytes", strings.Repeat("a", 256)},
	{"256 bytes of 2-byte runes", strings.Repeat("é", 128)},
	{"NUL byte", "a\x00b"},
	{"tab", "a\tb"},
	{"newline", "a\nb"},
	{"escape sequence", "\x1b[31mred"},
	{"DEL", "a\x7f"},
	{"C1 control", "a\u0085b"},
	{"invalid UTF-8", "a\xffb"},
	{"truncated UTF-8", "\xc3"},
}

// inputCase is one call that must be rejected: err must match want, an
// *InputError must name field (when field is not ""), and nothing may be
// written.
type inputCase struct {
	name  string
	call  func(ctx context.Context, c *quota.Client, tx pgx.Tx) error
	want  error
	field string
}

// nameCases builds one case per bad value for an identifier argument.
func nameCases(call, field string, fn func(v string) func(context.Context, *quota.Client, pgx.Tx) error) []inputCase {
	var out []inputCase
	for _, bad := range badNames {
		out = append(out, inputCase{
			name:  fmt.Sprintf("%s/%s %s", call, field, bad.name),
			call:  fn(bad.value),
			want:  quota.ErrInvalidInput,
			field: field,
		})
	}
	return out
}

// operatorCall names the Client methods that are operator work (the
// 'pgquota_operator' rows of pgquota.function_grant).
var operatorCall = map[string]bool{
	"DefineQuota": true, "DefineQuotaTx": true, "SetMemberLimit": true, "SetMemberLimitTx": true,
	"ClearMemberLimit": true, "ClearMemberLimitTx": true, "CreateCampaign": true, "CreateCampaignTx": true,
	"CreateShardedCampaign": true, "CreateShardedCampaignTx": true, "ImportCodes": true, "ImportCodesTx": true,
	"BumpLeaseEpoch": true, "GuardTable": true, "GuardTableTx": true, "ReapLeases": true, "ReapLedger": true,
}

func TestBadInput(t *testing.T) {
	t.Parallel()
	b := setup(t, 4)

	// Some state, so that "nothing written" is checked against tables that
	// hold rows of every kind.
	b.define(t, quota.Definition{Name: "q", Window: quota.WindowDay})
	b.define(t, quota.Definition{Name: "lim", Window: quota.WindowHour, TimeZone: "Europe/Berlin", DefaultLimit: ptr[int64](5)})
	_, err := b.operator.SetMemberLimit(b.ctx, "lim", "vip", 9)
	require.NoError(t, err)
	_, err = b.client.Grant(b.ctx, quota.GrantRequest{Quota: "lim", Member: "m", Amount: 2})
	require.NoError(t, err)
	_, err = voucherOf(t, b.operator).CreateCampaign(b.ctx, "pool", 3)
	require.NoError(t, err)
	_, err = voucherOf(t, b.client).Claim(b.ctx, voucher.ClaimRequest{Campaign: "pool", Member: "m"})
	require.NoError(t, err)
	_, err = voucherOf(t, b.operator).ImportCodes(b.ctx, "codes", []string{"c1", "c2", "c3"})
	require.NoError(t, err)
	_, err = voucherOf(t, b.client).Claim(b.ctx, voucher.ClaimRequest{Campaign: "codes", Member: "m"})
	require.NoError(t, err)

	type call = func(context.Context, *quota.Client, pgx.Tx) error
	grant := func(req quota.GrantRequest) call {
		return func(ctx context.Context, c *quota.Client, _ pgx.Tx) error { _, err := c.Grant(ctx, req); return err }
	}
	grantTx := func(req quota.GrantRequest) call {
		return func(ctx context.Context, c *quota.Client, tx pgx.Tx) error {
			_, err := c.GrantTx(ctx, tx, req)
			return err
		}
	}
	revoke := func(req quota.RevokeRequest) call {
		return func(ctx context.Context, c *quota.Client, _ pgx.Tx) error { _, err := c.Revoke(ctx, req); return err }
	}
	revokeTx := func(req quota.RevokeRequest) call {
		return func(ctx context.Context, c *quota.Client, tx pgx.Tx) error {
			_, err := c.RevokeTx(ctx, tx, req)
			return err
		}
	}
	define := func(d quota.Definition) call {
		return func(ctx context.Context, c *quota.Client, _ pgx.Tx) error {
			_, err := c.DefineQuota(ctx, d)
			return err
		}
	}
	defineTx := func(d quota.Definition) call {
		return func(ctx context.Context, c *quota.Client, tx pgx.Tx) error {
			_, err := c.DefineQuotaTx(ctx, tx, d)
			return err
		}
	}
	setLimit := func(q, m string, limit int64) call {
		return func(ctx context.Context, c *quota.Client, _ pgx.Tx) error {
			_, err := c.SetMemberLimit(ctx, q, m, limit)
			return err
		}
	}
	setLimitTx := func(q, m string, limit int64) call {
		return func(ctx context.Context, c *quota.Client, tx pgx.Tx) error {
			_, err := c.SetMemberLimitTx(ctx, tx, q, m, limit)
			return err
		}
	}
	clearLimit := func(q, m string) call {
		return func(ctx context.Context, c *quota.Client, _ pgx.Tx) error {
			_, err := c.ClearMemberLimit(ctx, q, m)
			return err
		}
	}
	clearLimitTx := func(q, m string) call {
		return func(ctx context.Context, c *quota.Client, tx pgx.Tx) error {
			_, err := c.ClearMemberLimitTx(ctx, tx, q, m)
			return err
		}
	}
	createPool := func(campaign string, total int64) call {
		return func(ctx context.Context, c *quota.Client, _ pgx.Tx) error {
			_, err := voucherOf(t, c).CreateCampaign(ctx, campaign, total)
			return err
		}
	}
	createPoolTx := func(campaign string, total int64) call {
		return func(ctx context.Context, c *quota.Client, tx pgx.Tx) error {
			_, err := voucherOf(t, c).CreateCampaignTx(ctx, tx, campaign, total)
			return err
		}
	}
	importCodes := func(campaign string, codes []string) call {
		return func(ctx context.Context, c *quota.Client, _ pgx.Tx) error {
			_, err := voucherOf(t, c).ImportCodes(ctx, campaign, codes)
			return err
		}
	}
	importCodesTx := func(campaign string, codes []string) call {
		return func(ctx context.Context, c *quota.Client, tx pgx.Tx) error {
			_, err := voucherOf(t, c).ImportCodesTx(ctx, tx, campaign, codes)
			return err
		}
	}

	var cases []inputCase
	add := func(cs ...inputCase) { cases = append(cases, cs...) }

	// Identifiers, for every call that takes one.
	add(nameCases("DefineQuota", "quota name", func(v string) call { return define(quota.Definition{Name: v, Window: quota.WindowDay}) })...)
	add(nameCases("DefineQuotaTx", "quota name", func(v string) call { return defineTx(quota.Definition{Name: v, Window: quota.WindowDay}) })...)
	add(nameCases("Quota", "quota name", func(v string) call {
		return func(ctx context.Context, c *quota.Client, _ pgx.Tx) error { _, err := c.Quota(ctx, v); return err }
	})...)
	add(nameCases("Grant", "quota name", func(v string) call {
		return grant(quota.GrantRequest{Quota: v, Member: "m", Amount: 1, Limit: ptr[int64](5)})
	})...)
	add(nameCases("Grant", "member", func(v string) call { return grant(quota.GrantRequest{Quota: "lim", Member: v, Amount: 1}) })...)
	add(nameCases("GrantTx", "member", func(v string) call { return grantTx(quota.GrantRequest{Quota: "lim", Member: v, Amount: 1}) })...)
	add(nameCases("Revoke", "quota name", func(v string) call { return revoke(quota.RevokeRequest{Quota: v, Member: "m", Amount: 1}) })...)
	add(nameCases("Revoke", "member", func(v string) call { return revoke(quota.RevokeRequest{Quota: "lim", Member: v, Amount: 1}) })...)
	add(nameCases("RevokeTx", "member", func(v string) call { return revokeTx(quota.RevokeRequest{Quota: "lim", Member: v, Amount: 1}) })...)
	add(nameCases("Usage", "quota name", func(v string) call {
		return func(ctx context.Context, c *quota.Client, _ pgx.Tx) error { _, err := c.Usage(ctx, v, "m"); return err }
	})...)
	add(nameCases("Usage", "member", func(v string) call {
		return func(ctx context.Context, c *quota.Client, _ pgx.Tx) error {
			_, err := c.Usage(ctx, "lim", v)
			return err
		}
	})...)
	add(nameCases("SetMemberLimit", "quota name", func(v string) call { return setLimit(v, "m", 1) })...)
	add(nameCases("SetMemberLimit", "member", func(v string) call { return setLimit("lim", v, 1) })...)
	add(nameCases("SetMemberLimitTx", "member", func(v string) call { return setLimitTx("lim", v, 1) })...)
	add(nameCases("ClearMemberLimit", "quota name", func(v string) call { return clearLimit(v, "vip") })...)
	add(nameCases("ClearMemberLimit", "member", func(v string) call { return clearLimit("lim", v) })...)
	add(nameCases("ClearMemberLimitTx", "member", func(v string) call { return clearLimitTx("lim", v) })...)
	add(nameCases("MemberLimits", "quota name", func(v string) call {
		return func(ctx context.Context, c *quota.Client, _ pgx.Tx) error {
			_, err := c.MemberLimits(ctx, v)
			return err
		}
	})...)
	add(nameCases("CreateCampaign", "campaign", func(v string) call { return createPool(v, 5) })...)
	add(nameCases("CreateCampaignTx", "campaign", func(v string) call { return createPoolTx(v, 5) })...)
	add(nameCases("Campaign", "campaign", func(v string) call {
		return func(ctx context.Context, c *quota.Client, _ pgx.Tx) error {
			_, err := voucherOf(t, c).Campaign(ctx, v)
			return err
		}
	})...)
	add(nameCases("Claim counted", "campaign", func(v string) call {
		return func(ctx context.Context, c *quota.Client, _ pgx.Tx) error {
			_, err := voucherOf(t, c).Claim(ctx, voucher.ClaimRequest{Campaign: v, Member: "new"})
			return err
		}
	})...)
	add(nameCases("Claim counted", "member", func(v string) call {
		return func(ctx context.Context, c *quota.Client, _ pgx.Tx) error {
			_, err := voucherOf(t, c).Claim(ctx, voucher.ClaimRequest{Campaign: "pool", Member: v})
			return err
		}
	})...)
	add(nameCases("ClaimTx counted", "member", func(v string) call {
		return func(ctx context.Context, c *quota.Client, tx pgx.Tx) error {
			_, err := voucherOf(t, c).ClaimTx(ctx, tx, voucher.ClaimRequest{Campaign: "pool", Member: v})
			return err
		}
	})...)
	add(nameCases("Claim codes", "campaign", func(v string) call {
		return func(ctx context.Context, c *quota.Client, _ pgx.Tx) error {
			_, err := voucherOf(t, c).Claim(ctx, voucher.ClaimRequest{Campaign: v, Member: "new"})
			return err
		}
	})...)
	add(nameCases("Claim codes", "member", func(v string) call {
		return func(ctx context.Context, c *quota.Client, _ pgx.Tx) error {
			_, err := voucherOf(t, c).Claim(ctx, voucher.ClaimRequest{Campaign: "codes", Member: v})
			return err
		}
	})...)
	add(nameCases("ClaimTx codes", "member", func(v string) call {
		return func(ctx context.Context, c *quota.Client, tx pgx.Tx) error {
			_, err := voucherOf(t, c).ClaimTx(ctx, tx, voucher.ClaimRequest{Campaign: "codes", Member: v})
			return err
		}
	})...)
	add(nameCases("ImportCodes", "campaign", func(v string) call { return importCodes(v, []string{"new1"}) })...)
	add(nameCases("ImportCodes", "code 2", func(v string) call { return importCodes("codes", []string{"new1", v, "new3"}) })...)
	add(nameCases("ImportCodesTx", "code 1", func(v string) call { return importCodesTx("fresh", []string{v}) })...)
	// The time zone is checked like a name before the database sees it.
	for _, bad := range badNames[1:] { // "" means UTC
		add(inputCase{"DefineQuota/time zone " + bad.name, define(quota.Definition{Name: "new", Window: quota.WindowDay, TimeZone: bad.value}), quota.ErrInvalidInput, "time zone"})
	}

	// Units.
	for _, amount := range []int64{0, -1, -1 << 63, quota.MaxUnits + 1, 1<<63 - 1} {
		add(
			inputCase{fmt.Sprintf("Grant/amount %d", amount), grant(quota.GrantRequest{Quota: "lim", Member: "m", Amount: amount}), quota.ErrInvalidInput, "amount"},
			inputCase{fmt.Sprintf("GrantTx/amount %d", amount), grantTx(quota.GrantRequest{Quota: "lim", Member: "m", Amount: amount}), quota.ErrInvalidInput, "amount"},
			inputCase{fmt.Sprintf("Revoke/amount %d", amount), revoke(quota.RevokeRequest{Quota: "lim", Member: "m", Amount: amount}), quota.ErrInvalidInput, "amount"},
			inputCase{fmt.Sprintf("RevokeTx/amount %d", amount), revokeTx(quota.RevokeRequest{Quota: "lim", Member: "m", Amount: amount}), quota.ErrInvalidInput, "amount"},
			inputCase{fmt.Sprintf("CreateCampaign/total %d", amount), createPool("newpool", amount), quota.ErrInvalidInput, "total"},
			inputCase{fmt.Sprintf("CreateCampaignTx/total %d", amount), createPoolTx("newpool", amount), quota.ErrInvalidInput, "total"},
		)
	}
	for _, limit := range []int64{-1, -1 << 63, quota.MaxUnits + 1, 1<<63 - 1} {
		add(
			inputCase{fmt.Sprintf("Grant/limit %d", limit), grant(quota.GrantRequest{Quota: "lim", Member: "m", Amount: 1, Limit: ptr(limit)}), quota.ErrInvalidInput, "limit"},
			inputCase{fmt.Sprintf("GrantTx/limit %d", limit), grantTx(quota.GrantRequest{Quota: "q", Member: "m", Amount: 1, Limit: ptr(limit)}), quota.ErrInvalidInput, "limit"},
			inputCase{fmt.Sprintf("SetMemberLimit/limit %d", limit), setLimit("lim", "vip", limit), quota.ErrInvalidInput, "limit"},
			inputCase{fmt.Sprintf("SetMemberLimitTx/limit %d", limit), setLimitTx("lim", "new", limit), quota.ErrInvalidInput, "limit"},
			inputCase{fmt.Sprintf("DefineQuota/default limit %d", limit), define(quota.Definition{Name: "lim", Window: quota.WindowDay, DefaultLimit: ptr(limit)}), quota.ErrInvalidInput, "default limit"},
			inputCase{fmt.Sprintf("DefineQuotaTx/default limit %d", limit), defineTx(quota.Definition{Name: "new", Window: quota.WindowDay, DefaultLimit: ptr(limit)}), quota.ErrInvalidInput, "default limit"},
		)
	}

	// Windows and time zones.
	for _, w := range []quota.Window{"", "year", "Day", "DAY", " day", "day ", "minute", "none\x00"} {
		add(inputCase{fmt.Sprintf("DefineQuota/window %q", string(w)), define(quota.Definition{Name: "lim", Window: w}), quota.ErrInvalidInput, "window"})
	}
	for _, tz := range []string{"Mars/Olympus_Mons", "Europe/Berlinn", "Europe/", "CEST+99", "+02:00", "UTC'; DROP TABLE pgquota.quota; --", "Europe/Berlin "} {
		add(
			inputCase{fmt.Sprintf("DefineQuota/time zone %q", tz), define(quota.Definition{Name: "lim", Window: quota.WindowDay, TimeZone: tz}), quota.ErrInvalidInput, "time zone"},
			inputCase{fmt.Sprintf("DefineQuotaTx/time zone %q", tz), defineTx(quota.Definition{Name: "new", Window: quota.WindowDay, TimeZone: tz}), quota.ErrInvalidInput, "time zone"},
		)
	}

	// Codes.
	add(
		inputCase{"ImportCodes/nil codes", importCodes("codes", nil), quota.ErrInvalidInput, "codes"},
		inputCase{"ImportCodes/empty codes", importCodes("fresh", []string{}), quota.ErrInvalidInput, "codes"},
		inputCase{"ImportCodesTx/empty codes", importCodesTx("fresh", nil), quota.ErrInvalidInput, "codes"},
	)

	// Things that do not exist.
	add(
		inputCase{"Grant/undefined quota", grant(quota.GrantRequest{Quota: "nope", Member: "m", Amount: 1, Limit: ptr[int64](5)}), quota.ErrQuotaNotFound, ""},
		inputCase{"GrantTx/undefined quota", grantTx(quota.GrantRequest{Quota: "nope", Member: "m", Amount: 1, Limit: ptr[int64](5)}), quota.ErrQuotaNotFound, ""},
		inputCase{"Revoke/undefined quota", revoke(quota.RevokeRequest{Quota: "nope", Member: "m", Amount: 1}), quota.ErrQuotaNotFound, ""},
		inputCase{"RevokeTx/undefined quota", revokeTx(quota.RevokeRequest{Quota: "nope", Member: "m", Amount: 1}), quota.ErrQuotaNotFound, ""},
		inputCase{"Usage/undefined quota", func(ctx context.Context, c *quota.Client, _ pgx.Tx) error {
			_, err := c.Usage(ctx, "nope", "m")
			return err
		}, quota.ErrQuotaNotFound, ""},
		inputCase{"Quota/undefined quota", func(ctx context.Context, c *quota.Client, _ pgx.Tx) error { _, err := c.Quota(ctx, "nope"); return err }, quota.ErrQuotaNotFound, ""},
		inputCase{"SetMemberLimit/undefined quota", setLimit("nope", "m", 1), quota.ErrQuotaNotFound, ""},
		inputCase{"SetMemberLimitTx/undefined quota", setLimitTx("nope", "m", 1), quota.ErrQuotaNotFound, ""},
		inputCase{"MemberLimits/undefined quota", func(ctx context.Context, c *quota.Client, _ pgx.Tx) error {
			_, err := c.MemberLimits(ctx, "nope")
			return err
		}, quota.ErrQuotaNotFound, ""},
		inputCase{"Grant/no limit anywhere", grant(quota.GrantRequest{Quota: "q", Member: "m", Amount: 1}), quota.ErrNoLimit, ""},
		inputCase{"GrantTx/no limit anywhere", grantTx(quota.GrantRequest{Quota: "q", Member: "m", Amount: 1}), quota.ErrNoLimit, ""},
		inputCase{"Claim/undefined campaign", func(ctx context.Context, c *quota.Client, _ pgx.Tx) error {
			_, err := voucherOf(t, c).Claim(ctx, voucher.ClaimRequest{Campaign: "nope", Member: "m"})
			return err
		}, voucher.ErrCampaignNotFound, ""},
		inputCase{"Campaign/undefined campaign", func(ctx context.Context, c *quota.Client, _ pgx.Tx) error {
			_, err := voucherOf(t, c).Campaign(ctx, "nope")
			return err
		}, voucher.ErrCampaignNotFound, ""},
		inputCase{"CreateCampaign/other total", createPool("pool", 4), voucher.ErrCampaignExists, ""},
		inputCase{"CreateCampaign/code campaign", createPool("codes", 3), voucher.ErrCampaignExists, ""},
		inputCase{"ImportCodes/counted pool", importCodes("pool", []string{"x"}), voucher.ErrCampaignExists, ""},
	)

	before := b.snapshot(t)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			// Operator work goes through the operator's client, in its
			// transaction (PGQUOTA_TEST_APP_ROLE=1: b.client's role may not
			// run it).
			c := b.client
			if operatorCall[strings.SplitN(tc.name, "/", 2)[0]] {
				c = b.operator
			}
			// One transaction per case, committed whatever happened, so that
			// a Tx variant that wrote something would be caught too.
			tx, err := c.Pool().Begin(b.ctx)
			require.NoError(t, err)
			callErr := tc.call(b.ctx, c, tx)
			if callErr != nil && sqlStateOf(callErr) != "" {
				require.NoError(t, tx.Rollback(b.ctx))
			} else {
				require.NoError(t, tx.Commit(b.ctx), "a rejected call must leave the caller's transaction usable")
			}

			require.Error(t, callErr)
			require.ErrorIs(t, callErr, tc.want)
			var ie *quota.InputError
			if tc.field != "" {
				require.ErrorAs(t, callErr, &ie)
				require.Equal(t, tc.field, ie.Field)
				require.NotEmpty(t, ie.Reason)
				require.Contains(t, callErr.Error(), tc.field, "the message names the field")
			} else {
				require.False(t, errors.As(callErr, &ie), "%v is not an input error", callErr)
				require.NotErrorIs(t, callErr, quota.ErrInvalidInput)
			}
			require.NotContains(t, callErr.Error(), "\x00")
			require.Equal(t, before, b.snapshot(t), "nothing written")
		})
	}
}

func sqlStateOf(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code
	}
	return ""
}

func TestNewBadConfig(t *testing.T) {
	t.Parallel()
	var ie *quota.InputError
	_, err := quota.New(nil, nil)
	require.ErrorIs(t, err, quota.ErrInvalidInput)
	require.ErrorAs(t, err, &ie)
	require.Equal(t, "pool", ie.Field)

	pool := pgtest.NewPool(t, 1)
	_, err = quota.New(pool, &quota.Config{RetryMaxElapsed: -1})
	require.ErrorIs(t, err, quota.ErrInvalidInput)
	require.ErrorAs(t, err, &ie)
	require.Equal(t, "Config.RetryMaxElapsed", ie.Field)

	client, err := quota.New(pool, nil)
	require.NoError(t, err)
	_, err = voucher.New(client, &voucher.Config{CodeClaimWait: -1})
	require.ErrorIs(t, err, quota.ErrInvalidInput)
	require.ErrorAs(t, err, &ie)
	require.Equal(t, "Config.CodeClaimWait", ie.Field)
	_, err = voucher.New(nil, nil)
	require.ErrorIs(t, err, quota.ErrInvalidInput)
	require.ErrorAs(t, err, &ie)
	require.Equal(t, "client", ie.Field)
}

// Limit 0 is a limit (deny all), not bad input; so are the largest values,
// and 255-byte names.
func TestEdgeValuesAreValid(t *testing.T) {
	t.Parallel()
	b := setup(t, 0)
	long := strings.Repeat("é", 127) + "a" // 255 bytes
	require.Len(t, long, quota.MaxNameBytes)

	b.define(t, quota.Definition{Name: "zero", Window: quota.WindowDay, DefaultLimit: ptr[int64](0)})
	res, err := b.client.Grant(b.ctx, quota.GrantRequest{Quota: "zero", Member: "m", Amount: 1})
	require.NoError(t, err)
	require.False(t, res.Granted)
	require.Zero(t, res.Limit)

	b.define(t, quota.Definition{Name: long, Window: quota.WindowNone})
	_, err = b.operator.SetMemberLimit(b.ctx, long, long, 0)
	require.NoError(t, err)
	res, err = b.client.Grant(b.ctx, quota.GrantRequest{Quota: long, Member: long, Amount: 1})
	require.NoError(t, err)
	require.False(t, res.Granted)
	res, err = b.client.Grant(b.ctx, quota.GrantRequest{Quota: long, Member: long, Amount: 1, Limit: ptr[int64](0)})
	require.NoError(t, err)
	require.False(t, res.Granted)
	require.Zero(t, b.countRows(t, "usage"))

	// The largest amount and limit, and a second grant on a full counter:
	// denied, never an arithmetic overflow.
	res, err = b.client.Grant(b.ctx, quota.GrantRequest{Quota: long, Member: "big", Amount: quota.MaxUnits, Limit: ptr(quota.MaxUnits)})
	require.NoError(t, err)
	require.True(t, res.Granted)
	require.Equal(t, quota.MaxUnits, res.Used)
	for _, amount := range []int64{1, quota.MaxUnits} {
		res, err = b.client.Grant(b.ctx, quota.GrantRequest{Quota: long, Member: "big", Amount: amount, Limit: ptr(quota.MaxUnits)})
		require.NoError(t, err, "amount %d on a counter at MaxUnits", amount)
		require.False(t, res.Granted)
		require.Equal(t, quota.MaxUnits, res.Used)
	}
	// The same through the insert path's conflict arm: a member whose
	// counter is full, granted concurrently, is the hot-row tests' job; here
	// the plain update path must not overflow either.
	rv, err := b.client.Revoke(b.ctx, quota.RevokeRequest{Quota: long, Member: "big", Amount: quota.MaxUnits})
	require.NoError(t, err)
	require.Equal(t, quota.MaxUnits, rv.Revoked)

	_, err = voucherOf(t, b.operator).CreateCampaign(b.ctx, long, quota.MaxUnits)
	require.NoError(t, err)
	c, err := voucherOf(t, b.client).Claim(b.ctx, voucher.ClaimRequest{Campaign: long, Member: long})
	require.NoError(t, err)
	require.True(t, c.Claimed)
	_, err = voucherOf(t, b.operator).ImportCodes(b.ctx, "codes", []string{long})
	require.NoError(t, err)
	c, err = voucherOf(t, b.client).Claim(b.ctx, voucher.ClaimRequest{Campaign: "codes", Member: long})
	require.NoError(t, err)
	require.Equal(t, long, c.Code)
}

// Database errors keep their SQLSTATE, and are not mistaken for bad input.
func TestDatabaseErrorsKeepSQLState(t *testing.T) {
	t.Parallel()
	b := setup(t, 4)
	b.define(t, quota.Definition{Name: "q", Window: quota.WindowDay, DefaultLimit: ptr[int64](5)})
	_, err := voucherOf(t, b.operator).CreateCampaign(b.ctx, "pool", 5)
	require.NoError(t, err)
	_, err = voucherOf(t, b.operator).ImportCodes(b.ctx, "codes", []string{"a"})
	require.NoError(t, err)

	calls := map[string]func(tx pgx.Tx) error{
		"GrantTx": func(tx pgx.Tx) error {
			_, err := b.client.GrantTx(b.ctx, tx, quota.GrantRequest{Quota: "q", Member: "m", Amount: 1})
			return err
		},
		"RevokeTx": func(tx pgx.Tx) error {
			_, err := b.client.RevokeTx(b.ctx, tx, quota.RevokeRequest{Quota: "q", Member: "m", Amount: 1})
			return err
		},
		"DefineQuotaTx": func(tx pgx.Tx) error {
			_, err := b.operator.DefineQuotaTx(b.ctx, tx, quota.Definition{Name: "q2", Window: quota.WindowDay})
			return err
		},
		"SetMemberLimitTx": func(tx pgx.Tx) error { _, err := b.operator.SetMemberLimitTx(b.ctx, tx, "q", "m", 1); return err },
		"CreateCampaignTx": func(tx pgx.Tx) error {
			_, err := voucherOf(t, b.operator).CreateCampaignTx(b.ctx, tx, "pool2", 1)
			return err
		},
		"ClaimTx counted": func(tx pgx.Tx) error {
			_, err := voucherOf(t, b.client).ClaimTx(b.ctx, tx, voucher.ClaimRequest{Campaign: "pool", Member: "m"})
			return err
		},
		"ClaimTx codes": func(tx pgx.Tx) error {
			_, err := voucherOf(t, b.client).ClaimTx(b.ctx, tx, voucher.ClaimRequest{Campaign: "codes", Member: "m"})
			return err
		},
		"ImportCodesTx": func(tx pgx.Tx) error {
			_, err := voucherOf(t, b.operator).ImportCodesTx(b.ctx, tx, "codes", []string{"b"})
			return err
		},
	}
	// Operator work runs in the operator's transactions (the application
	// role of PGQUOTA_TEST_APP_ROLE=1 may not execute its functions).
	before := b.snapshot(t)
	for name, call := range calls {
		pool := b.pool
		if operatorCall[name] {
			pool = b.operator.Pool()
		}
		t.Run(name+" in a read-only transaction", func(t *testing.T) {
			tx, err := pool.BeginTx(b.ctx, pgx.TxOptions{AccessMode: pgx.ReadOnly})
			require.NoError(t, err)
			defer func() { _ = tx.Rollback(b.ctx) }()
			err = call(tx)
			var pgErr *pgconn.PgError
			require.ErrorAs(t, err, &pgErr)
			require.Equal(t, "25006", pgErr.Code, "read_only_sql_transaction: %v", err)
			require.NotErrorIs(t, err, quota.ErrInvalidInput)
			require.NotErrorIs(t, err, quota.ErrSchemaMissing)
		})
		t.Run(name+" in an aborted transaction", func(t *testing.T) {
			tx, err := pool.Begin(b.ctx)
			require.NoError(t, err)
			defer func() { _ = tx.Rollback(b.ctx) }()
			_, err = tx.Exec(b.ctx, `SELECT 1/0`)
			require.Error(t, err)
			err = call(tx)
			var pgErr *pgconn.PgError
			require.ErrorAs(t, err, &pgErr)
			require.Equal(t, "25P02", pgErr.Code, "in_failed_sql_transaction: %v", err)
		})
	}
	require.Equal(t, before, b.snapshot(t))
}

// schemaCalls are the calls that reach the database, each run once against
// a database whose schema is missing or behind.
var schemaCalls = map[string]func(ctx context.Context, c *quota.Client) error{
	"DefineQuota": func(ctx context.Context, c *quota.Client) error {
		_, err := c.DefineQuota(ctx, quota.Definition{Name: "q", Window: quota.WindowDay})
		return err
	},
	"Quota":  func(ctx context.Context, c *quota.Client) error { _, err := c.Quota(ctx, "q"); return err },
	"Quotas": func(ctx context.Context, c *quota.Client) error { _, err := c.Quotas(ctx); return err },
	"Grant": func(ctx context.Context, c *quota.Client) error {
		_, err := c.Grant(ctx, quota.GrantRequest{Quota: "q", Member: "m", Amount: 1, Limit: ptr[int64](1)})
		return err
	},
	"Revoke": func(ctx context.Context, c *quota.Client) error {
		_, err := c.Revoke(ctx, quota.RevokeRequest{Quota: "q", Member: "m", Amount: 1})
		return err
	},
	"Usage": func(ctx context.Context, c *quota.Client) error { _, err := c.Usage(ctx, "q", "m"); return err },
	"SetMemberLimit": func(ctx context.Context, c *quota.Client) error {
		_, err := c.SetMemberLimit(ctx, "q", "m", 1)
		return err
	},
	"ClearMemberLimit": func(ctx context.Context, c *quota.Client) error {
		_, err := c.ClearMemberLimit(ctx, "q", "m")
		return err
	},
	"MemberLimits": func(ctx context.Context, c *quota.Client) error { _, err := c.MemberLimits(ctx, "q"); return err },
	"CreateCampaign": func(ctx context.Context, c *quota.Client) error {
		_, err := voucherOf(nil, c).CreateCampaign(ctx, "p", 1)
		return err
	},
	"Campaign": func(ctx context.Context, c *quota.Client) error {
		_, err := voucherOf(nil, c).Campaign(ctx, "p")
		return err
	},
	"Claim counted": func(ctx context.Context, c *quota.Client) error {
		_, err := voucherOf(nil, c).Claim(ctx, voucher.ClaimRequest{Campaign: "p", Member: "m"})
		return err
	},
	"Claim codes": func(ctx context.Context, c *quota.Client) error {
		_, err := voucherOf(nil, c).Claim(ctx, voucher.ClaimRequest{Campaign: "p", Member: "m"})
		return err
	},
	"ImportCodes": func(ctx context.Context, c *quota.Client) error {
		_, err := voucherOf(nil, c).ImportCodes(ctx, "p", []string{"a"})
		return err
	},
}

func TestSchemaMissing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.ConnectOwner(t, pgtest.NewEmptyURL(t), 2) // migrates on purpose: as the owner
	client, err := quota.New(pool, nil)
	require.NoError(t, err)

	err = client.CheckSchema(ctx)
	require.ErrorIs(t, err, quota.ErrSchemaMissing)
	var sv *quota.SchemaVersionError
	require.ErrorAs(t, err, &sv)
	require.Equal(t, quota.SchemaVersionError{Have: 0, Want: migrations.Latest()}, *sv)
	require.Contains(t, err.Error(), "pgquota migrate up")

	for name, call := range schemaCalls {
		err := call(ctx, client)
		require.ErrorIs(t, err, quota.ErrSchemaMissing, name)
		require.Contains(t, err.Error(), "pgquota migrate up", name)
		var pgErr *pgconn.PgError
		require.ErrorAs(t, err, &pgErr, "%s: the database's error stays in the chain", name)
		require.Contains(t, []string{"3F000", "42P01", "42883"}, pgErr.Code, name)
	}
	// Nothing was created on the way.
	var schemas int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pg_namespace WHERE nspname = 'pgquota'`).Scan(&schemas))
	require.Zero(t, schemas)

	// Migrated, the same client works.
	require.NoError(t, client.Migrate(ctx))
	require.NoError(t, client.CheckSchema(ctx))
	_, err = client.DefineQuota(ctx, quota.Definition{Name: "q", Window: quota.WindowDay})
	require.NoError(t, err)
}

func TestSchemaBehind(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.ConnectOwner(t, pgtest.NewEmptyURL(t), 2) // migrates on purpose: as the owner
	sqlDB := stdlib.OpenDBFromPool(pool)
	t.Cleanup(func() { _ = sqlDB.Close() })
	require.NoError(t, migrations.EnsureSchema(ctx, sqlDB))
	p, err := migrations.NewProvider(sqlDB)
	require.NoError(t, err)
	_, err = p.UpTo(ctx, 1)
	require.NoError(t, err)

	client, err := quota.New(pool, nil)
	require.NoError(t, err)
	err = client.CheckSchema(ctx)
	var sv *quota.SchemaVersionError
	require.ErrorAs(t, err, &sv)
	require.Equal(t, int64(1), sv.Have)
	require.Equal(t, migrations.Latest(), sv.Want)
	require.ErrorIs(t, err, quota.ErrSchemaMissing)
	require.Contains(t, err.Error(), "pgquota migrate up")

	// Defining a quota (its function is migration 22's) and vouchers
	// (migration 2) say the schema is behind.
	_, err = client.DefineQuota(ctx, quota.Definition{Name: "q", Window: quota.WindowDay})
	require.ErrorIs(t, err, quota.ErrSchemaMissing)
	_, err = client.Quotas(ctx)
	require.NoError(t, err, "reading quotas works at migration 1")
	for _, name := range []string{"CreateCampaign", "Campaign", "Claim counted", "Claim codes", "ImportCodes"} {
		err := schemaCalls[name](ctx, client)
		require.ErrorIs(t, err, quota.ErrSchemaMissing, name)
	}

	// A schema newer than this build is reported, but is not "missing".
	_, err = sqlDB.ExecContext(ctx, `INSERT INTO `+migrations.VersionTable+` (version_id, is_applied) VALUES ($1, true)`, migrations.Latest()+1)
	require.NoError(t, err)
	err = client.CheckSchema(ctx)
	require.ErrorAs(t, err, &sv)
	require.Equal(t, migrations.Latest()+1, sv.Have)
	require.NotErrorIs(t, err, quota.ErrSchemaMissing)
	require.Contains(t, err.Error(), "upgrade pgquota")
}
