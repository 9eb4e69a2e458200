package quota

import "github.com/pgquota/pgquota/internal/core"

// calendarOnlyError is the *InputError of call op (revoke) on quota of kind
// w (rate, fixed or rolling), which op does not serve: the units of such a
// grant cannot be given back exactly (a rate's TAT or a rolling window's
// stamps have no "minus one grant"). pgquota.revoke and pgquota.revoke_keyed
// report the kind themselves and write nothing.
func calendarOnlyError(op, quota string, w Window) error {
	return core.Invalid("quota", "%q is of kind %s: %s serves calendar quotas only (hour, day, week, month, none): the grants of a rate, fixed or rolling quota cannot be revoked (Usage reads its state)", quota, w, op)
}
