package voucher

import (
	"sync"

	"github.com/hashicorp/golang-lru/v2/simplelru"
)

// Bounded per-campaign caches (Client.shardCounts, Client.shardGates).
//
// A Client remembers, per sharded campaign it claimed from, the number of
// shards (every claim reports it: pgquota.claim's shards) and the gate that
// bounds its claims in flight. Kept in plain maps, they would grow with
// every campaign the Client ever touched: a service that opens a campaign
// per product launch would hold every past one for ever. So each is a
// least-recently-used cache of at most campaignCacheSize campaigns
// (hashicorp/golang-lru's simplelru, under a mutex): a campaign evicted and
// claimed from again makes one claim without the gate (which learns its
// shards again), and gets a fresh gate. A gate
// evicted while claims are in flight on it only lets a few more claims in
// at once for as long as those run (they release their places on the old
// gate): the gate is a throughput aid, never a guard.

// campaignCacheSize bounds each per-campaign cache: about 200 bytes an
// entry, so 10,000 campaigns take about 2 MB, and a working set of that
// many sharded campaigns stays cached.
const campaignCacheSize = 10000

// boundedMap is an LRU cache of at most size entries with the methods of
// sync.Map that the Client uses (keys are campaign names).
type boundedMap struct {
	once sync.Once
	mu   sync.Mutex
	lru  *simplelru.LRU[string, any]
	size int // 0 for campaignCacheSize
}

func (m *boundedMap) init() {
	m.once.Do(func() {
		size := m.size
		if size <= 0 {
			size = campaignCacheSize
		}
		m.lru, _ = simplelru.NewLRU[string, any](size, nil) // size > 0: no error
	})
}

// Load returns the value for key and marks it recently used.
func (m *boundedMap) Load(key string) (any, bool) {
	m.init()
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.lru.Get(key)
}

// Store sets the value for key, evicting the least recently used entry
// when the cache is full.
func (m *boundedMap) Store(key string, value any) {
	m.init()
	m.mu.Lock()
	defer m.mu.Unlock()
	m.lru.Add(key, value)
}

// Delete removes key.
func (m *boundedMap) Delete(key string) {
	m.init()
	m.mu.Lock()
	defer m.mu.Unlock()
	m.lru.Remove(key)
}

// LoadOrStore returns the value for key when present, else stores value.
func (m *boundedMap) LoadOrStore(key string, value any) (actual any, loaded bool) {
	m.init()
	m.mu.Lock()
	defer m.mu.Unlock()
	if v, ok := m.lru.Get(key); ok {
		return v, true
	}
	m.lru.Add(key, value)
	return value, false
}

// CompareAndSwap replaces the value for key with new when it is old.
func (m *boundedMap) CompareAndSwap(key string, old, new any) bool {
	m.init()
	m.mu.Lock()
	defer m.mu.Unlock()
	if v, ok := m.lru.Peek(key); !ok || v != old {
		return false
	}
	m.lru.Add(key, new)
	return true
}

// Len returns the number of entries.
func (m *boundedMap) Len() int {
	m.init()
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.lru.Len()
}
