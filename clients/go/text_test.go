package sidecar_test

// Deterministic content for the tests: varied words (some outside ASCII, so the counters see
// more than one token shape), from a seeded generator.

import (
	"encoding/json"
	"math/rand/v2"
	"strings"
)

var words = strings.Fields(`the refund policy kettle order shipped warehouse invoice customer asked about
	delivery window thirty days receipt store credit exchange damaged box courier tracking number
	Zürich café naïve résumé 東京 配送 😀 ✅ price €49.90 discount code SPRING24 warranty two years
	manual page section clause returns label printer support ticket escalated resolved pending`)

type textGen struct{ r *rand.Rand }

func newTextGen(seed uint64) textGen { return textGen{rand.New(rand.NewPCG(seed, 0x5eed))} }

// text is n words and a full stop.
func (g textGen) text(n int) string {
	out := make([]string, n)
	for i := range out {
		out[i] = words[g.r.IntN(len(words))]
	}
	return strings.Join(out, " ") + "."
}

// between returns a number in [lo, hi].
func (g textGen) between(lo, hi int) int { return lo + g.r.IntN(hi-lo+1) }

// toolArgs is a tool call's arguments: a JSON object.
func (g textGen) toolArgs() string {
	b, _ := json.Marshal(map[string]any{"query": g.text(g.between(3, 8)), "limit": g.between(1, 10)})
	return string(b)
}
