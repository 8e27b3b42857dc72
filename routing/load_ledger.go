package routing

import (
	"cmp"
	"encoding/binary"
	"math"

	"github.com/kvroute/kvroute/routing/state"
)

// LoadLedger keeps the active requests, active (estimated prompt) tokens and queued
// prefill tokens (and how many requests they are) of every target of a pool in one
// shared-data key. Queued prefill
// tokens are the estimated uncached tokens of the requests sent to a target whose
// first response chunk has not come back yet: the prefill work queued or running
// there, which a new request waits behind. Each target also keeps a write clock: the
// uncached tokens of every request ever sent there, i.e. how much its KV cache has
// had to take in — a prefix's first p tokens written there longer ago than the cache
// holds less p have been evicted (see prefix.PrefixIndex). And each target keeps what is needed to estimate how
// much of its queued prefill is still ahead of a new request (Load.PrefillAhead): when
// the queue was last known to be all ahead — a first chunk (the prefill before is
// over, the next starts) or a request sent to a drained queue — and the prefill rate
// observed there, the uncached tokens of the requests whose first chunk came back
// over the time their prefill took. And each target keeps its recent work: the
// uncached tokens and the requests sent there lately, halved every recentHalfLifeMS,
// which say how busy its prefill has been beyond what is queued there now (a new
// conversation placed there brings its later turns to that same queue). And each
// target keeps its cache as its first chunks have shown it (learnCache): how much its
// write clock may move on, with a copy's own tokens, before the copy is gone. And each
// target keeps how many requests it ran when it was last seen out of running slots
// (Load.OutOfSlots), and when: the engine's slot count, which decisions go by after
// it has drained (poolView.slotCharge). Load is counted in time slots of
// lease/ledgerSlots: a request adds to the slot of its start time and its release
// takes from that same slot, and slots older than the lease are dropped. So a
// completion that never arrives (a VM restart, a lost stream) stops counting after
// lease_ms, give or take one slot.
//
// Each VM batches its changes: an acquire or release lands in the VM's own view at
// once and is written to the shared key, under compare-and-swap, with the others of
// its batch — after ledgerBatch changes, or on the tick (Flush), whichever comes
// first. A decision reads no shared data for load: it sees the key as this VM last
// read or wrote it plus its own unwritten changes, so other VMs' load reaches it at
// its next flush, within a tick. One write per batch instead of a read and a write
// per change is what keeps the ledger's cost per request near zero, and it takes the
// contention off the key when many VMs share it.
type LoadLedger struct {
	store   state.Store
	key     string
	retries int
	slotMS  int64

	// configuredCache is prefix.target_cache_tokens: where a target's learned cache
	// starts and the most it learns (0: unknown).
	configuredCache int64

	// keepClock says whether a target's write clock is kept once it carries no load
	// (nil: every one). Without it the clocks of targets that left the pool (a
	// rollout's old pods) would stay in the key forever.
	keepClock func(target uint64) bool

	seen    []byte // the key as this VM last read or wrote it
	read    bool   // seen holds a read (or a write) of the key
	pending []ledgerDelta
	// reports are the batch's first chunks' news of their targets' caches, in order:
	// apart from the deltas, which then merge by target and slot.
	reports []cacheReport
	// learned is each reported target's cache in this VM's view after reports:
	// learned once, as each report comes, rather than at every read of the view.
	learned []learnedCache
}

// learnedCache is a target's cache learned from the batch's reports (learnCache).
type learnedCache struct {
	target uint64
	cache  int64
}

// cacheReport is a first chunk's news of its target's cache: hit +1 if a copy age
// tokens old was still there, -1 if it was gone; limit is the cache's stated or
// reported size (0: configuredCache).
type cacheReport struct {
	target     uint64
	hit        int8
	age, limit int64
}

// ledgerDelta is one target-slot's change not yet written to the shared key.
type ledgerDelta struct {
	target   uint64
	epoch    int64
	requests int64
	prefills int64
	tokens   int64
	prefill  int64
	written  int64 // to the target's write clock (its epoch is ignored)
	// to the target's prefill progress (their epoch is ignored): the times are kept
	// as the latest seen (0: no news), the rate sample is added
	since, chunk    int64
	rateTok, rateMS int64
	// to the target's recent work, as of recentEpoch (its epoch is ignored)
	recent, recentSent, recentEpoch int64
	// the target was seen out of running slots at fullAt (ms; 0: no news) while
	// running fullRunning requests past their first chunk (its epoch is ignored)
	fullRunning, fullAt int64
	// to the target's recent decode stays, as of stayEpoch (its epoch is ignored)
	stayMS, stays, stayEpoch int64
}

// ledgerBatch is how many acquires and releases a VM holds before it writes them.
const ledgerBatch = 16

const (
	ledgerFormat = 8
	ledgerSlots  = 8
	// per target: id(8) written(8) since(8) chunk(8) rate tokens(4) rate ms(4)
	// recent tokens(8) recent requests(4) recent epoch(4) cache(8) full running(4)
	// full at(8) stay ms(8) stays(4) stay epoch(4) slot count(1); per slot: epoch(8)
	// requests(4) prefills(4) tokens(8) prefill(8)
	ledgerTargetHeader = 93
	ledgerSlotBytes    = 32
)

// recentHalfLifeShift makes recentHalfLifeMS a power of two, so a time's half-life
// epoch is a shift: the recent work halves at the same instants on every VM.
const (
	recentHalfLifeShift = 16
	recentHalfLifeMS    = 1 << recentHalfLifeShift
)

