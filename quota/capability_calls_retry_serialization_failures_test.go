package quota_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/quota"
	"github.com/pgquota/pgquota/quota/fence"
	"github.com/pgquota/pgquota/quota/lease"
	"github.com/pgquota/pgquota/quota/outbox"
	"github.com/pgquota/pgquota/quota/voucher"
)

// failWith40001 installs, as the owner, a trigger on pgquota's tables that
// fails the next n row writes with SQLSTATE 40001 (serialization_failure),
// as a SERIALIZABLE conflict would, and returns arm(n). The budget is a
// sequence, so a rolled-back attempt still spends it.
func failWith40001(t *testing.T, b *testBundle) (arm func(n int)) {
	t.Helper()
	_, err := b.owner.Exec(b.ctx, `
		CREATE SEQUENCE public.fail40001_seq MINVALUE -1000000;
		SELECT setval('public.fail40001_seq', 1000000);
		CREATE FUNCTION public.fail40001() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER AS $$
		BEGIN
			IF nextval('public.fail40001_seq') <= 0 THEN
				RAISE EXCEPTION 'injected serialization failure on %', TG_TABLE_NAME USING ERRCODE = '40001';
			END IF;
			RETURN CASE WHEN TG_OP = 'DELETE' THEN OLD ELSE NEW END;
		END $$;`)
	require.NoError(t, err)
	for _, tbl := range []string{"lease", "fenced_row", "outbox", "voucher_pool", "voucher_claim"} {
		_, err := b.owner.Exec(b.ctx, fmt.Sprintf(`CREATE TRIGGER fail40001 BEFORE INSERT OR UPDATE OR DELETE ON pgquota.%s FOR EACH ROW EXECUTE FUNCTION public.fail40001()`, tbl))
		require.NoError(t, err)
	}
	return func(n int) {
		// nextval returns -n+1 .. 0 for the next n writes (failing), then 1.. (passing).
		_, err := b.owner.Exec(b.ctx, `SELECT setval('public.fail40001_seq', $1::bigint, false)`, int64(-n+1))
		require.NoError(t, err)
	}
}

// The capability clients' calls that own their transaction retry a
// serialization failure as quota.Client's do, for as long as the
// quota.Client's Config.RetryMaxElapsed says: with the default (30s),
// three injected 40001s in a row are absorbed and the call succeeds (and
// pgquota.retries counts them); on a client whose RetryMaxElapsed is 1ns
// the same call gives up at once with the 40001.
func TestCapabilityCallsRetrySerializationFailuresAsConfigured(t *testing.T) {
	t.Parallel()
	b := setup(t, 4)
	_, err := voucherOf(t, b.operator).CreateCampaign(b.ctx, "pool", 100)
	require.NoError(t, err)
	arm := failWith40001(t, b)

	patient, m := b.meteredClient(t, nil)
	hasty, err := quota.New(b.pool, testConfig(t, &quota.Config{RetryMaxElapsed: time.Nanosecond}))
	require.NoError(t, err)

	type call struct {
		name string
		run  func(c *quota.Client, i int) error
	}
	ctx := b.ctx
	hold := func(c *quota.Client, name string) lease.Lease {
		l, err := leaseOf(t, c).Acquire(ctx, lease.AcquireRequest{Name: name, Holder: "h", TTL: time.Minute})
		require.NoError(t, err)
		return l
	}
	calls := []call{
		{"lease.Acquire", func(c *quota.Client, i int) error {
			_, err := leaseOf(t, c).Acquire(ctx, lease.AcquireRequest{Name: fmt.Sprint("acq-", i), Holder: "h", TTL: time.Minute})
			return err
		}},
		{"lease.AcquireWait", func(c *quota.Client, i int) error {
			wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			_, err := leaseOf(t, c).AcquireWait(wctx, lease.AcquireRequest{Name: fmt.Sprint("wait-", i), Holder: "h", TTL: time.Minute}, nil)
			return err
		}},
		{"lease.Renew", nil}, {"lease.SetPayload", nil}, {"lease.Release", nil},
		{"fence.WriteRow", func(c *quota.Client, i int) error {
			_, err := fenceOf(t, c).WriteRow(ctx, fence.WriteRowRequest{Resource: fmt.Sprint("res-", i), Key: "k", Value: "v", Token: 1})
			return err
		}},
		{"voucher.Claim", func(c *quota.Client, i int) error {
			_, err := voucherOf(t, c).Claim(ctx, voucher.ClaimRequest{Campaign: "pool", Member: fmt.Sprint("m-", i)})
			return err
		}},
		{"outbox.Enqueue", func(c *quota.Client, i int) error {
			_, err := outboxOf(t, c).Enqueue(ctx, "t", []byte("x"), &outbox.EnqueueOpts{})
			return err
		}},
	}
	for i := range calls {
		switch calls[i].name {
		case "lease.Renew":
			calls[i].run = func(c *quota.Client, i int) error {
				arm(0)
				l := hold(c, fmt.Sprint("renew-", i))
				arm(3)
				_, err := leaseOf(t, c).Renew(ctx, l, time.Minute)
				return err
			}
		case "lease.SetPayload":
			calls[i].run = func(c *quota.Client, i int) error {
				arm(0)
				l := hold(c, fmt.Sprint("payload-", i))
				arm(3)
				_, err := leaseOf(t, c).SetPayload(ctx, l, "p")
				return err
			}
		case "lease.Release":
			calls[i].run = func(c *quota.Client, i int) error {
				arm(0)
				l := hold(c, fmt.Sprint("release-", i))
				arm(3)
				_, err := leaseOf(t, c).Release(ctx, l)
				return err
			}
		}
	}
	for i, tc := range calls {
		arm(3)
		err := tc.run(patient, 2*i)
		t.Logf("%s with default RetryMaxElapsed, 3 injected 40001s: %v", tc.name, err)
		require.NoError(t, err, "%s: a serialization failure is retried", tc.name)

		arm(3)
		start := time.Now()
		err = tc.run(hasty, 2*i+1)
		t.Logf("%s with RetryMaxElapsed 1ns, 3 injected 40001s: %v (%s)", tc.name, err, time.Since(start).Round(time.Millisecond))
		require.Error(t, err, "%s: RetryMaxElapsed 1ns gives up at the first 40001", tc.name)
		require.Equal(t, "40001", pgCode(err), "%s: %v", tc.name, err)
		require.True(t, quota.IsRetryable(err), tc.name)
	}
	arm(0)
	require.GreaterOrEqual(t, sumOf(t, "pgquota.retries", map[string]string{"pgquota.outcome": "succeeded", "pgquota.sqlstate": "40001"}, m), int64(3*len(calls)),
		"each call's three retries are counted by the patient client's meter")
}
