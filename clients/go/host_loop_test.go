package sidecar_test

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	sidecar "github.com/context-sidecar/context-sidecar/clients/go"
	pb "github.com/context-sidecar/context-sidecar/clients/go/contextsidecarv1"
)

const counter = "o200k_base"

// hostTurn is turn i as an agent host sends it: the user's message, the model's tool calls
// (two in parallel on every third turn), their results (300 words in all), and the model's answer.
func hostTurn(g textGen, i int) []*pb.Event {
	id := func(kind string) string { return fmt.Sprintf("t%d-%s", i, kind) }
	events := []*pb.Event{{EventId: id("user"), Role: "user", Content: g.text(20)}}
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
			CallId: id(fmt.Sprintf("k%d", k)), Content: g.text(300 / calls)})
	}
	return append(events, &pb.Event{EventId: id("answer"), Role: "assistant", Content: g.text(20)})
}

// The host loop's window settings, on a sidecar of its own, chosen so that the documented rules
// (docs/transcript.md: "The window: cheap by default", "The recent turns") demand a clearing:
//
//   - budget 2,000; trim_to_fraction 0.6, so the recent turns are the last keep_last_turns (2)
//     and the older whole turns that fit with them in 1,200 tokens; a clearing is considered once
//     the transcript fed from the window's start passes 0.8 of the budget (1,600), frees at least
//     clear_at_least_tokens (500) and keeps the newest keep_recent (1) results.
//   - A turn weighs about 450 tokens (two 20-word messages, ~20 of arguments a call, and 300
//     words of results, ~370-400 tokens fenced), so turns 1-3 weigh about 1,380: nothing is
//     cleared. Turn 4 brings the transcript to about 1,810, past the trigger. Its recent turns are
//     turns 3 and 4 (~910 tokens; turn 2 would make ~1,340, over 1,200), whose results include
//     the newest one. The results older than them are turns 1 and 2's, each freeing 340-370
//     tokens as a ~32-token placeholder: one is less than 500, both are more. So turn 4 clears
//     exactly t1-result0 and t2-result0, oldest first, and never turn 3's.
//   - Placeholders and messages pile up, so later the start moves too (the budget binds).
const (
	hostLoopBudget        = 2000
	hostLoopKeepLastTurns = 2
	hostLoopTrigger       = 1600 // 0.8 of the budget
	hostLoopClearAtLeast  = 500
	firstClearingTurn     = 4
)

var hostLoopFlags = []string{"--trim-to-fraction", "0.6", "--clearing-enabled", "--clearing-trigger-fraction", "0.8",
	"--clearing-keep-recent", "1", "--clearing-clear-at-least-tokens", fmt.Sprint(hostLoopClearAtLeast)}

var firstCleared = []string{"t1-result0", "t2-result0"}