// decayed is v, counted as of half-life epoch from, as of epoch to.
func decayed(v, from, to int64) int64 {
	if to <= from {
		return v
	}
	if to-from >= 63 {
		return 0
	}
	return v >> (to - from)
}

// addRecent adds recent work b (tokens, requests, epoch) to a, both as of the later
// epoch.
func addRecent(aTok, aSent, aEpoch, bTok, bSent, bEpoch int64) (tok, sent, epoch int64) {
	epoch = max(aEpoch, bEpoch)
	return decayed(aTok, aEpoch, epoch) + decayed(bTok, bEpoch, epoch),
		decayed(aSent, aEpoch, epoch) + decayed(bSent, bEpoch, epoch), epoch
}

// countUnit is what one request counts in a count that halves (the recent sends, the
// ended stays), so that halving keeps fractions of one: at a few requests a
// half-life, a count of whole ones would halve to nothing while the tokens or ms
// beside it did not, and the two would no longer give a mean.
const countUnit = 256

// stayHalfLifeShift makes stayHalfLifeMS, the half-life of the recent decode stays, a
// power of two, as recentHalfLifeShift does. It is short: the first replies to end
// are the short ones, and the mean must follow the longer ones as they end.
const (
	stayHalfLifeShift = 11
	stayHalfLifeMS    = 1 << stayHalfLifeShift
)

// rateWindowMS bounds the prefill time a target's rate is learned over: past it,
// both sums are halved, so the rate follows an engine that changes (a new model, a
// new GPU) and the sums fit their 4 bytes.
const rateWindowMS = 1 << 16

// Load is one target's current load.
type Load struct {
	Requests int64
	Prefills int64 // the requests of Prefill: those with uncached tokens awaiting their first chunk
	Tokens   int64
	Prefill  int64 // queued prefill tokens: uncached tokens awaiting their first chunk
	Written  int64 // the write clock: uncached tokens ever sent to the target

	// The recent work: uncached tokens and requests (in countUnits) sent to the
	// target, each halved every recentHalfLifeMS.
	Recent, RecentSent int64

	// The prefill progress (PrefillAhead), times in ms: Since is when all of Prefill
	// was last known to be ahead, Chunk the latest first chunk; RateTokens over
	// RateMS is the prefill rate observed on the target (none while RateMS is 0).
	Since, Chunk       int64
	RateTokens, RateMS int64

	// Cache is the target's prefix cache as its first chunks have shown it, in
	// write-clock tokens: a copy recorded longer ago is gone (0: not learned yet).
	// In a view it is at most the size the engine reports while fresh.
	Cache int64

	// FullRunning is how many requests past their first chunk the target ran when it
	// was last seen out of running slots (OutOfSlots), at FullAt ms (0: never; a
	// sighting slotsMemoryMS old is dropped at the next flush).
	FullRunning, FullAt int64

	// The recent decode stays: the ms from first chunk to end of the requests that
	// ended on the target, and how many they were in countUnits, each halved every
	// stayHalfLifeMS.
	StayMS, Stays int64
}

// CacheOr is the target's cache: the learned one, at most limit (the size stated or
// reported), else limit (0: unknown).
func (l *Load) CacheOr(limit int64) int64 {
	if l.Cache > 0 && (limit <= 0 || l.Cache < limit) {
		return l.Cache
	}
	return limit
}

// PrefillRate is the prefill rate observed on the target, in tokens a second (0: none
// seen yet).
func (l *Load) PrefillRate() int64 {
	if l.RateMS <= 0 {
		return 0
	}
	return l.RateTokens * 1000 / l.RateMS
}

// PrefillAhead estimates the queued prefill tokens still ahead of a request sent
// now: Prefill less what the target has computed since the queue was last known to
// be all ahead, at its observed rate; Prefill itself when no rate has been seen.
func (l *Load) PrefillAhead(nowMS int64) int64 {
	// One test rather than three: each a jump in wasm.
	if min(l.RateMS, l.Since, l.Prefill) <= 0 {
		return l.Prefill
	}
	return l.prefillLeft(nowMS, l.RateTokens, l.RateMS)
}

// Stalled reports whether the target's queued prefill has been waiting more than
// stallFactor times as long as its observed rate explains. An engine whose running
// slots or KV memory are full starts no prefill until a decode ends: what it was sent
// stays queued, and PrefillAhead, which counts it done at the rate, no longer shows
// the wait.
func (l *Load) Stalled(nowMS int64) bool {
	if min(l.RateMS, l.RateTokens, l.Since, l.Prefill) <= 0 {
		return false
	}
	return float64(nowMS-l.Since)*float64(l.RateTokens) > stallFactor*float64(l.Prefill)*float64(l.RateMS)
}

// OutOfSlots reports whether the target's engine has run out of running slots: it
// runs at least slotsFullRunning requests past their first chunk, and at least two
// more have none yet, though all it was sent should have been computed by now (ahead,
// its queued prefill estimated left at its own rate or else its peers', is 0). Such
// an engine starts a request only when another ends, so what it is sent waits for
// that, however little prefill it brings. One late request alone may be a prompt that
// took longer than the rate says; the floor keeps out a target whose requests have no
// first chunk because their responses are not streamed (the whole body comes at the
// end) or whose engine adds a step's latency to short prompts. The pool's other
// targets can tell more (poolView.outOfSlots).
func (l *Load) OutOfSlots(ahead int64) bool {
	return l.Requests-l.Prefills >= slotsFullRunning && l.Prefills >= 2 && ahead == 0
}

// SlotsSeen is FullRunning while the sighting is within slotsMemoryMS of nowMS, else
// 0. One further ahead is no reading of this host's clock (a torn or foreign value).
func (l *Load) SlotsSeen(nowMS int64) int64 {
	if sightingLive(l.FullAt, nowMS) {
		return l.FullRunning
	}
	return 0
}

