package fence

import "github.com/pgquota/pgquota/internal/core"

// External fencing tokens: numbers from another lock service (an etcd
// key's create revision, a ZooKeeper lock node's sequence number) used as
// the Token of WriteRow (with no Lease) or of PresentTokenTx on a table
// attached with GuardTableRequest.External. They grow with every holder
// while the service keeps its history, and restart when it does not (a new
// ZooKeeper ensemble, a lock's parent node created again, an etcd cluster
// restored from an older snapshot or started anew): the storage then
// refuses every new holder as stale (the resource's highest token seen is
// above them), which is safe but stops all work. The mapping below puts an
// epoch the operator bumps at each such restart above the service's number.

// Bit widths of the service's number in ExternalToken for the two services
// of the recipes.
const (
	// ZooKeeperSeqBits holds a ZooKeeper sequence number (ZooKeeper takes it
	// from the parent node's child version, a signed 32-bit counter).
	ZooKeeperSeqBits = 32
	// EtcdRevisionBits holds an etcd revision below 2^40 (about 10^12
	// writes), as pgquota's own lease tokens do: (epoch << 40) + n.
	EtcdRevisionBits = 40
)

// ExternalToken returns the fencing token (epoch << bits) + n for number n
// of an external lock service, so that tokens stay increasing across a
// restart of the service's numbers when the operator bumps epoch then:
// every token of epoch e+1 is above every token of epoch e. epoch is at
// least 1 (so a service number 0, as ZooKeeper's first sequence number, still
// gives a token of at least 1) and below 2^(63-bits); n is at least 0 and
// below 2^bits; bits is 1 to 62 (ZooKeeperSeqBits, EtcdRevisionBits).
//
// Keep external tokens on resources of their own: a resource's highest token
// seen is one number, so tokens of pgquota leases and of another service on
// one resource lock each other out. pgquota refuses that mix where it can: a
// WriteRow without Lease on the resource of a table guarded for lease
// tokens (attached without External) is refused with lease.ErrLost (SQLSTATE
// PQ002) when its token is above every token pgquota's leases have issued
// (pgquota.lease_token_ceiling), and PresentTokenTx on such a table checks
// the lease, which no external token holds. Attach the guard with External,
// or give WriteRow a resource no lease is named like.
//
// Errors: *quota.InputError (quota.ErrInvalidInput) naming "bits", "epoch" or the
// service number ("external number") when out of range.
func ExternalToken(epoch, n int64, bits uint) (int64, error) {
	if bits < 1 || bits > 62 {
		return 0, core.Invalid("bits", "must be between 1 and 62, got %d", bits)
	}
	if epoch < 1 || epoch >= 1<<(63-bits) {
		return 0, core.Invalid("epoch", "must be between 1 and %d for %d-bit numbers, got %d", int64(1)<<(63-bits)-1, bits, epoch)
	}
	if n < 0 || n >= 1<<bits {
		return 0, core.Invalid("external number", "must be between 0 and %d (%d bits), got %d: bump the epoch and restart the service's numbers, or widen bits", int64(1)<<bits-1, bits, n)
	}
	return epoch<<bits + n, nil
}
