// Package drift holds the statistics and the detector of docs/DRIFT.md:
// the probe suites, the observations of a cycle, the enrolment baselines
// and their null models, the CUSUM, the peer comparisons, the teacher-forced,
// tool-call and identity tiers, and the drift state a backend's judgement
// survives a restart with. It does no network or store I/O (LoadSuite alone
// reads a suite file by path) and depends on the standard library
// only (deps_test.go enforces it); package probes does the I/O around it.
//
//   - S1, greedy mismatch: the share of stable prompts whose token sequence
//     differs from the baseline's modal sequence (evidence only);
//   - S2, the primary statistic: the mean |lp_now - lp_base| of the
//     baseline's top-1 token over positions up to the first divergence
//     (logprob tracking, Chauvin et al., ICLR 2026);
//   - S3, the first-token statistic over the union of both top-k sets.
//
// Each statistic is standardised against a leave-one-out null from the
// enrolment cycles (sigma = 1.4826 x MAD, floored). A gross change (12 sigma
// and 0.1 nats) fires at once; subtle changes accumulate in a one-sided Page
// CUSUM (Page, 1954) with an absolute floor on the mean excess. A backend is
// `suspect` first and `drifted` when the next cycle confirms or the change
// is gross. Peers of a pool are compared baseline against baseline to name
// an outlier. Backends without logprobs fall back to greedy exact match and
// the MMD two-sample test with a Hamming kernel and permutation p-values of
// Model Equality Testing (Gao, Liang, Guestrin, ICLR 2025), with
// Benjamini-Hochberg (1995) control of the false discovery rate across
// backends.
package drift