// sightingLive reports whether a sighting out of running slots at atMS (0: none)
// still counts at nowMS: within slotsMemoryMS of it either way.
func sightingLive(atMS, nowMS int64) bool {
	age := nowMS - atMS
	return atMS > 0 && age < slotsMemoryMS && age > -slotsMemoryMS
}

// stallFactor is how many times its expected time a queued prefill may take before
// its target counts as stalled: a rate is an average over prompts, and one prompt's
// prefill may well take somewhat longer than it says.
const stallFactor = 2

// PrefillAheadAt is PrefillAhead at a rate of rateTokens in rateMS instead of the
// target's own.
func (l *Load) PrefillAheadAt(nowMS, rateTokens, rateMS int64) int64 {
	if min(rateMS, l.Since, l.Prefill) <= 0 {
		return l.Prefill
	}
	return l.prefillLeft(nowMS, rateTokens, rateMS)
}

// prefillLeft is PrefillAhead with a rate to go by, out of line so that the common
// answer (nothing queued, or no rate seen) is inlined where it is asked.
func (l *Load) prefillLeft(nowMS, rateTokens, rateMS int64) int64 {
	done := float64(max(0, nowMS-l.Since)) * float64(rateTokens) / float64(rateMS)
	return max(0, l.Prefill-int64(math.Min(done, float64(l.Prefill))))
}

// SinceAfterSend is Since for a request sent now to a target whose queue l
// estimates as drained: the time the queue would have drained at its rate, so the
// request's own prefill counts from now. 0 (no news) while some is still ahead.
func (l *Load) SinceAfterSend(nowMS int64) int64 {
	if l.PrefillAhead(nowMS) > 0 {
		return 0
	}
	if l.Prefill <= 0 || l.RateTokens <= 0 {
		return nowMS
	}
	return nowMS - int64(math.Ceil(float64(l.Prefill)*float64(l.RateMS)/float64(l.RateTokens)))
}

// LoadTicket is what a request must hand back, exactly once, to release its load.
type LoadTicket struct {
	Target  uint64
	Epoch   int64
	Tokens  int64
	Prefill int64 // queued prefill tokens still held: 0 once the first chunk is in
	SentMS  int64 // when the request was sent (its prefill cannot have started before)
	// Cached is the request's tokens the target was taken to hold when it was sent
	// in a copy that no later record there vouches for (a younger head of the prompt
	// is left out), that copy CacheAge write-clock tokens old with the head. Its first
	// chunk says whether the copy was there.
	Cached, CacheAge int64
	// CacheLimit is the target's cache as prefix.target_cache_tokens states it or,
	// unset, as its engine reported it to the decision (0: unknown): where the
	// learning starts and the most it learns.
	CacheLimit int64
	// DueMS is when the request's first chunk is due: what was queued ahead of it and
	// its own prefill, computed at the target's rate (0: no rate known). One that
	// comes much later waited for a running slot (FirstChunk).
	DueMS int64
	// ChunkMS is when its first chunk came (0: not yet): from then to its release it
	// decoded.
	ChunkMS int64
	Valid   bool
}

// NewLoadLedger returns the ledger of one pool.
func NewLoadLedger(s state.Store, namespace, pool string, leaseMS int64, retries int) *LoadLedger {
	slot := leaseMS / ledgerSlots
	if slot < 1 {
		slot = 1
	}
	return &LoadLedger{store: s, key: namespace + "/load/" + pool, retries: retries, slotMS: slot}
}

// ledgerSlot is one time slot of one target.
type ledgerSlot struct {
	epoch    int64
	requests int64
	prefills int64
	tokens   int64
	prefill  int64
}

func (s *ledgerSlot) live() bool {
	return s.requests > 0 || s.prefills > 0 || s.tokens > 0 || s.prefill > 0
}

// ledgerEntry is one target's live slots, write clock and prefill progress.
type ledgerEntry struct {
	target                          uint64
	written                         int64
	since, chunk                    int64
	rateTok, rateMS                 int64
	recent, recentSent, recentEpoch int64
	cache                           int64
	fullRunning, fullAt             int64
	stayMS, stays, stayEpoch        int64
	slots                           []ledgerSlot
}

func (e *ledgerEntry) load() Load {
	l := Load{Written: e.written, Since: e.since, Chunk: e.chunk, RateTokens: e.rateTok, RateMS: e.rateMS,
		Recent: e.recent, RecentSent: e.recentSent, Cache: e.cache, FullRunning: e.fullRunning, FullAt: e.fullAt,
		StayMS: e.stayMS, Stays: e.stays}
	for _, s := range e.slots {
		l.Requests += s.requests
		l.Prefills += s.prefills
		l.Tokens += s.tokens
		l.Prefill += s.prefill
	}
	return l
}

func (l *LoadLedger) oldestLiveEpoch(nowMS int64) int64 { return nowMS/l.slotMS - ledgerSlots }

