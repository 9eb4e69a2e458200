package quota

import "github.com/pgquota/pgquota/internal/core"

// MaxNameBytes is the longest quota name, member, campaign or voucher code
// accepted, in bytes of UTF-8.
const MaxNameBytes = core.MaxNameBytes

// MaxUnits is the largest amount, limit or pool total accepted: 2^62 - 1.
// With both an amount and a counter at most MaxUnits, their sum (at most
// 2^63 - 2) never overflows PostgreSQL's bigint (at most 2^63 - 1).
const MaxUnits = core.MaxUnits
