package sidecar_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	sidecar "github.com/context-sidecar/context-sidecar/clients/go"
	pb "github.com/context-sidecar/context-sidecar/clients/go/contextsidecarv1"
)

const counter = "o200k_base"

// hostTurn is turn i as an agent host sends it: the user's message, the model's tool calls
// (two in parallel on every third turn), their results, and the model's answer.
func hostTurn(g textGen, i int) []*pb.Event {
	id := func(kind string) string { return fmt.Sprintf("t%d-%s", i, kind) }
	events := []*pb.Event{{EventId: id("user"), Role: "user", Content: g.text(g.between(15, 40))}}
	calls := 1
	if i%3 == 0 {
		calls = 2
	}
	for k := range calls {
		events = append(events, &pb.Event{EventId: id(fmt.Sprintf("call%d", k)), Role: "assistant", Type: "tool_call",
			CallId: id(fmt.Sprintf("k%d", k)), ToolName: []string{"search", "fetch_order"}[k], Content: g.toolArgs()})
	}
	for k := range calls {
		events = append(events, &pb.Event{EventId: id(fmt.Sprintf("result%d", k)), Role: "tool", Type: "tool_result",
			CallId: id(fmt.Sprintf("k%d", k)), Content: g.text(g.between(30, 90))})
	}
	return append(events, &pb.Event{EventId: id("answer"), Role: "assistant", Content: g.text(g.between(10, 30))})
}

// A 30-turn host loop: each turn's events go in with AssembleContext, and each answer is
// checked against the host's own record of what it sent, every count recounted.
func TestHostLoop(t *testing.T) {
	c := dial(t, "alpha")
	ctx := context.Background()
	const runID, budget, turns = "go-host-loop", 1500, 30
	opened, err := c.OpenRun(ctx, &pb.OpenRunRequest{RunId: runID, TokenCounter: proto.String(counter),
		TranscriptTokenBudget: proto.Int32(budget)})
	if err != nil {
		t.Fatal(err)
	}
	if !opened.GetCreated() || opened.GetSettings().GetTranscriptTokenBudget() != budget {
		t.Fatalf("OpenRun: %v", opened)
	}

	g := newTextGen(1)
	var sent []*pb.Event // the host's events, in order
	appended := map[string]*pb.AppendResult{}
	toolOf := map[string]string{} // call_id -> tool name
	nextSeq := int32(0)           // the sidecar's own log entries (context.cleared) take seqs too
	slid, cleared := 0, 0
	for i := 1; i <= turns; i++ {
		events := hostTurn(g, i)
		resp, err := c.AssembleContext(ctx, &pb.AssembleContextRequest{RunId: runID, Iteration: int32(i),
			AppendEvents: events})
		if err != nil {
			t.Fatalf("turn %d: %v", i, err)
		}
		where := fmt.Sprintf("turn %d", i)

		// The appended events: in request order, each at the next seq, counted as recounted.
		if len(resp.GetAppended()) != len(events) {
			t.Fatalf("%s: %d appended for %d events", where, len(resp.GetAppended()), len(events))
		}
		for k, a := range resp.GetAppended() {
			first := resp.GetAppended()[0].GetSeq()
			if a.GetEventId() != events[k].GetEventId() || first < nextSeq || a.GetSeq() != first+int32(k) ||
				a.GetAlreadyRecorded() {
				t.Fatalf("%s: appended[%d] = %v, want %s at seq %d + %d", where, k, a, events[k].GetEventId(), nextSeq, k)
			}
			appended[a.GetEventId()] = a
			if events[k].GetToolName() != "" {
				toolOf[events[k].GetCallId()] = events[k].GetToolName()
			}
		}
		nextSeq = resp.GetAppended()[len(events)-1].GetSeq() + 1
		sent = append(sent, events...)

		checkWindow(t, c, where, resp, budget)
		// The window is the recent tail of the log, ending with this turn's last event.
		entries := resp.GetEntries()
		tail := sent[len(sent)-len(entries):]
		for k, e := range entries {
			want := tail[k]
			if e.GetEventId() != want.GetEventId() || e.GetSeq() != appended[want.GetEventId()].GetSeq() {
				t.Fatalf("%s: entry %d is %s (seq %d), want %s: not the log's tail", where, k, e.GetEventId(), e.GetSeq(),
					want.GetEventId())
			}
			if e.GetCallId() != want.GetCallId() || e.GetToolName() != want.GetToolName() || e.GetRole() != want.GetRole() {
				t.Errorf("%s: %s fed as %v, sent as %v", where, e.GetEventId(), e, want)
			}
			switch {
			case e.GetClippedFromTokens() != 0:
				// An old tool result cleared to save context: the placeholder names the tool, the
				// call and what the result weighed when it was appended.
				placeholder := fmt.Sprintf("[tool result cleared to save context: tool %s, call_id %q, %d tokens; "+
					"call the tool again if it is needed]", toolOf[e.GetCallId()], e.GetCallId(), e.GetClippedFromTokens())
				if e.GetType() != "tool_result" || e.GetText() != placeholder ||
					e.GetClippedFromTokens() != appended[e.GetEventId()].GetTokens() {
					t.Errorf("%s: %s fed %q (clipped from %d), appended as %d tokens", where, e.GetEventId(), e.GetText(),
						e.GetClippedFromTokens(), appended[e.GetEventId()].GetTokens())
				}
				cleared++
			case e.GetRole() == "tool":
				// A tool's output is fed inside the untrusted-data block.
				if !strings.Contains(e.GetText(), want.GetContent()) {
					t.Errorf("%s: %s fed %q, sent %q", where, e.GetEventId(), e.GetText(), want.GetContent())
				}
			case e.GetText() != want.GetContent():
				t.Errorf("%s: %s fed %q, sent %q", where, e.GetEventId(), e.GetText(), want.GetContent())
			}
		}
		if len(entries) < len(events) {
			t.Fatalf("%s: the window leaves out this turn's events", where)
		}
		if resp.GetOmittedEvents() != int32(len(sent)-len(entries)) {
			t.Errorf("%s: omitted_events %d, but %d sent events are not in the window", where, resp.GetOmittedEvents(),
				len(sent)-len(entries))
		}
		// A tool call and its results enter and leave together.
		for _, e := range entries {
			for _, s := range sent[:len(sent)-len(entries)] {
				if e.GetCallId() != "" && s.GetCallId() == e.GetCallId() {
					t.Errorf("%s: %s is fed, %s of the same call is not", where, e.GetEventId(), s.GetEventId())
				}
			}
		}
		// This turn's events are fed whole, as counted when they were appended.
		for k, a := range resp.GetAppended() {
			e := entries[len(entries)-len(events)+k]
			if e.GetClippedFromTokens() != 0 || a.GetTokens() != e.GetTokens() {
				t.Errorf("%s: %s appended as %d tokens, fed as %d (clipped from %d)", where, a.GetEventId(), a.GetTokens(),
					e.GetTokens(), e.GetClippedFromTokens())
			}
		}
		if resp.GetOmittedEvents() > 0 {
			slid++
		}
	}
	// Else the budget never bound, and the test would prove little. Cleared results are checked
	// whenever one is fed; this run may feed none: old results are cleared only outside the recent
	// turns, and here the window's start moves past them first (the Python tests clear on purpose).
	if slid == 0 {
		t.Fatalf("in %d turns under a %d-token budget the window slid on %d, %d results were fed cleared",
			turns, budget, slid, cleared)
	}
	t.Logf("%d events sent; the window slid on %d turns; cleared results fed %d times", len(sent), slid, cleared)
}

