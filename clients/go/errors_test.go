package sidecar_test

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	sidecar "github.com/context-sidecar/context-sidecar/clients/go"
	pb "github.com/context-sidecar/context-sidecar/clients/go/contextsidecarv1"
)

// Bad input comes back decoded: the code, the ErrorInfo's reason, the BadRequest's fields.
func TestBadInputDecoded(t *testing.T) {
	c := dial(t, "alpha")
	ctx := context.Background()
	const runID = "go-bad-input"
	_, err := c.AssembleContext(ctx, &pb.AssembleContextRequest{RunId: runID, Iteration: 2, AppendEvents: []*pb.Event{
		{EventId: "ok", Role: "user", Content: "fine"},
		{EventId: "", Role: "user", Content: "no id"},
		{EventId: "late", Iteration: 3, Role: "user", Content: "after the turn being assembled"},
	}})
	e := mustError(t, err)
	if e.Code != codes.InvalidArgument || e.Reason != "validation_error" || e.Domain != "context-sidecar" {
		t.Fatalf("decoded %+v, want INVALID_ARGUMENT / validation_error from context-sidecar", e)
	}
	if !e.HasField("append_events[1].event_id") {
		t.Errorf("fields %+v do not name append_events[1].event_id", e.Fields)
	}
	for _, f := range e.Fields {
		if f.Description == "" {
			t.Errorf("field %s has no description", f.Field)
		}
	}
	if status.Code(err) != codes.InvalidArgument {
		t.Errorf("status.Code of the decoded error: %v", status.Code(err))
	}
	t.Logf("%v; fields %+v", e, e.Fields)

	// An iteration past the turn being assembled, alone.
	_, err = c.AssembleContext(ctx, &pb.AssembleContextRequest{RunId: runID, Iteration: 2, AppendEvents: []*pb.Event{
		{EventId: "late", Iteration: 3, Role: "user", Content: "after the turn being assembled"}}})
	if e := mustError(t, err); e.Code != codes.InvalidArgument || e.Reason != "validation_error" ||
		!e.HasField("append_events[0].iteration") {
		t.Errorf("decoded %+v (fields %+v), want validation_error naming append_events[0].iteration", e, e.Fields)
	}

	// The same rule through AppendEvents names its own field.
	_, err = c.AppendEvents(ctx, &pb.AppendEventsRequest{RunId: runID, Events: []*pb.Event{{Role: "user"}}})
	if e := mustError(t, err); e.Code != codes.InvalidArgument || e.Reason != "validation_error" ||
		!e.HasField("events[0].event_id") {
		t.Errorf("decoded %+v (fields %+v), want validation_error naming events[0].event_id", e, e.Fields)
	}

	// Nothing was written: the run does not exist.
	_, err = c.ListRunEvents(ctx, &pb.ListRunEventsRequest{RunId: runID})
	if e := mustError(t, err); e.Code != codes.NotFound {
		t.Errorf("ListRunEvents after refused appends: %+v", e)
	}
}

// The token names the tenant: without it the call is refused, and another tenant's run
// answers as if it did not exist.
func TestTokenTenancy(t *testing.T) {
	ctx := context.Background()
	const runID = "go-tenancy"
	alpha, beta, none := dial(t, "alpha"), dial(t, "beta"), dial(t, "")
	if _, err := alpha.AppendEvents(ctx, &pb.AppendEventsRequest{RunId: runID, Events: []*pb.Event{
		{EventId: "u1", Iteration: 1, Role: "user", Content: "alpha's"}}}); err != nil {
		t.Fatal(err)
	}
	listed, err := alpha.ListRunEvents(ctx, &pb.ListRunEventsRequest{RunId: runID})
	if err != nil || len(listed.GetEvents()) != 1 {
		t.Fatalf("alpha lists its run: %v, %v", listed, err)
	}
	_, err = beta.ListRunEvents(ctx, &pb.ListRunEventsRequest{RunId: runID})
	if e := mustError(t, err); e.Code != codes.NotFound {
		t.Errorf("beta reads alpha's run: %+v", e)
	}
	_, err = none.ListRunEvents(ctx, &pb.ListRunEventsRequest{RunId: runID})
	if e := mustError(t, err); e.Code != codes.Unauthenticated || e.Reason != "unauthenticated" {
		t.Errorf("no token: %+v", e)
	}

	// A stream's errors are decoded too.
	stream, err := none.WatchEvents(ctx, &pb.WatchEventsRequest{})
	if err == nil {
		_, err = stream.Recv()
	}
	if e := mustError(t, err); e.Code != codes.Unauthenticated || e.Reason != "unauthenticated" {
		t.Errorf("WatchEvents without a token: %+v", e)
	}
}

// A call whose context has no deadline gets the client's; one with its own keeps it.
func TestDefaultDeadline(t *testing.T) {
	c, err := sidecar.Dial(target, sidecar.WithToken(tokens["alpha"]), sidecar.WithTimeout(time.Nanosecond))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	req := &pb.CountTokensRequest{TokenCounter: counter, Texts: []string{"hello"}}
	_, err = c.CountTokens(context.Background(), req)
	if e := mustError(t, err); e.Code != codes.DeadlineExceeded {
		t.Errorf("with a 1 ns default deadline: %+v", e)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := c.CountTokens(ctx, req); err != nil {
		t.Errorf("with the caller's own deadline: %v", err)
	}
}