// decodeLedger reads the live slots of every target, and the sightings out of running
// slots within slotsMemoryMS of nowMS (one from further ahead is no reading of this
// host's clock); a value of another format (or a torn one) reads as empty, so the
// ledger starts afresh.
func decodeLedger(v []byte, oldest, nowMS int64) []ledgerEntry {
	if len(v) < 1 || v[0] != ledgerFormat {
		return nil
	}
	v = v[1:]
	var out []ledgerEntry
	for len(v) >= ledgerTargetHeader {
		e := ledgerEntry{target: binary.LittleEndian.Uint64(v), written: int64(binary.LittleEndian.Uint64(v[8:])),
			since: int64(binary.LittleEndian.Uint64(v[16:])), chunk: int64(binary.LittleEndian.Uint64(v[24:])),
			rateTok: int64(binary.LittleEndian.Uint32(v[32:])), rateMS: int64(binary.LittleEndian.Uint32(v[36:])),
			recent: int64(binary.LittleEndian.Uint64(v[40:])), recentSent: int64(binary.LittleEndian.Uint32(v[48:])),
			recentEpoch: int64(binary.LittleEndian.Uint32(v[52:])), cache: int64(binary.LittleEndian.Uint64(v[56:])),
			fullRunning: int64(binary.LittleEndian.Uint32(v[64:])), fullAt: int64(binary.LittleEndian.Uint64(v[68:])),
			stayMS: int64(binary.LittleEndian.Uint64(v[76:])), stays: int64(binary.LittleEndian.Uint32(v[84:])),
			stayEpoch: int64(binary.LittleEndian.Uint32(v[88:]))}
		if !sightingLive(e.fullAt, nowMS) {
			e.fullRunning, e.fullAt = 0, 0
		}
		n := int(v[92])
		v = v[ledgerTargetHeader:]
		if len(v) < n*ledgerSlotBytes {
			return nil
		}
		for i := 0; i < n; i++ {
			s := ledgerSlot{
				epoch:    int64(binary.LittleEndian.Uint64(v)),
				requests: int64(binary.LittleEndian.Uint32(v[8:])),
				prefills: int64(binary.LittleEndian.Uint32(v[12:])),
				tokens:   int64(binary.LittleEndian.Uint64(v[16:])),
				prefill:  int64(binary.LittleEndian.Uint64(v[24:])),
			}
			v = v[ledgerSlotBytes:]
			if s.epoch > oldest && s.live() {
				e.slots = append(e.slots, s)
			}
		}
		if len(e.slots) > 0 || e.written > 0 || e.cache > 0 || e.fullAt > 0 || e.stays > 0 {
			out = append(out, e)
		}
	}
	return out
}

func encodeLedger(entries []ledgerEntry, keepClock func(uint64) bool) []byte {
	size := 1
	for _, e := range entries {
		size += ledgerTargetHeader + len(e.slots)*ledgerSlotBytes
	}
	out := make([]byte, 1, size)
	out[0] = ledgerFormat
	for _, e := range entries {
		live := 0
		for i := range e.slots {
			if e.slots[i].live() {
				live++
			}
		}
		if live == 0 && (e.written == 0 && e.cache == 0 && e.fullAt == 0 && e.stays == 0 || keepClock != nil && !keepClock(e.target)) {
			continue
		}
		out = binary.LittleEndian.AppendUint64(out, e.target)
		out = binary.LittleEndian.AppendUint64(out, uint64(e.written))
		out = binary.LittleEndian.AppendUint64(out, uint64(e.since))
		out = binary.LittleEndian.AppendUint64(out, uint64(e.chunk))
		out = binary.LittleEndian.AppendUint32(out, uint32(e.rateTok))
		out = binary.LittleEndian.AppendUint32(out, uint32(e.rateMS))
		out = binary.LittleEndian.AppendUint64(out, uint64(e.recent))
		out = binary.LittleEndian.AppendUint32(out, uint32(min(e.recentSent, math.MaxUint32)))
		out = binary.LittleEndian.AppendUint32(out, uint32(e.recentEpoch))
		out = binary.LittleEndian.AppendUint64(out, uint64(e.cache))
		out = binary.LittleEndian.AppendUint32(out, uint32(min(e.fullRunning, math.MaxUint32)))
		out = binary.LittleEndian.AppendUint64(out, uint64(e.fullAt))
		out = binary.LittleEndian.AppendUint64(out, uint64(e.stayMS))
		out = binary.LittleEndian.AppendUint32(out, uint32(min(e.stays, math.MaxUint32)))
		out = binary.LittleEndian.AppendUint32(out, uint32(e.stayEpoch))
		out = append(out, byte(live))
		for i := range e.slots {
			if s := &e.slots[i]; s.live() {
				out = binary.LittleEndian.AppendUint64(out, uint64(s.epoch))
				out = binary.LittleEndian.AppendUint32(out, uint32(s.requests))
				out = binary.LittleEndian.AppendUint32(out, uint32(s.prefills))
				out = binary.LittleEndian.AppendUint64(out, uint64(s.tokens))
				out = binary.LittleEndian.AppendUint64(out, uint64(s.prefill))
			}
		}
	}
	return out
}

