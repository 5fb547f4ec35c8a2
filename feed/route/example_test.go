package route_test

import (
	"context"
	"log"
	"net/http"
	"os/signal"
	"syscall"

	"github.com/nats-io/nats.go"

	"github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/feed"
	"github.com/fleetwatch/fleetwatch/feed/route"
)

// A Go program that embeds the router: one pool of two vLLM servers,
// following fleetwatch's decisions and reporting its outcomes over NATS.
// (No output: it needs a NATS server and backends.)
func Example() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	nc, err := nats.Connect(nats.DefaultURL)
	if err != nil {
		log.Fatal(err)
	}
	defer nc.Drain()

	// Outcome events, batched onto fw.outcomes.edge-1.
	events, err := route.NewOutcomePublisher(route.PublisherSettings{
		Subject: fleetwatch.Subjects{}.Outcomes() + ".edge-1",
		Publish: nc.Publish,
	})
	if err != nil {
		log.Fatal(err)
	}
	go events.Run(ctx) // flushes and exits when ctx is done

	rt, err := route.New(route.Settings{
		Pools: []route.Pool{{
			ID:     "llama-3.1-70b",
			Models: []string{"meta-llama/Llama-3.1-70B-Instruct"},
			Backends: []route.Backend{
				{ID: "vllm-a", URL: "http://10.0.0.1:8000/v1"},
				{ID: "vllm-b", URL: "http://10.0.0.2:8000/v1"},
			},
		}},
		Source:    "edge-1",
		Publisher: events,
	})
	if err != nil {
		log.Fatal(err)
	}
	defer rt.Close()

	// Decisions: the KV bucket at start, then every newer snapshot.
	w, err := feed.NewWatcher(nc, feed.WatcherSettings{Pools: rt.Pools(), OnUpdate: rt.Apply})
	if err != nil {
		log.Fatal(err)
	}
	go w.Run(ctx) // exits when ctx is done

	srv := &http.Server{Addr: "127.0.0.1:8090", Handler: rt}
	go func() { <-ctx.Done(); srv.Shutdown(context.Background()) }()
	if err := srv.ListenAndServe(); err != http.ErrServerClosed {
		log.Fatal(err)
	}
}