// checkWindow recounts an AssembleContext answer: each entry's tokens are its text's count in
// the run's counter, token_count their sum, within the budget.
func checkWindow(t *testing.T, c *sidecar.Client, where string, resp *pb.AssembleContextResponse, budget int32) {
	t.Helper()
	if resp.GetTokenCounter() != counter || resp.GetTokenBudget() != budget {
		t.Fatalf("%s: counter %q, budget %d; want %q, %d", where, resp.GetTokenCounter(), resp.GetTokenBudget(),
			counter, budget)
	}
	entries := resp.GetEntries()
	texts := make([]string, len(entries))
	for k, e := range entries {
		texts[k] = e.GetText()
	}
	var sum int32
	for k, count := range recount(t, c, counter, texts) {
		if e := entries[k]; e.GetTokens() != count {
			t.Errorf("%s: %s says %d tokens, its text counts %d", where, e.GetEventId(), e.GetTokens(), count)
		}
		sum += count
	}
	if resp.GetTokenCount() != sum {
		t.Errorf("%s: token_count %d, the entries recount to %d", where, resp.GetTokenCount(), sum)
	}
	if sum > budget {
		t.Errorf("%s: %d tokens fed, over the %d budget", where, sum, budget)
	}
	if !slices.Equal(resp.GetEventIds(), ids(entries)) {
		t.Errorf("%s: event_ids %v do not match the entries %v", where, resp.GetEventIds(), ids(entries))
	}
}

func ids(entries []*pb.WindowEntry) []string {
	out := make([]string, len(entries))
	for k, e := range entries {
		out[k] = e.GetEventId()
	}
	return out
}