// LoadsInto adds each live target's load, as this VM sees it, to dst[index(id)],
// for targets index knows (index returns -1 for others), without allocating. It reads
// the shared key only the first time; after that Flush keeps the view current.
func (l *LoadLedger) LoadsInto(nowMS int64, index func(uint64) int, dst []Load) error {
	if !l.read {
		if err := l.refresh(); err != nil {
			return err
		}
	}
	oldest := l.oldestLiveEpoch(nowMS)
	nowEpoch, stayEpoch := nowMS>>recentHalfLifeShift, nowMS>>stayHalfLifeShift
	if v := l.seen; len(v) >= 1 && v[0] == ledgerFormat {
		for v = v[1:]; len(v) >= ledgerTargetHeader; {
			i := index(binary.LittleEndian.Uint64(v))
			if i >= 0 {
				l := &dst[i]
				l.Written += int64(binary.LittleEndian.Uint64(v[8:]))
				l.Since = max(l.Since, int64(binary.LittleEndian.Uint64(v[16:])))
				l.Chunk = max(l.Chunk, int64(binary.LittleEndian.Uint64(v[24:])))
				l.RateTokens += int64(binary.LittleEndian.Uint32(v[32:]))
				l.RateMS += int64(binary.LittleEndian.Uint32(v[36:]))
				epoch := int64(binary.LittleEndian.Uint32(v[52:]))
				l.Recent += decayed(int64(binary.LittleEndian.Uint64(v[40:])), epoch, nowEpoch)
				l.RecentSent += decayed(int64(binary.LittleEndian.Uint32(v[48:])), epoch, nowEpoch)
				l.Cache = int64(binary.LittleEndian.Uint64(v[56:]))
				l.FullRunning, l.FullAt = int64(binary.LittleEndian.Uint32(v[64:])), int64(binary.LittleEndian.Uint64(v[68:]))
				epoch = int64(binary.LittleEndian.Uint32(v[88:]))
				l.StayMS += decayed(int64(binary.LittleEndian.Uint64(v[76:])), epoch, stayEpoch)
				l.Stays += decayed(int64(binary.LittleEndian.Uint32(v[84:])), epoch, stayEpoch)
			}
			n := int(v[92])
			v = v[ledgerTargetHeader:]
			if len(v) < n*ledgerSlotBytes {
				break
			}
			if i < 0 {
				v = v[n*ledgerSlotBytes:]
				continue
			}
			for ; n > 0; n-- {
				if int64(binary.LittleEndian.Uint64(v)) > oldest {
					dst[i].Requests += int64(binary.LittleEndian.Uint32(v[8:]))
					dst[i].Prefills += int64(binary.LittleEndian.Uint32(v[12:]))
					dst[i].Tokens += int64(binary.LittleEndian.Uint64(v[16:]))
					dst[i].Prefill += int64(binary.LittleEndian.Uint64(v[24:]))
				}
				v = v[ledgerSlotBytes:]
			}
		}
	}
	for _, d := range l.pending {
		i := index(d.target)
		if i >= 0 {
			l := &dst[i]
			l.Written += d.written
			l.Since, l.Chunk = max(l.Since, d.since), max(l.Chunk, d.chunk)
			l.RateTokens += d.rateTok
			l.RateMS += d.rateMS
			l.Recent += decayed(d.recent, d.recentEpoch, nowEpoch)
			l.RecentSent += decayed(d.recentSent, d.recentEpoch, nowEpoch)
			l.StayMS += decayed(d.stayMS, d.stayEpoch, stayEpoch)
			l.Stays += decayed(d.stays, d.stayEpoch, stayEpoch)
			if d.fullAt != 0 {
				l.FullRunning, l.FullAt = mergeFull(l.FullRunning, l.FullAt, d.fullRunning, d.fullAt)
			}
		}
		if i >= 0 && d.epoch > oldest {
			// A release may reach a slot this view has not seen the acquire of yet.
			dst[i].Requests = max(0, dst[i].Requests+d.requests)
			dst[i].Prefills = max(0, dst[i].Prefills+d.prefills)
			dst[i].Tokens = max(0, dst[i].Tokens+d.tokens)
			dst[i].Prefill = max(0, dst[i].Prefill+d.prefill)
		}
	}
	for k := range l.learned {
		if i := index(l.learned[k].target); i >= 0 {
			dst[i].Cache = l.learned[k].cache
		}
	}
	return nil
}

// refresh reads the shared key into the view.
func (l *LoadLedger) refresh() error {
	v, _, err := l.store.Get(l.key)
	switch {
	case err == state.ErrNotFound:
		v = nil
	case err != nil:
		return err
	}
	l.seen, l.read = v, true
	return nil
}

// Snapshot returns the live load of every target that has any, as this VM sees it
// (without the write clocks).
func (l *LoadLedger) Snapshot(nowMS int64) (map[uint64]Load, error) {
	if !l.read {
		if err := l.refresh(); err != nil {
			return nil, err
		}
	}
	entries := decodeLedger(l.seen, l.oldestLiveEpoch(nowMS), nowMS)
	entries = applyDeltas(entries, l.pending, l.reports, l.oldestLiveEpoch(nowMS), l.configuredCache)
	out := make(map[uint64]Load, len(entries))
	for i := range entries {
		ld := entries[i].load()
		ld.Written, ld.Since, ld.Chunk, ld.RateTokens, ld.RateMS = 0, 0, 0, 0, 0 // clocks, not load
		ld.Recent, ld.RecentSent, ld.Cache, ld.FullRunning, ld.FullAt, ld.StayMS, ld.Stays = 0, 0, 0, 0, 0, 0, 0
		if ld.Requests > 0 || ld.Prefills > 0 || ld.Tokens > 0 || ld.Prefill > 0 {
			out[entries[i].target] = ld
		}
	}
	return out, nil
}

