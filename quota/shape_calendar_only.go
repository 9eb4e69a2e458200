package quota

import "context"

// calendarOnly is the error of a statement that serves calendar quotas only
// (Usage): when it failed because the quota is of kind rate, fixed or
// rolling (date_trunc rejects the unit, SQLSTATE 22023), it is the
// calendarOnlyError of the quota's kind. Nothing was written. Any other
// error is returned as is.
func (c *Client) calendarOnly(ctx context.Context, op, quota string, err error) error {
	if sqlState(err) != "22023" {
		return err
	}
	c.kinds.Delete(quota)
	w, kerr := c.quotaKind(ctx, c.db.reads(), quota)
	if kerr != nil || !w.Shaped() {
		return err
	}
	return calendarOnlyError(op, quota, w)
}

// calendarOnlyError is the *InputError of call op (usage, revoke) on quota
// of kind w (rate, fixed or rolling), which op does not serve. pgquota.revoke
// and pgquota.revoke_keyed report the kind themselves and write nothing.
func calendarOnlyError(op, quota string, w Window) error {
	return inputError("quota", "%q is of kind %s: %s serves calendar quotas only (day, week, month, year, none); the state of a rate, fixed or rolling quota is in a grant's result (GrantResult.Limits), and its grants cannot be revoked", quota, w, op)
}
