package fleetwatch_test

import (
	"encoding/json"
	"errors"
	"fmt"

	"github.com/fleetwatch/fleetwatch"
)

// A router that reads the decisions bucket or subjects itself, without
// feed.Watcher, checks each snapshot before it acts on it.
func ExampleSnapshot_Validate() {
	data := []byte(`{"v":1,"pool":"llama-3.1-70b","epoch":"01JB4X","seq":1234,"at":"2026-12-02T07:50:01.000Z",
		"ttl_ms":5000,"mode":"balance","all_open":"shed","median_ewma_ttft_ms":null,"affinity_tolerance":2.5,
		"backends":[{"backend":"vllm-a","state":"closed","weight":1,"drift":"ok"},
		            {"backend":"vllm-b","state":"half_open","weight":1.5,"drift":"ok"}]}`)
	var snap fleetwatch.Snapshot
	if err := json.Unmarshal(data, &snap); err != nil {
		fmt.Println("not a snapshot:", err)
		return
	}
	err := snap.Validate()
	fmt.Println(err)
	fmt.Println(errors.Is(err, fleetwatch.ErrInvalidSnapshot), errors.Is(err, fleetwatch.ErrOutOfRange))
	// Output:
	// fleetwatch: invalid snapshot: backends[1].weight = 1.5: out of range [0, 1]
	// true true
}