// applyDeltas adds deltas to entries, slot by slot, never below zero; deltas to
// slots at or before oldest have expired and are dropped. Then it learns each
// target's cache from reports in order: from, and at or under, the report's limit,
// else configuredCache.
func applyDeltas(entries []ledgerEntry, deltas []ledgerDelta, reports []cacheReport, oldest, configuredCache int64) []ledgerEntry {
	for _, d := range deltas {
		if d.epoch <= oldest && d.written == 0 && d.recentSent == 0 && !d.progress() && d.fullAt == 0 && d.stays == 0 {
			continue
		}
		var e *ledgerEntry
		entries, e = entryOf(entries, d.target)
		e.written += d.written
		e.since, e.chunk = max(e.since, d.since), max(e.chunk, d.chunk)
		e.rateTok += d.rateTok
		e.rateMS += d.rateMS
		for e.rateMS > rateWindowMS || e.rateTok > math.MaxUint32 {
			e.rateTok, e.rateMS = e.rateTok/2, e.rateMS/2
		}
		if d.recentSent != 0 || d.recent != 0 {
			e.recent, e.recentSent, e.recentEpoch = addRecent(e.recent, e.recentSent, e.recentEpoch, d.recent, d.recentSent, d.recentEpoch)
		}
		if d.fullAt != 0 {
			e.fullRunning, e.fullAt = mergeFull(e.fullRunning, e.fullAt, d.fullRunning, d.fullAt)
		}
		if d.stays != 0 {
			e.stayMS, e.stays, e.stayEpoch = addRecent(e.stayMS, e.stays, e.stayEpoch, d.stayMS, d.stays, d.stayEpoch)
		}
		if d.epoch <= oldest {
			continue
		}
		j := 0
		for j < len(e.slots) && e.slots[j].epoch != d.epoch {
			j++
		}
		if j == len(e.slots) {
			e.slots = append(e.slots, ledgerSlot{epoch: d.epoch})
		}
		e.slots[j].requests = max(0, e.slots[j].requests+d.requests)
		e.slots[j].prefills = max(0, e.slots[j].prefills+d.prefills)
		e.slots[j].tokens = max(0, e.slots[j].tokens+d.tokens)
		e.slots[j].prefill = max(0, e.slots[j].prefill+d.prefill)
	}
	for k := range reports {
		c := &reports[k]
		var e *ledgerEntry
		entries, e = entryOf(entries, c.target)
		e.cache = learnCache(e.cache, cmp.Or(c.limit, configuredCache), c)
	}
	return entries
}

// entryOf returns target's entry, appended to entries if it has none.
func entryOf(entries []ledgerEntry, target uint64) ([]ledgerEntry, *ledgerEntry) {
	i := 0
	for i < len(entries) && entries[i].target != target {
		i++
	}
	if i == len(entries) {
		entries = append(entries, ledgerEntry{target: target})
	}
	return entries, &entries[i]
}

// note records a change in the VM's batch, merged with one to the same slot, and
// writes the batch when it is full (only then is the clock read).
func (l *LoadLedger) note(d *ledgerDelta, nowMS func() int64) error {
	merged := false
	for i := range l.pending {
		if p := &l.pending[i]; p.target == d.target && p.epoch == d.epoch {
			p.requests += d.requests
			p.prefills += d.prefills
			p.tokens += d.tokens
			p.prefill += d.prefill
			p.written += d.written
			p.since, p.chunk = max(p.since, d.since), max(p.chunk, d.chunk)
			p.rateTok += d.rateTok
			p.rateMS += d.rateMS
			if d.recentSent != 0 || d.recent != 0 {
				p.recent, p.recentSent, p.recentEpoch = addRecent(p.recent, p.recentSent, p.recentEpoch, d.recent, d.recentSent, d.recentEpoch)
			}
			if d.fullAt != 0 {
				p.fullRunning, p.fullAt = mergeFull(p.fullRunning, p.fullAt, d.fullRunning, d.fullAt)
			}
			if d.stays != 0 {
				p.stayMS, p.stays, p.stayEpoch = addRecent(p.stayMS, p.stays, p.stayEpoch, d.stayMS, d.stays, d.stayEpoch)
			}
			merged = true
			break
		}
	}
	if !merged {
		l.pending = append(l.pending, *d)
	}
	if len(l.pending)+len(l.reports) >= ledgerBatch || l.changes() >= ledgerBatch {
		return l.Flush(nowMS())
	}
	return nil
}

// hasChanges reports whether the batch would change the shared key: acquires that
// were released within the batch cancel out.
func (l *LoadLedger) hasChanges() bool {
	if len(l.reports) > 0 {
		return true
	}
	for _, d := range l.pending {
		if d.requests != 0 || d.prefills != 0 || d.tokens != 0 || d.prefill != 0 || d.written != 0 || d.recentSent != 0 || d.progress() || d.fullAt != 0 || d.stays != 0 {
			return true
		}
	}
	return false
}

// progress reports whether d carries news of its target's prefill progress.
func (d *ledgerDelta) progress() bool { return d.since != 0 || d.chunk != 0 || d.rateMS != 0 }

// changes counts the acquires and releases in the batch (a slot's first chunks not
// yet released count once).
func (l *LoadLedger) changes() int {
	n := 0
	for _, d := range l.pending {
		n += int(max(d.requests, -d.requests))
		if d.requests == 0 && d.prefill != 0 {
			n++
		}
	}
	return n
}

// Flush writes the VM's batch into the shared key under compare-and-swap, dropping
// expired slots on the way, and takes the key's current value as the VM's view. With
// nothing to write it only reads. On failure the batch is kept for the next flush.
func (l *LoadLedger) Flush(nowMS int64) error {
	oldest := l.oldestLiveEpoch(nowMS)
	var seen []byte
	err := state.Update(l.store, l.key, l.retries, func(old []byte) ([]byte, bool) {
		next := encodeLedger(applyDeltas(decodeLedger(old, oldest, nowMS), l.pending, l.reports, oldest, l.configuredCache), l.keepClock)
		if !l.hasChanges() && (old == nil || len(next) == len(old)) {
			// Nothing to write and nothing expired (dropping a slot shortens the value).
			seen = old
			return nil, false
		}
		seen = next
		return next, true
	})
	if err != nil {
		return err
	}
	l.seen, l.read, l.pending, l.reports, l.learned = seen, true, l.pending[:0], l.reports[:0], l.learned[:0]
	return nil
}