// ownSidecar starts a sidecar with flags for one test (no tenants) and connects to it.
func ownSidecar(t *testing.T, flags ...string) *sidecar.Client {
	t.Helper()
	stop, addr, err := startSidecar(filepath.Join(t.TempDir(), "data"), flags...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	c, err := sidecar.Dial(addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// A 30-turn host loop: each turn's events go in with AssembleContext, and each answer is
// checked against the host's own record of what it sent, every count recounted; old tool
// results are cleared where the rules say (above), and the cache report names each clearing.
func TestHostLoop(t *testing.T) {
	c := ownSidecar(t, hostLoopFlags...)
	ctx := context.Background()
	const runID, budget, turns = "go-host-loop", hostLoopBudget, 30
	opened, err := c.OpenRun(ctx, &pb.OpenRunRequest{RunId: runID, TokenCounter: proto.String(counter),
		TranscriptTokenBudget: proto.Int32(budget), KeepLastTurns: proto.Int32(hostLoopKeepLastTurns)})
	if err != nil {
		t.Fatal(err)
	}
	if !opened.GetCreated() || opened.GetSettings().GetTranscriptTokenBudget() != budget {
		t.Fatalf("OpenRun: %v", opened)
	}

	g := newTextGen(1)
	var sent []*pb.Event // the host's events, in order
	appended := map[string]*pb.AppendResult{}
	toolOf := map[string]string{}        // call_id -> tool name
	clearedAt := map[string]int{}        // event id -> the turn it was first fed cleared
	clearingTurns := map[int]bool{}      // turns that cleared results
	placeholderOf := map[string]string{} // event id -> the placeholder it is fed as
	var previous *pb.AssembleContextResponse
	nextSeq := int32(0) // the sidecar's own log entries (context.cleared) take seqs too
	transcript := int32(0)
	slid := 0
	for i := 1; i <= turns; i++ {
		events := hostTurn(g, i)
		resp, err := c.AssembleContext(ctx, &pb.AssembleContextRequest{RunId: runID, Iteration: int32(i),
			AppendEvents: events})
		if err != nil {
			t.Fatalf("turn %d: %v", i, err)
		}
		where := fmt.Sprintf("turn %d", i)

		// The appended events: in request order, each at the next seq, counted as recounted. A
		// turn that cleared wrote its context.cleared entry after its events: one seq more.
		if len(resp.GetAppended()) != len(events) {
			t.Fatalf("%s: %d appended for %d events", where, len(resp.GetAppended()), len(events))
		}
		if clearingTurns[i-1] {
			nextSeq++
		}
		for k, a := range resp.GetAppended() {
			if a.GetEventId() != events[k].GetEventId() || a.GetSeq() != nextSeq+int32(k) || a.GetAlreadyRecorded() {
				t.Fatalf("%s: appended[%d] = %v, want %s at seq %d", where, k, a, events[k].GetEventId(), nextSeq+int32(k))
			}
			appended[a.GetEventId()] = a
			if events[k].GetToolName() != "" {
				toolOf[events[k].GetCallId()] = events[k].GetToolName()
			}
			if i <= firstClearingTurn {
				transcript += a.GetTokens()
			}
		}
		nextSeq += int32(len(events))
		sent = append(sent, events...)
		// The workload is as designed: the transcript passes the trigger first at turn 4.
		if i <= firstClearingTurn && (transcript > hostLoopTrigger) != (i == firstClearingTurn) {
			t.Fatalf("%s: the transcript weighs %d tokens: not the workload designed above", where, transcript)
		}

		checkWindow(t, c, where, resp, budget)
		// The window is the recent tail of the log, ending with this turn's last event.
		entries := resp.GetEntries()
		tail := sent[len(sent)-len(entries):]
		var newlyCleared []string
		firstNew := -1
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
				if _, seen := clearedAt[e.GetEventId()]; !seen {
					clearedAt[e.GetEventId()] = i
					placeholderOf[e.GetEventId()] = e.GetText()
					newlyCleared = append(newlyCleared, e.GetEventId())
					if firstNew < 0 {
						firstNew = k
					}
					// Never a result of the recent turns: the last keep_last_turns at least.
					if e.GetIteration() > int32(i-hostLoopKeepLastTurns) {
						t.Errorf("%s: %s of turn %d is cleared, within the last %d turns", where, e.GetEventId(),
							e.GetIteration(), hostLoopKeepLastTurns)
					}
				}
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

		// The clearing the rules demand, at the turn they demand it.
		switch {
		case i < firstClearingTurn && len(newlyCleared) > 0:
			t.Errorf("%s: %v cleared before the transcript passed the trigger", where, newlyCleared)
		case i == firstClearingTurn && !slices.Equal(newlyCleared, firstCleared):
			t.Errorf("%s: cleared %v; the rules clear %v (older than the recent turns, oldest first, %d tokens at least)",
				where, newlyCleared, firstCleared, hostLoopClearAtLeast)
		}
		// The cache report names each clearing and breaks where it begins: at the oldest result
		// newly fed cleared (after the static prefix, part 0; the run has no task), everything
		// before it repeated. A turn that moved its start breaks there instead.
		cache := resp.GetCache()
		if len(newlyCleared) > 0 {
			clearingTurns[i] = true
			var before int32
			for _, e := range entries[:firstNew] {
				before += e.GetTokens()
			}
			if previous != nil && previous.GetEntries()[0].GetEventId() == entries[0].GetEventId() &&
				(cache.GetBreakReason() != "tool_results_cleared" || cache.GetBreakAt() != int32(1+firstNew) ||
					cache.GetStablePrefixTokens() != before) {
				t.Errorf("%s: cleared %v, the cache report says %v; want tool_results_cleared at part %d, %d tokens stable",
					where, newlyCleared, cache, 1+firstNew, before)
			}
		} else if cache.GetBreakReason() == "tool_results_cleared" {
			t.Errorf("%s: the cache report says %v, but no result is newly cleared", where, cache)
		}
		if resp.GetOmittedEvents() > 0 {
			slid++
		}
		previous = resp
	}
	// Else the budget never bound, and the test would prove little.
	if slid == 0 || len(clearingTurns) < 2 {
		t.Fatalf("in %d turns under a %d-token budget the window slid on %d, %d turns cleared results",
			turns, budget, slid, len(clearingTurns))
	}

	// Each clearing is the sidecar's own log entry, listed as a compaction record: the results
	// cleared, what they weighed when appended and what their placeholders weigh, recounted.
	records, err := c.ListCompactionRecords(ctx, &pb.ListCompactionRecordsRequest{RunId: runID})
	if err != nil {
		t.Fatal(err)
	}
	listed := 0
	for _, r := range records.GetRecords() {
		if r.GetKind() != "cleared" {
			t.Errorf("record %d: kind %q in a run without summaries or clips", r.GetIndex(), r.GetKind())
			continue
		}
		var before, after int32
		for _, id := range r.GetRemovedEventIds() {
			if clearedAt[id] != int(r.GetIteration()) {
				t.Errorf("record %d (turn %d) clears %s, first fed cleared at turn %d", r.GetIndex(), r.GetIteration(), id,
					clearedAt[id])
			}
			before += appended[id].GetTokens()
			after += recount(t, c, counter, []string{placeholderOf[id]})[0]
		}
		listed += len(r.GetRemovedEventIds())
		if r.GetTokensBefore() != before || r.GetTokensAfter() != after || !clearingTurns[int(r.GetIteration())] {
			t.Errorf("record %d: %v; want tokens %d before, %d after, at a clearing turn", r.GetIndex(), r, before, after)
		}
		log, err := c.ListRunEvents(ctx, &pb.ListRunEventsRequest{RunId: runID, FromSeq: r.GetSeq(), Limit: 1})
		if err != nil || len(log.GetEvents()) != 1 || log.GetEvents()[0].GetType() != "context.cleared" {
			t.Errorf("record %d: the log at seq %d is %v (%v), want its context.cleared entry", r.GetIndex(), r.GetSeq(),
				log, err)
		}
	}
	if listed != len(clearedAt) || len(records.GetRecords()) != len(clearingTurns) {
		t.Errorf("%d records list %d results; %d turns fed %d results newly cleared", len(records.GetRecords()), listed,
			len(clearingTurns), len(clearedAt))
	}
	t.Logf("%d events sent; the window slid on %d turns; %d turns cleared %d results", len(sent), slid,
		len(clearingTurns), len(clearedAt))
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
