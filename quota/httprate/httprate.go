// Package httprate writes the HTTP response fields that tell a client about
// its rate limits, for a pgquota grant result: RateLimit-Policy and
// RateLimit as defined by the IETF httpapi working group's draft
// "RateLimit header fields for HTTP", draft-ietf-httpapi-ratelimit-headers-09
// (March 2025: a policy item "name";q=<quota units>;w=<window seconds>, a
// limit item "name";r=<remaining units>;t=<seconds until reset>), and
// Retry-After (RFC 9110, section 10.2.3, in whole seconds) on a denial.
//
// A service answers 429 in one line:
//
//	res, err := client.Grant(ctx, quota.GrantRequest{Quota: "api", Member: key, Amount: 1})
//	if err != nil { ... }
//	if httprate.Deny(w, res) {
//		return // 429 Too Many Requests written, with Retry-After
//	}
//
// Or in front of a handler, one grant per request (Middleware):
//
//	mw, err := httprate.Middleware(client, httprate.MiddlewareConfig{
//		Quota: "api",
//		Key:   func(r *http.Request) (string, error) { return r.Header.Get("X-API-Key"), nil },
//	})
//	if err != nil { ... }
//	http.Handle("/v1/", mw(apiHandler))
package httprate

import (
	"fmt"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/pgquota/pgquota/quota"
)

// Header names.
const (
	HeaderPolicy     = "RateLimit-Policy"
	HeaderRateLimit  = "RateLimit"
	HeaderRetryAfter = "Retry-After"
)

// Fields returns the values of RateLimit-Policy and RateLimit for res, one
// item per quota of the grant (res.Limits, or the grant's quota for a
// calendar grant on its own), in the order of the grant:
//   - a rate (GCRA) of burst B and emission interval T = Period/limit is
//     the policy q=B;w=B*T (the burst, refilled over B*T), and its limit
//     r=Remaining;t=ResetAfter;
//   - a calendar, fixed or rolling window is q=Limit;w=<window length>,
//     r=Remaining;t=<until the window ends> (a rolling window: until its
//     units have all left it, ResetAfter), also for a calendar grant on its
//     own (its ResetAfter, from the database clock). A lifetime
//     (WindowNone) quota has no w and no t.
//
// Seconds are whole, rounded up (a client that waits t seconds finds the
// state reset). Names are quoted as structured-field strings.
func Fields(res quota.GrantResult) (policy, limit string) {
	var ps, ls []string
	add := func(name string, q int64, w time.Duration, r int64, t time.Duration) {
		p := fmt.Sprintf("%s;q=%d", sfString(name), q)
		if w > 0 {
			p += ";w=" + strconv.FormatInt(ceilSeconds(w), 10)
		}
		ps = append(ps, p)
		l := fmt.Sprintf("%s;r=%d", sfString(name), max(r, 0))
		if t >= 0 {
			l += ";t=" + strconv.FormatInt(ceilSeconds(t), 10)
		}
		ls = append(ls, l)
	}
	if len(res.Limits) == 0 {
		// A calendar grant on its own: its window gives w, its ResetAfter
		// (the time to the window's end; Never for a lifetime quota) t.
		var w time.Duration
		t := quota.Never
		if !res.WindowEnd.IsZero() {
			w = res.WindowEnd.Sub(res.WindowStart)
			t = res.ResetAfter
		}
		add(res.Quota, res.Limit, w, res.Remaining, t)
		return strings.Join(ps, ", "), strings.Join(ls, ", ")
	}
	for _, l := range res.Limits {
		switch l.Window {
		case quota.WindowRate:
			var w time.Duration
			if l.Limit > 0 {
				w = time.Duration(float64(l.Period) * float64(l.Burst) / float64(l.Limit))
			}
			add(l.Quota, l.Burst, w, l.Remaining, l.ResetAfter)
		case quota.WindowNone:
			add(l.Quota, l.Limit, 0, l.Remaining, -1)
		default:
			w := l.Period
			if w == 0 {
				w = l.WindowEnd.Sub(l.WindowStart)
			}
			add(l.Quota, l.Limit, w, l.Remaining, l.ResetAfter)
		}
	}
	return strings.Join(ps, ", "), strings.Join(ls, ", ")
}

// RetryAfter returns the Retry-After value for a denied res of any kind
// (res.RetryAfter, from the database clock): whole seconds, rounded up, at
// least 1; "" when res was granted or when no wait helps (quota.Never).
func RetryAfter(res quota.GrantResult) string {
	if res.Granted || res.RetryAfter < 0 {
		return ""
	}
	return strconv.FormatInt(max(ceilSeconds(res.RetryAfter), 1), 10)
}

// Set writes RateLimit-Policy and RateLimit for res into h, and
// Retry-After when res was denied and a retry can succeed.
func Set(h http.Header, res quota.GrantResult) {
	p, l := Fields(res)
	h.Set(HeaderPolicy, p)
	h.Set(HeaderRateLimit, l)
	if ra := RetryAfter(res); ra != "" {
		h.Set(HeaderRetryAfter, ra)
	} else {
		h.Del(HeaderRetryAfter)
	}
}

// Deny sets the fields on w (Set) and, when res was denied, answers 429
// Too Many Requests with a one-line text body naming the quota that
// refused; it reports whether it did. Call it before writing anything else.
func Deny(w http.ResponseWriter, res quota.GrantResult) bool {
	Set(w.Header(), res)
	if res.Granted {
		return false
	}
	by := res.DeniedBy
	if by == "" {
		by = res.Quota
	}
	http.Error(w, fmt.Sprintf("rate limit %q reached", by), http.StatusTooManyRequests)
	return true
}

func ceilSeconds(d time.Duration) int64 {
	return int64(math.Ceil(d.Seconds()))
}

// sfString quotes s as a structured-field string (RFC 9651, section 3.3.3):
// printable ASCII, with " and \ escaped; other bytes become '?'.
func sfString(s string) string {
	var b strings.Builder
	b.WriteByte('"')
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '"' || c == '\\':
			b.WriteByte('\\')
			b.WriteByte(c)
		case c < 0x20 || c > 0x7e:
			b.WriteByte('?')
		default:
			b.WriteByte(c)
		}
	}
	b.WriteByte('"')
	return b.String()
}