// Acquire adds one request of tokens to target and returns its ticket. The ticket is
// good even when writing the batch failed (the error says so): the change stays in
// the batch for the next flush.
func (l *LoadLedger) Acquire(target uint64, tokens int64, nowMS int64) (LoadTicket, error) {
	return l.AcquireQueued(target, tokens, 0, 0, nowMS)
}

// AcquireQueued is Acquire for a request that also queues prefill tokens of prefill
// work on target until its first response chunk (FirstChunk) or its end (Release),
// and advances the target's write clock and recent work by them. since, when not 0,
// is the target's new Load.Since (Load.SinceAfterSend).
func (l *LoadLedger) AcquireQueued(target uint64, tokens, prefill, since int64, nowMS int64) (LoadTicket, error) {
	var t LoadTicket
	err := l.acquireInto(&t, target, tokens, prefill, since, nowMS)
	return t, err
}

// acquireInto is AcquireQueued writing the ticket to t. In wasm a struct of more
// than 16 bytes is copied, and one of more than 32 zeroed, by host calls: the ticket
// is written field by field, and the delta's literal names every field, which spares
// it the zeroing first.
func (l *LoadLedger) acquireInto(t *LoadTicket, target uint64, tokens, prefill, since int64, nowMS int64) error {
	epoch := nowMS / l.slotMS
	prefills := int64(0)
	if prefill > 0 {
		prefills = 1
	}
	d := ledgerDelta{target: target, epoch: epoch, requests: 1, prefills: prefills, tokens: tokens,
		prefill: prefill, written: prefill, since: since, chunk: 0, rateTok: 0, rateMS: 0,
		recent: prefill, recentSent: countUnit, recentEpoch: nowMS >> recentHalfLifeShift}
	err := l.note(&d, func() int64 { return nowMS })
	t.Target, t.Epoch, t.Tokens, t.Prefill, t.SentMS, t.DueMS, t.ChunkMS, t.Valid = target, epoch, tokens, prefill, nowMS, 0, 0, true
	return err
}

// FirstChunk takes the ticket's queued prefill tokens back at nowMS: the prefill is
// over, and the next one queued on the target starts, so all that is queued there is
// ahead again (Since). The prefill took from its send, or the target's previous first
// chunk if that came later (one prefill at a time), to now: a sample of the target's
// rate. The ticket keeps its request and tokens for Release.
func (l *LoadLedger) FirstChunk(t *LoadTicket, nowMS int64) error {
	if t.Prefill == 0 {
		return nil
	}
	chunk, rateTok, rateMS, cache := l.progressOf(t.Target)
	took := max(1, nowMS-max(t.SentMS, chunk))
	d := ledgerDelta{target: t.Target, epoch: t.Epoch, prefills: -1, prefill: -t.Prefill, since: nowMS, chunk: nowMS, rateTok: t.Prefill, rateMS: took}
	hit := cacheNews(t, took, rateTok, rateMS)
	if hit != 0 {
		// The copy's head of Cached tokens outlives the writes after it while they and
		// it fit the cache (PrefixSearch.live): its age against the cache is both.
		l.reports = append(l.reports, cacheReport{target: t.Target, hit: hit, age: t.CacheAge + t.Cached, limit: t.CacheLimit})
		l.learn(&l.reports[len(l.reports)-1], cache)
		if hit < 0 {
			d.rateTok += t.Cached // the copy was computed again
		}
	}
	if hit >= 0 && waitedForSlot(t, nowMS) {
		// The request started only now, as another ended: the engine runs all its
		// slots, this one among them. A copy found gone explains the wait otherwise.
		var prev [1]Load
		target := t.Target
		if l.LoadsInto(nowMS, func(id uint64) int {
			if id == target {
				return 0
			}
			return -1
		}, prev[:]) == nil {
			if running := prev[0].Requests - prev[0].Prefills + 1; running >= slotsFullRunning &&
				(running != prev[0].FullRunning || nowMS-prev[0].FullAt >= slotsMemoryMS/8) {
				d.fullRunning, d.fullAt = running, nowMS
			}
		}
	}
	t.Prefill = 0
	return l.note(&d, func() int64 { return nowMS })
}

// progressOf is target's latest first chunk, observed prefill rate and cache in
// this VM's view (Load.Chunk, RateTokens, RateMS, Cache before the batch's reports;
// zero if the key cannot be read): what every first chunk needs, read without
// LoadsInto's walk of every target's load.
func (l *LoadLedger) progressOf(target uint64) (chunk, rateTok, rateMS, cache int64) {
	if !l.read && l.refresh() != nil {
		return 0, 0, 0, 0
	}
	if v := l.seen; len(v) >= 1 && v[0] == ledgerFormat {
		// Every entry, as LoadsInto reads them: a foreign value may name one twice.
		for v = v[1:]; len(v) >= ledgerTargetHeader; {
			if binary.LittleEndian.Uint64(v) == target {
				chunk = max(chunk, int64(binary.LittleEndian.Uint64(v[24:])))
				rateTok += int64(binary.LittleEndian.Uint32(v[32:]))
				rateMS += int64(binary.LittleEndian.Uint32(v[36:]))
				cache = int64(binary.LittleEndian.Uint64(v[56:]))
			}
			skip := ledgerTargetHeader + int(v[92])*ledgerSlotBytes
			if len(v) < skip {
				break
			}
			v = v[skip:]
		}
	}
	for i := range l.pending {
		if d := &l.pending[i]; d.target == target {
			chunk = max(chunk, d.chunk)
			rateTok += d.rateTok
			rateMS += d.rateMS
		}
	}
	return chunk, rateTok, rateMS, cache
}

