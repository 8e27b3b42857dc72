package state

import "encoding/binary"

// Lease makes one VM at a time the holder of a periodic job (scraping the engines,
// polling a pool's discovery source): a holder and an expiry in one shared-data key (a
// format byte, holder id (8), expiry in ms (8)). The holder renews it on every try;
// once it has expired any VM may take it. Every change is a compare-and-swap, so of
// several VMs racing for a free or expired lease exactly one wins.
type Lease struct {
	store   Store  // shared data the lease lives in
	key     string // its key
	retries int    // compare-and-swap attempts per try
}

const (
	leaseFormat = 1
	leaseSize   = 17
)

// NewLease returns the lease held at key.
func NewLease(s Store, key string, retries int) *Lease {
	return &Lease{store: s, key: key, retries: retries}
}

// TryAcquire takes or renews the lease for vmID until nowMS+leaseMS and reports whether
// vmID holds it now. It fails (false) while another VM's lease has not expired. A
// value of an unknown format counts as a free lease. vmID must be unique per VM.
func (l *Lease) TryAcquire(vmID uint64, nowMS, leaseMS int64) (bool, error) {
	leaseMS = max(leaseMS, 1)
	held := false
	err := Update(l.store, l.key, l.retries, func(old []byte) ([]byte, bool) {
		if len(old) == leaseSize && old[0] == leaseFormat {
			holder := binary.LittleEndian.Uint64(old[1:])
			expires := int64(binary.LittleEndian.Uint64(old[9:]))
			if holder != vmID && nowMS < expires {
				held = false
				return nil, false
			}
		}
		held = true
		next := make([]byte, 1, leaseSize)
		next[0] = leaseFormat
		next = binary.LittleEndian.AppendUint64(next, vmID)
		next = binary.LittleEndian.AppendUint64(next, uint64(nowMS+leaseMS))
		return next, true
	})
	if err != nil {
		return false, err
	}
	return held, nil
}
