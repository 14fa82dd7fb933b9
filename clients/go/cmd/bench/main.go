// Command bench is the Go client's run of the common bench protocol: it fills run "bench-go"
// with 200 events, assembles the last iteration once, then for --rounds rounds times a
// grpc.health.v1.Health/Check and a re-assembly of that iteration, and prints one JSON line:
// {"client": "go", "health_p50_us": x, "assemble_p50_us": y, "rounds": N}.
//
//	go run ./cmd/bench --target 127.0.0.1:50051 --rounds 300
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"time"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/proto"

	sidecar "github.com/context-sidecar/context-sidecar/clients/go"
	pb "github.com/context-sidecar/context-sidecar/clients/go/contextsidecarv1"
)

const (
	runID     = "bench-go"
	events    = 200
	budget    = 8000
	wordsEach = 60
)

var vocabulary = strings.Fields(`agent tool call result refund policy order kettle warehouse shipping invoice
	customer support ticket escalation window budget token context summary memory search query answer
	question retry timeout deadline latency cache prefix provider model prompt request response status`)

func main() {
	target := flag.String("target", "127.0.0.1:50051", "the sidecar's address, host:port")
	rounds := flag.Int("rounds", 300, "timed rounds: one health check and one assembly each")
	token := flag.String("token", "", "bearer token, when the sidecar has tenants configured")
	flag.Parse()
	if *rounds < 1 {
		log.Fatal("bench: --rounds must be at least 1")
	}
	var opts []sidecar.Option
	if *token != "" {
		opts = append(opts, sidecar.WithToken(*token))
	}
	c, err := sidecar.Dial(*target, opts...)
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	health, assemble, err := bench(context.Background(), c, *rounds)
	if err != nil {
		log.Fatal(err)
	}
	out, _ := json.Marshal(result{"go", health, assemble, *rounds})
	fmt.Fprintln(os.Stdout, string(out))
}

type result struct {
	Client      string  `json:"client"`
	HealthP50   float64 `json:"health_p50_us"`
	AssembleP50 float64 `json:"assemble_p50_us"`
	Rounds      int     `json:"rounds"`
}

// bench returns the median Health/Check and AssembleContext times, in microseconds.
func bench(ctx context.Context, c *sidecar.Client, rounds int) (health, assemble float64, err error) {
	if _, err := c.OpenRun(ctx, &pb.OpenRunRequest{RunId: runID, TokenCounter: proto.String("o200k_base"),
		TranscriptTokenBudget: proto.Int32(budget)}); err != nil {
		return 0, 0, err
	}
	// Fixed text: a second run against the same sidecar re-sends identical events, a no-op.
	r := rand.New(rand.NewPCG(7, 7))
	batch := make([]*pb.Event, events)
	for i := range batch {
		words := make([]string, wordsEach)
		for k := range words {
			words[k] = vocabulary[r.IntN(len(vocabulary))]
		}
		batch[i] = &pb.Event{EventId: fmt.Sprintf("e%d", i), Iteration: int32(i/4 + 1),
			Role: []string{"user", "assistant"}[i%2], Content: strings.Join(words, " ")}
	}
	if _, err := c.AppendEvents(ctx, &pb.AppendEventsRequest{RunId: runID, Events: batch}); err != nil {
		return 0, 0, err
	}
	last := batch[events-1].GetIteration()
	request := &pb.AssembleContextRequest{RunId: runID, Iteration: last}
	if _, err := c.AssembleContext(ctx, request); err != nil { // persists the window
		return 0, 0, err
	}
	request.MaxTranscriptTokens = proto.Int32(budget)
	var healthTimes, assembleTimes []time.Duration
	for range rounds {
		start := time.Now()
		if _, err := c.Health.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
			return 0, 0, err
		}
		healthTimes = append(healthTimes, time.Since(start))
		start = time.Now()
		if _, err := c.AssembleContext(ctx, request); err != nil {
			return 0, 0, err
		}
		assembleTimes = append(assembleTimes, time.Since(start))
	}
	return p50(healthTimes), p50(assembleTimes), nil
}

// p50 is the median, in microseconds to 0.1.
func p50(times []time.Duration) float64 {
	slices.Sort(times)
	n := len(times)
	median := times[n/2]
	if n%2 == 0 {
		median = (times[n/2-1] + times[n/2]) / 2
	}
	return math.Round(float64(median.Nanoseconds())/100) / 10
}
