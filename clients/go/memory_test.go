package sidecar_test

import (
	"context"
	"fmt"
	"slices"
	"testing"

	"google.golang.org/protobuf/proto"

	pb "github.com/context-sidecar/context-sidecar/clients/go/contextsidecarv1"
)

// A budgeted ListMemory returns whole entries only, in rank order: an entry over the budget on
// its own is left out (never truncated), and the walk stops at the first that does not fit in
// what remains. Checked against a walk of our own over the entries, each recounted.
func TestListMemoryBudget(t *testing.T) {
	c := dial(t, "alpha")
	ctx := context.Background()
	const ref = "go:memory/budget"
	g := newTextGen(2)
	// Put oldest first; recency ranks newest first. The second newest is far over the budget.
	sizes := []int{40, 12, 60, 25, 8, 33, 400, 20}
	contents := map[string]string{}
	var putOrder []string
	for k, n := range sizes {
		id := fmt.Sprintf("note-%d", k)
		resp, err := c.PutMemory(ctx, &pb.PutMemoryRequest{MemoryRef: ref, EntryId: id, Content: g.text(n),
			Tags: []string{"go"}})
		if err != nil {
			t.Fatal(err)
		}
		if resp.GetEntryId() != id || resp.GetReplaced() {
			t.Fatalf("PutMemory: %v", resp)
		}
		got, err := c.GetMemory(ctx, &pb.GetMemoryRequest{MemoryRef: ref, EntryId: id})
		if err != nil {
			t.Fatal(err)
		}
		contents[id] = got.GetContent() // as stored (redacted: nothing here is a secret)
		putOrder = append(putOrder, id)
	}

	// Every entry, in rank order, with its recounted tokens.
	all, err := c.ListMemory(ctx, &pb.ListMemoryRequest{MemoryRef: ref, TokenBudget: proto.Int32(1 << 30)})
	if err != nil {
		t.Fatal(err)
	}
	ranked := all.GetEntries()
	order := make([]string, len(ranked))
	texts := make([]string, len(ranked))
	for k, e := range ranked {
		order[k], texts[k] = e.GetId(), e.GetContent()
	}
	newestFirst := slices.Clone(putOrder)
	slices.Reverse(newestFirst)
	if !slices.Equal(order, newestFirst) {
		t.Fatalf("recency order %v, want the puts newest first", order)
	}
	tokens := map[string]int32{}
	for k, n := range recount(t, c, all.GetTokenCounter(), texts) {
		tokens[order[k]] = n
	}

	// A budget that takes the newest, passes over the oversized one, takes two more, and ends
	// one token short of the next.
	budget := tokens[order[0]] + tokens[order[2]] + tokens[order[3]] + tokens[order[4]] - 1
	if tokens[order[1]] <= budget {
		t.Fatalf("the oversized entry (%d tokens) fits the budget %d", tokens[order[1]], budget)
	}
	resp, err := c.ListMemory(ctx, &pb.ListMemoryRequest{MemoryRef: ref, TokenBudget: proto.Int32(budget)})
	if err != nil {
		t.Fatal(err)
	}

	var got []string
	var used int32
	for _, e := range resp.GetEntries() {
		got = append(got, e.GetId())
		if e.GetContent() != contents[e.GetId()] || e.GetTokens() != tokens[e.GetId()] {
			t.Errorf("%s: %d tokens of %q; stored %d tokens of %q: not the whole entry", e.GetId(), e.GetTokens(),
				e.GetContent(), tokens[e.GetId()], contents[e.GetId()])
		}
		used += tokens[e.GetId()]
	}
	if used > budget || resp.GetTokensUsed() != used {
		t.Errorf("tokens_used %d; the entries recount to %d, budget %d", resp.GetTokensUsed(), used, budget)
	}
	// The next entry in rank order after the last one returned, not over the budget on its own,
	// would not have fit.
	last := slices.Index(order, got[len(got)-1])
	for _, id := range order[last+1:] {
		if tokens[id] <= budget {
			if used+tokens[id] <= budget {
				t.Errorf("%s (%d tokens) would have fit: %d used of %d", id, tokens[id], used, budget)
			}
			break
		}
	}
	// Our own walk.
	var want []string
	var room, leftOut = budget, int32(0)
	for _, id := range order {
		if tokens[id] > budget {
			leftOut++
			continue
		}
		if tokens[id] > room {
			leftOut++
			break
		}
		want, room = append(want, id), room-tokens[id]
	}
	if !slices.Equal(got, want) || resp.GetLeftOutForBudget() != leftOut {
		t.Errorf("budget %d: got %v (%d left out), want %v (%d left out)", budget, got, resp.GetLeftOutForBudget(),
			want, leftOut)
	}
	if len(want) != 3 || leftOut != 2 {
		t.Fatalf("the walk took %v, left out %d: the budget was meant to take 3 and leave out 2", want, leftOut)
	}
}