// learn takes news into its target's learned cache; seen is the target's cache in
// the view before the batch's reports.
func (l *LoadLedger) learn(news *cacheReport, seen int64) {
	limit := cmp.Or(news.limit, l.configuredCache)
	for i := range l.learned {
		if c := &l.learned[i]; c.target == news.target {
			c.cache = learnCache(c.cache, limit, news)
			return
		}
	}
	l.learned = append(l.learned, learnedCache{target: news.target, cache: learnCache(seen, limit, news)})
}

// waitedForSlot reports whether a first chunk at nowMS came so long after it was due
// (LoadTicket.DueMS) that the request waited for a running slot: more than
// stallFactor times its expected wait and slotWaitFloorMS past that, which neither a
// rate's error nor an engine step explains. An engine's backlog of requests for its
// slots shows here at once, while Load.OutOfSlots sees it only once the queued
// prefill is estimated done, which every first chunk postpones.
func waitedForSlot(t *LoadTicket, nowMS int64) bool {
	if t.DueMS <= 0 {
		return false
	}
	return nowMS-t.SentMS > stallFactor*max(0, t.DueMS-t.SentMS)+slotWaitFloorMS
}

// slotWaitFloorMS is the least a first chunk must be late to count as a wait for a
// running slot: an engine step with a full batch takes tens of ms.
const slotWaitFloorMS = 100

// mergeFull is the later of two sightings of a target out of running slots (of the
// same time, the one with more running): the engine's slots as last seen, whichever
// VM saw it and in whatever order the VMs write.
func mergeFull(aRunning, aAt, bRunning, bAt int64) (running, at int64) {
	if bAt > aAt || bAt == aAt && bRunning > aRunning {
		return bRunning, bAt
	}
	return aRunning, aAt
}

// SeenFull records that target was seen out of running slots at nowMS while running
// running requests past their first chunk (Load.FullRunning, Load.FullAt). The news
// is written with the VM's batch; an error means that write failed, and the news
// stays in the batch for the next.
func (l *LoadLedger) SeenFull(target uint64, running, nowMS int64) error {
	d := ledgerDelta{target: target, epoch: nowMS / l.slotMS, fullRunning: running, fullAt: nowMS}
	return l.note(&d, func() int64 { return nowMS })
}

// Release takes a ticket's load back from the slot it was added to (its queued
// prefill tokens too, if no first chunk came). A ticket whose slot has expired
// releases nothing: the lease already dropped it (views and flushes ignore changes to
// expired slots). now is read only if the batch is written.
func (l *LoadLedger) Release(t LoadTicket, now func() int64) error {
	d := ledgerDelta{target: t.Target, epoch: t.Epoch, requests: -1, tokens: -t.Tokens, prefill: -t.Prefill}
	if t.Prefill > 0 {
		d.prefills = -1
	}
	if t.ChunkMS > 0 {
		// Its reply decoded from its first chunk to now.
		nowMS := now()
		d.stayMS, d.stays, d.stayEpoch = max(0, nowMS-t.ChunkMS), countUnit, nowMS>>stayHalfLifeShift
		return l.note(&d, func() int64 { return nowMS })
	}
	return l.note(&d, now)
}

// learnCache is a target's learned cache after news, one first chunk's. limit is
// the size stated or reported (0: unknown): the learning starts there when nothing is
// learned yet, and never goes above it. A copy's age is the writes since it plus its
// own tokens (FirstChunk). A copy found gone younger than the cache takes it a
// twentieth down, never below that copy's age (the first such news, with no size
// known, sets it there); a copy found there older than 4/5 of the cache takes it a
// tenth up, at least to that copy's age. Down is slower than up: counting a gone copy
// as held costs one wait in its queue, while counting a held one as gone sends its
// turns elsewhere to compute it again, and their later turns with them. So the cache
// settles just above the oldest copies that are still there, and one misjudged chunk
// moves it little. The limit stops that drift where the engine's cache ends: the
// write clock counts as writes some tokens the engine found cached, so copies can look
// older than they are and the learning would follow them past it; but no engine holds
// more than its cache, and a long prompt sent for a copy it no longer has is a whole
// prefill queued where none was counted.
func learnCache(cache, limit int64, news *cacheReport) int64 {
	if cache <= 0 || limit > 0 && cache > limit {
		cache = limit
	}
	switch {
	case news.hit < 0 && (cache <= 0 || news.age < cache):
		if cache <= 0 {
			return max(1, news.age)
		}
		return max(news.age, cache-cache/20)
	case news.hit > 0 && cache > 0 && news.age*5 >= cache*4:
		if up := max(news.age, cache+cache/10); limit <= 0 || up < limit {
			return up
		}
		return limit
	}
	return cache
}

// cacheNews says what a first chunk shows of the copy the request was sent to: +1 it
// was there (the prefill took about the uncached tokens' time at the target's rate),
// -1 it was gone (about the whole prompt's), 0 nothing sure (no rate yet, a copy too
// small to tell, or a prefill that took longer than even the whole prompt explains:
// it waited for something else). The rate is rateTok tokens in rateMS.
func cacheNews(t *LoadTicket, took, rateTok, rateMS int64) int8 {
	if t.Cached < 2*t.Prefill || t.Cached <= 0 || rateMS <= 0 || rateTok <= 0 {
		return 0
	}
	computed := float64(took) * float64(rateTok) / float64(rateMS)
	switch {
	case computed <= float64(t.Prefill)+float64(t.Cached)/4:
		return 1
	case computed >= float64(t.Prefill)+float64(t.Cached)*3/4 && computed <= 1.5*float64(t.Prefill+t.Cached):
		return -1
	}
	return 0
}
