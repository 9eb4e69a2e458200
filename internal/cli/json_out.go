package cli

import (
	"time"

	"github.com/pgquota/pgquota/quota/lease"
)

// What --json prints for the library's results whose JSON is not the
// library's own: every duration as whole milliseconds under a key ending in
// _ms, and one name per concept (docs/json-output.md). Grants, limits,
// usage and quotas print as the library encodes them (quota/json.go), in
// the same units.

// msLeft is time left (a lease's remaining TTL) in whole milliseconds,
// rounded down, so that a script never counts on more than is left.
func msLeft(d time.Duration) int64 { return max(d, 0).Milliseconds() }

// leaseJSON is quota.Lease for --json, with the time it has left.
type leaseJSON struct {
	lease.Lease
	RemainingMS int64 `json:"remaining_ms"`
}

func leaseOut(l lease.Lease) leaseJSON {
	return leaseJSON{Lease: l, RemainingMS: msLeft(l.Remaining())}
}

// slotJSON is lease.Slot for --json: "semaphore" names the semaphore (as
// in slot show and a full semaphore's denial), "lease" the slot's lease
// (slot:NAME:INDEX), "held" whether this slot is held; "holders" (in
// printSlot and slot show) counts the semaphore's held slots.
type slotJSON struct {
	Semaphore   string    `json:"semaphore"`
	Index       int       `json:"slot"`
	Lease       string    `json:"lease"`
	Holder      string    `json:"holder"`
	Attempt     string    `json:"attempt"`
	Token       int64     `json:"token"`
	AcquiredAt  time.Time `json:"acquired_at"`
	RenewedAt   time.Time `json:"renewed_at"`
	ExpiresAt   time.Time `json:"expires_at"`
	DBNow       time.Time `json:"db_now"`
	Held        bool      `json:"held"`
	Payload     string    `json:"payload"`
	RemainingMS int64     `json:"remaining_ms"`
}

func slotOut(s lease.Slot) slotJSON {
	return slotJSON{
		Semaphore: s.Semaphore, Index: s.Index, Lease: s.Name, Holder: s.Holder, Attempt: s.Attempt,
		Token: s.Token, AcquiredAt: s.AcquiredAt, RenewedAt: s.RenewedAt, ExpiresAt: s.ExpiresAt,
		DBNow: s.DBNow, Held: s.Held, Payload: s.Payload, RemainingMS: msLeft(s.Remaining()),
	}
}
