package quota

import "context"

// calendarOnly is the error of a statement that serves calendar quotas only
// (Revoke and its keyed form): when it failed because the quota is of
// kind rate, fixed or rolling (date_trunc rejects the unit, SQLSTATE 22023),
// it is an *InputError naming the quota's kind and the calls that serve it.
// Nothing was written. Any other error is returned as is.
func (c *Client) calendarOnly(ctx context.Context, op, quota string, err error) error {
	if sqlState(err) != "22023" {
		return err
	}
	c.kinds.Delete(quota)
	w, kerr := c.quotaKind(ctx, c.db.reads(), quota)
	if kerr != nil || !w.Shaped() {
		return err
	}
	return inputError("quota", "%q is of kind %s: %s serves calendar quotas only (hour, day, week, month, none): the grants of a rate, fixed or rolling quota cannot be revoked (Usage reads its state)", quota, w, op)
}
