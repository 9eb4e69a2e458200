package lab

import (
	"context"
	"fmt"

	"github.com/pgquota/pgquota/quota"
)

const (
	labQuota  = "lab"
	labMember = "member"
)

// conditional is pgquota's one-statement conditional grant: the check and
// the write are one UPDATE whose WHERE clause PostgreSQL re-checks against
// the newest row version, so no pause anywhere can make it leak.
type conditional struct{}

func (conditional) Name() string { return "conditional" }
func (conditional) Safe() bool   { return true }
func (conditional) Injected(cfg Config) string {
	s := "pgquota Grant, check and write in one statement"
	if cfg.Paused > 0 && cfg.Pause > 0 {
		s += fmt.Sprintf("; the first %d requests pause %s before it", cfg.Paused, cfg.Pause)
	}
	return s
}

func (conditional) Prepare(ctx context.Context, env *Env) error {
	limit := env.Config.Limit
	_, err := env.Quota.DefineQuota(ctx, quota.Definition{Name: labQuota, Window: quota.WindowNone, DefaultLimit: &limit})
	return err
}

func (conditional) Reset(ctx context.Context, env *Env) error {
	_, err := env.DB.Exec(ctx, `DELETE FROM pgquota.usage WHERE quota_name = $1`, labQuota)
	return err
}

func (conditional) Counter(ctx context.Context, env *Env) (int64, error) {
	u, err := env.Quota.Usage(ctx, labQuota, labMember)
	return u.Used, err
}

func (conditional) Close(context.Context, *Env) error { return nil }

func (conditional) Request(ctx context.Context, env *Env, c *Client) (Outcome, error) {
	env.Faults.Pause(ctx)
	res, err := c.Quota.Grant(ctx, quota.GrantRequest{Quota: labQuota, Member: labMember, Amount: 1})
	return Outcome{Granted: res.Granted}, err
}
