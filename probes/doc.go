// Package probes detects silent artefact drift of LLM backends: another
// quantization, build or model served behind the same name.
//
// Every cycle (cron-scheduled, jittered per backend) the Prober sends a fixed,
// versioned suite of byte-identical greedy requests (temperature 0, top_p 1,
// seed 1, top_logprobs 5) to each backend and hands the answers to the
// detector of package probes/drift, which compares them with that backend's
// own enrolment baseline, following docs/DRIFT.md. This package is the I/O
// shell around it: the OpenAI-compatible probe client, the cron schedule,
// the probe budget, the metrics and the review digest.
//
// The package does no NATS I/O: baselines and drift states go through
// stores and results through a Sink, all provided by the caller.
package probes
