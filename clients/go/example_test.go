package sidecar_test

import (
	"context"
	"fmt"
	"log"
	"os"

	"google.golang.org/protobuf/proto"

	sidecar "github.com/context-sidecar/context-sidecar/clients/go"
	pb "github.com/context-sidecar/context-sidecar/clients/go/contextsidecarv1"
)

// One turn of a host, and a refused call decoded. The sidecar is at $SIDECAR_ADDRESS
// (127.0.0.1:50051 when unset); $SIDECAR_TOKEN is the tenant's token, if it has tenants.
// go test runs it against the tests' own sidecar and compares what it prints with Output.
func Example() {
	address := os.Getenv("SIDECAR_ADDRESS")
	if address == "" {
		address = "127.0.0.1:50051"
	}
	c, err := sidecar.Dial(address, sidecar.WithToken(os.Getenv("SIDECAR_TOKEN")))
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	if _, err := c.OpenRun(ctx, &pb.OpenRunRequest{RunId: "run-1", TokenCounter: proto.String("o200k_base"),
		TranscriptTokenBudget: proto.Int32(8000)}); err != nil {
		log.Fatal(err)
	}
	turn, err := c.AssembleContext(ctx, &pb.AssembleContextRequest{RunId: "run-1", Iteration: 1,
		AppendEvents: []*pb.Event{
			{EventId: "u1", Role: "user", Content: "What does the refund policy say?"},
			{EventId: "c1", Role: "assistant", Type: "tool_call", CallId: "k1", ToolName: "search",
				Content: `{"q": "refund"}`},
			{EventId: "r1", Role: "tool", Type: "tool_result", CallId: "k1", Content: "30 days."},
		}})
	if err != nil {
		log.Fatal(err)
	}
	for _, e := range turn.GetEntries() {
		fmt.Println(e.GetEventId(), e.GetTokens(), "tokens")
	}

	_, err = c.AppendEvents(ctx, &pb.AppendEventsRequest{RunId: "run-1", Events: []*pb.Event{{Role: "user"}}})
	if e, ok := sidecar.AsError(err); ok {
		fmt.Println(e.Code, e.Reason)
		for _, f := range e.Fields {
			fmt.Println(f.Field, f.Description)
		}
	}
	// Output:
	// u1 7 tokens
	// c1 6 tokens
	// r1 33 tokens
	// InvalidArgument validation_error
	// events[0].event_id is required
}
