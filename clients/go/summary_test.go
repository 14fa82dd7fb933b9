package sidecar_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	pb "github.com/context-sidecar/context-sidecar/clients/go/contextsidecarv1"
)

// A host that summarises whenever the sidecar says compaction is due: RecordSummary with the
// candidates it proposed, fed in their place in the very next window.
//
// When it is due, by the documented rules (docs/transcript.md, "Summaries and replays"), with the
// sidecar's defaults (compaction_fraction 0.75, trim_to_fraction 0.6): once the transcript, or
// after a summary what came after it, passes 450 tokens, and only if a summary of the candidates
// would be fed in the next window. Here it always would: turns of 40-100 words (~50-130 tokens)
// and keep_last_turns 1 make the recent turns at most 360 tokens (the last turn and the older
// whole turns that fit in 0.6 of the budget), so the candidates (everything older) are never
// empty past 450, and the next window, with the summary weighing what trim_to_fraction leaves
// (240) beside the recent turns and an empty next turn, fits the budget of 600. So compaction
// is due exactly when that count passes 450, and each summary is fed at the next turn.
func TestRecordSummaryWhenDue(t *testing.T) {
	c := dial(t, "alpha")
	ctx := context.Background()
	const runID, budget, turns, trigger = "go-summaries", 600, 20, 450
	if _, err := c.OpenRun(ctx, &pb.OpenRunRequest{RunId: runID, TokenCounter: proto.String(counter),
		TranscriptTokenBudget: proto.Int32(budget), SummarizationSupported: proto.Bool(true),
		KeepLastTurns: proto.Int32(1)}); err != nil {
		t.Fatal(err)
	}
	type summary struct {
		ref, text string
		from      int // the first iteration it stands in for
	}
	var (
		g         = newTextGen(3)
		sent      []string // host event ids, in order
		content   = map[string]string{}
		summaries []summary // recorded, oldest first
		floor     int       // sent[:floor] are summarised
		since     int32     // the tokens appended after the newest summary (all, before one)
		previous  []string  // the summaries the previous window fed
	)
	for i := 1; i <= turns; i++ {
		events := []*pb.Event{
			{EventId: fmt.Sprintf("s%d-user", i), Role: "user", Content: g.text(g.between(20, 50))},
			{EventId: fmt.Sprintf("s%d-answer", i), Role: "assistant", Content: g.text(g.between(20, 50))},
		}
		for _, e := range events {
			sent = append(sent, e.GetEventId())
			content[e.GetEventId()] = e.GetContent()
		}
		resp, err := c.AssembleContext(ctx, &pb.AssembleContextRequest{RunId: runID, Iteration: int32(i),
			AppendEvents: events})
		if err != nil {
			t.Fatalf("turn %d: %v", i, err)
		}
		where := fmt.Sprintf("turn %d", i)
		checkWindow(t, c, where, resp, budget)
		for _, a := range resp.GetAppended() {
			since += a.GetTokens()
		}

		// The window: the newest summaries in force, in order, then the unsummarised tail.
		entries := resp.GetEntries()
		k := slices.IndexFunc(entries, func(e *pb.WindowEntry) bool { return e.GetType() != "context.summary" })
		if k < 0 || k > len(summaries) {
			t.Fatalf("%s: %d summary entries, %d summaries recorded", where, k, len(summaries))
		}
		for j, e := range entries[:k] {
			s := summaries[len(summaries)-k+j]
			if e.GetEventId() != s.ref || e.GetText() != s.text || e.GetRole() != "system" {
				t.Errorf("%s: summary entry %d is %v, want %s %q", where, j, e, s.ref, s.text)
			}
		}
		verbatim := ids(entries[k:])
		if k > 0 && !slices.Equal(verbatim, sent[floor:]) {
			t.Errorf("%s: after the summaries %v, want the unsummarised events %v", where, verbatim, sent[floor:])
		}
		// A summary recorded for this turn is fed in it, and the cache report says where it entered;
		// a summary fed before that the window's start moved past is reported as slid out.
		fed := ids(entries[:k])
		entered := slices.IndexFunc(fed, func(ref string) bool { return !slices.Contains(previous, ref) })
		slidOut := slices.ContainsFunc(previous, func(ref string) bool { return !slices.Contains(fed, ref) })
		cache := resp.GetCache()
		switch {
		case len(summaries) > 0 && summaries[len(summaries)-1].from == i:
			if k == 0 || fed[k-1] != summaries[len(summaries)-1].ref {
				t.Errorf("%s: the summary recorded for this turn is not fed: %v", where, ids(entries))
			} else if cache.GetBreakReason() != "summary_recorded" || cache.GetBreakAt() != int32(1+entered) {
				t.Errorf("%s: cache report %v; want summary_recorded at part %d", where, cache, 1+entered)
			}
		case entered >= 0:
			t.Errorf("%s: summary %s entered the window though none was recorded for this turn", where, fed[entered])
		case slidOut && cache.GetBreakReason() != "summary_slid_out":
			t.Errorf("%s: the window left out summaries %v fed before; cache report %v, want summary_slid_out", where,
				previous, cache)
		}
		previous = fed
		for _, id := range verbatim {
			if slices.Index(sent, id) < floor {
				t.Errorf("%s: %s is fed though a summary replaced it", where, id)
			}
		}

		due := resp.GetCompaction()
		if due.GetDue() != (since > trigger) {
			t.Errorf("%s: compaction.due is %v with %d tokens since the last summary (the trigger: %d)", where,
				due.GetDue(), since, trigger)
		}
		if !due.GetDue() {
			continue
		}
		// The candidates: the oldest unsummarised events, in order, never this turn's.
		candidates := due.GetCandidateEventIds()
		if len(candidates) == 0 || !slices.Equal(candidates, sent[floor:floor+len(candidates)]) ||
			floor+len(candidates) > len(sent)-len(events) {
			t.Fatalf("%s: candidates %v; the unsummarised events before this turn are %v", where, candidates,
				sent[floor:len(sent)-len(events)])
		}
		texts := make([]string, len(candidates))
		for j, id := range candidates {
			texts[j] = content[id]
		}
		var before int32
		for _, n := range recount(t, c, counter, texts) {
			before += n
		}
		if due.GetTokensBefore() != before {
			t.Errorf("%s: compaction.tokens_before %d, the candidates recount to %d", where, due.GetTokensBefore(), before)
		}

		text := fmt.Sprintf("Summary %d of %d events: %s", len(summaries)+1, len(candidates),
			strings.Join(strings.Fields(texts[0])[:5], " "))
		rec, err := c.RecordSummary(ctx, &pb.RecordSummaryRequest{RunId: runID, Iteration: int32(i + 1),
			ReplacedEventIds: candidates, SummaryText: text})
		if err != nil {
			t.Fatalf("%s: RecordSummary: %v", where, err)
		}
		after := recount(t, c, counter, []string{text})[0]
		if !rec.GetCreated() || rec.GetSummaryRef() == "" || rec.GetTokensBefore() != before ||
			rec.GetTokensAfter() != after || rec.GetEvent().GetType() != "context.summarized" {
			t.Errorf("%s: RecordSummary answered %v; want %d tokens before, %d after", where, rec, before, after)
		}
		artifact, err := c.GetArtifact(ctx, &pb.GetArtifactRequest{RunId: runID, ArtifactId: rec.GetSummaryRef()})
		if err != nil || artifact.GetContent() != text || artifact.GetTokens() != after {
			t.Errorf("%s: GetArtifact: %v, %v", where, artifact, err)
		}
		summaries = append(summaries, summary{rec.GetSummaryRef(), text, i + 1})
		floor += len(candidates)
		since = 0
	}
	if len(summaries) < 2 {
		t.Fatalf("compaction came due %d times in %d turns under a %d budget", len(summaries), turns, budget)
	}
	t.Logf("%d summaries recorded over %d turns", len(summaries), turns)
}
