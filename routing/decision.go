package routing

// Kind says how a decision was reached; it is the first part of the decision header.
type Kind uint8

const (
	KindLoad Kind = iota
	KindSticky
	KindOverflow
	KindNewConversation
	KindContinuation
	KindPrefix
	KindFallback
	kindCount
)

var kindNames = [kindCount]string{"load", "sticky", "overflow", "new-conversation", "continuation", "prefix", "fallback"}

func (k Kind) String() string {
	if k < kindCount {
		return kindNames[k]
	}
	return "unknown"
}

// Kinds lists every kind, for defining one counter per kind.
func Kinds() []Kind {
	out := make([]Kind, kindCount)
	for i := range out {
		out[i] = Kind(i)
	}
	return out
}

// PDClass is the prefill/decode classification of a request.
type PDClass uint8

const (
	PDOff           PDClass = iota // disaggregation.mode is off
	PDDirect                       // decode target only, local prefill
	PDDisaggregated                // prefill on the prefill target, decode on the decode target
)

// Decision is the outcome of routing one request.
type Decision struct {
	Target Target
	Kind   Kind
	PD     PDClass

	Prefill Target // set when PD == PDDisaggregated

	// MatchedTokens is how many of the request's estimated tokens the target that
	// computes the prompt (the prefill target when disaggregated, else the decode
	// target) already held as a prefix when it was chosen, as the prefix index sees
	// it; 0 without a prompt or with prefix routing off.
	MatchedTokens int

	// Tickets hand the load back at the end of each leg; an invalid ticket (state
	// failed) releases nothing.
	Ticket        LoadTicket
	PrefillTicket LoadTicket

	// StateFailed says a shared-state operation failed (CAS retries exhausted or a
	// host error) while deciding; the filter counts kvroute_state_conflicts.
	StateFailed bool
}

// Header renders the decision header value: the kind, then ";pd=…" when
// disaggregation is on.
func (d *Decision) Header() string {
	switch d.PD {
	case PDDirect:
		return d.Kind.String() + ";pd=direct"
	case PDDisaggregated:
		return d.Kind.String() + ";pd=disaggregated"
	}
	return d.Kind.String()
}
