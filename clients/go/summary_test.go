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
// candidates it proposed, from the next turn on fed in their place.
func TestRecordSummaryWhenDue(t *testing.T) {
	c := dial(t, "alpha")
	ctx := context.Background()
	const runID, budget, turns = "go-summaries", 600, 20
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
		fedAfter  = map[int]bool{}
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
		if k > 0 {
			fedAfter[len(summaries)] = true
		}
		for _, id := range verbatim {
			if slices.Index(sent, id) < floor {
				t.Errorf("%s: %s is fed though a summary replaced it", where, id)
			}
		}

		due := resp.GetCompaction()
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
	}
	if len(summaries) < 2 {
		t.Fatalf("compaction came due %d times in %d turns under a %d budget", len(summaries), turns, budget)
	}
	for n, s := range summaries {
		if s.from <= turns && !fedAfter[n+1] {
			t.Errorf("summary %d (from turn %d) was never fed", n+1, s.from)
		}
	}
	t.Logf("%d summaries recorded over %d turns", len(summaries), turns)
}
